"""Releases per second with many keys: per-key release, sharded release, non-private filled count.

K declared keys and ``--steps`` hourly steps, two events per key and step,
on one runner in one invocation, the cases interleaved and the median of
``--repeats`` runs kept:

* ``per-key``: ``ContinualCount`` with ``shards=0``, one stateful key (and
  one timer) per stream;
* ``sharded``: ``ContinualCount`` with the default ``shards=None`` (K // 64
  shards); bounded input is released without state or timers, one grouping
  per shard that also combines the events per (key, step); the records are
  those of the per-key path (tests/transforms/test_shards.py);
* ``sharded-blt``: the same with Gaussian noise (δ = 1e-6), whose default
  mechanism is BLT;
* ``sum``: ``ContinualSum`` (values in [0, 4]), sharded;
* ``user-count``: ``ContinualCount`` at the user level (``privacy_unit="user"``, the
  mean's two users per key, ``max_contributions`` = the steps), sharded;
* ``mean``: ``ContinualMean`` (tuned preset), sharded, each event's user
  being its key and slot (2 users per key, ``max_users`` = 2 per key);
* ``erm-d10``, ``erm-d100``: ``ContinualERM`` (logistic, block 8, base 16)
  on d = 10 or 100 features, sharded (bounded input; each stream's log in memory);
  the rate counts key-steps (two points each) per second like the others,
  though a model is released only once per block of 8 points (every 4 steps);
* ``filled``: a non-private per-key hourly count that also emits the empty
  steps, written as one cheap DoFn after a GroupByKey (what a pipeline
  without DP would run to publish the same table);
* ``input``: the input stage alone, which every other case also runs (the
  in-memory events through ``Create`` and the stamping ``Map``, then dropped);
  not a release, it shows how much of each case's time is that common stage;
* ``plain-erm-d10``, ``plain-erm-d100``: a non-private pipeline publishing
  the same models: per key, after a GroupByKey, the points in time order
  and, after every block of 8, the L2-regularised logistic model of all
  points so far, fitted by SciPy's L-BFGS-B from the previous model (what
  the ERM cases cost without privacy; the issue's measure is still the
  filled count);
* ``points-d10``, ``points-d100``: the ERM case's points moved to their shard and
  nothing else: per bundle, each event's time, features and label appended to the
  float64 buffers of its (key, step) (the ERM transforms' packed form, without their
  checks), the buffers grouped by the shard of their key and read back as arrays; no
  order, no model. A pipeline training a model per key on these points moves them so
  too (non-private; a reference, not a release);
* ``plain-mean``: a non-private pipeline publishing the same user-level table as
  ``mean``: each user's events grouped and cut to its first ``max_samples_per_user``
  in time order, then per key, after a second GroupByKey, the running mean of the
  kept samples at every hour (empty ones too).

Every case reads the same in-memory events through a ``Create`` with a
declared element type (Beam would otherwise infer the type of every element,
a cost of the benchmark that no real source has) and stamps them in the
pipeline. Rates are outputs per second of wall time and of CPU time (the
in-process runner's threads all count to this process, so CPU time is the
steadier measure on a shared machine). ``cpu ratio`` is ``sharded / filled``
in CPU rates: the issue's target is >= 0.5 from 1,000 keys on. A second line gives
every private case's rates over the filled count's, and one per ERM or mean case
with its non-private counterpart in the run (``plain-…``), the same ratio over that.

``--mean-users U1,U2,...`` adds the mean's users axis: ``--mean-keys`` declared keys
(10), U users with four events each in one key, the private mean (its ``max_users`` the
users per key) against the filled count and the non-private mean on the same events;
``--keys ""`` runs it alone.

``--per-step E`` gives every key E events per step instead of two (a minute apart, or
spread evenly over the hour above 60) and ``--erm-block B`` the ERM cases' block size
(``base_size`` 2B; 8 by default), for ERM configured for useful models: with
``--per-step 64 --erm-block 256`` a model is still released every 4 steps, each block
of 256 points where the default trains on 8 (a model whose noise is larger than
its weights, the worst case per point). ``--array-features`` makes the ERM cases'
``features_fn`` return a new NumPy array per event instead of a list. With ``input``
among the cases, a line gives its share of the filled count's time and every case's
time beyond it (the transform's own cost), and the ratios of those.

``--floor`` adds a line per ERM case and for ``mean``: the time of its mechanism alone,
engine-free (no Beam), on the same events (:func:`mechanism_seconds`,
:func:`mean_mechanism_seconds`; medians of ``--repeats`` runs after the pipelines'), and
the filled count's time over it, and over it plus the input stage when ``input`` is among
the cases: the best ratio any pipeline around that mechanism could reach. With the
``points-d…`` case of the same d among the cases, a further line gives the filled
count's time over the points' time plus the mechanism's: the best ratio of a pipeline that
groups each key's points on this runner and trains these models on them.

``--gc`` adds a line with every case's seconds in Python's garbage collector (medians),
and ``--gc-freeze`` moves the in-memory events (and whatever else exists by then: imported
modules, the runner's set-up) out of the collector's reach (``gc.freeze()``) before the
runs of a key count. A full collection walks every object the process holds, and the
benchmark holds all its events at once, which a pipeline reading a real source does not.

``--workers N`` (N > 1) also runs the sharded count with the in-process
runner's ``multi_processing`` mode on N worker processes and on one, checks
that both release the same values (a fixed noise key), and prints the
speed-up in wall time. ``--rss-keys N`` runs the sharded count for N keys
(``--rss-steps`` steps, one event per key and step) in a child process and
prints its peak resident memory; ``--state-keys`` prints the size of the
sharded state per key (pickled tree states after ``--steps`` steps) for that
many keys, computed without Beam; ``--build-keys N`` prints the CPU time to
build the sharded count's pipeline for N declared keys and translate it to
the runner API, against the non-private pipeline's.

    python benchmarks/scale.py [--keys 10,100,1000] [--steps 72] [--repeats 3]
        [--cases per-key,sharded,sharded-blt,sum,user-count,mean,erm-d10,erm-d100,plain-erm-d10,plain-erm-d100,points-d10,points-d100,plain-mean,filled,input]
        [--per-step 2] [--erm-block 8] [--array-features] [--floor] [--gc] [--gc-freeze]
        [--workers 2] [--mean-users 100,1000,10000,100000 [--mean-keys 10]]
        [--rss-keys 100000] [--state-keys 100000] [--build-keys 100000]
"""

import argparse
import gc
import json
import os
import pickle
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
from scipy import optimize, special  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.transforms.window import GlobalWindows  # noqa: E402

import dp_beam as dpb  # noqa: E402
from dp_beam.mechanisms import BinaryTreeMechanism  # noqa: E402
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanLockstep,  # noqa: E402
                                               UserState, contribution, user_hash)
from dp_beam.mechanisms.erm import ContinualERMMechanism  # noqa: E402
from dp_beam.mechanisms.noise_key import KeyedNoise  # noqa: E402
from dp_beam.transforms.mean_aggregates import accumulator, merge_into  # noqa: E402
from dp_beam.transforms.stream_keys import default_shards, shard_of  # noqa: E402

HOUR = 3600.0
CASES = ("per-key", "sharded", "sharded-blt", "sum", "user-count", "mean", "plain-mean", "erm-d10",
         "erm-d100", "plain-erm-d10", "plain-erm-d100", "points-d10", "points-d100", "filled",
         "input")
#: The ERM cases' default block size (``--erm-block``) and their λ.
ERM_BLOCK, ERM_LAMBDA = 8, 0.1
#: Events per user on the mean's users axis (``--mean-users``).
USER_EVENTS = 4
#: Fixed only so that the multi-process check can compare two runs' values.
BENCH_KEY = dpb.NoiseKey.from_bytes(bytes(range(32)))


def events_for(keys, steps, per_step=2):
    """``per_step`` events per key and step, ``(key, time, value)``: a minute apart, or spread
    evenly over the hour when there are more than 60."""
    gap = min(60.0, HOUR / per_step)
    return [(f"k{k}", s * HOUR + gap * j, float(j % 5))
            for k in range(keys) for s in range(steps) for j in range(per_step)]


@beam.typehints.with_output_types(object)
class _CreateEvents(beam.Create):
    """``beam.Create`` with a declared element type (no inference over every element)."""

    def infer_output_type(self, unused_input_type):
        return object


def _stamp(e):
    return beam.window.TimestampedValue(e, e[1])


class _Filled(beam.DoFn):
    """Non-private: a key's count per hour, every hour of the schedule (empty ones too)."""

    def __init__(self, steps):
        self._steps = steps

    def process(self, element):
        key, times = element
        counts = [0] * self._steps
        for t in times:
            counts[int(t // HOUR)] += 1
        for step, count in enumerate(counts):
            yield key, step, count


def _user_of(e):
    """The mean cases' user: on the users axis the event's key and user field, else its key
    and its minute in the hour (two per key)."""
    return (e[0], e[3]) if len(e) > 3 else (e[0], int(e[1] % HOUR) // 60)


def user_events(users, keys, steps, per_user=USER_EVENTS):
    """The users axis: user u belongs to key u mod ``keys`` and has ``per_user`` events, at
    steps (7u + 13j) mod ``steps`` (distinct for j < 4 when ``steps`` is 72), value
    (u + j) mod 5, as ``(key, time, value, user)``."""
    return [(f"k{u % keys}", ((u * 7 + 13 * j) % steps) * HOUR + (u % 3600), float((u + j) % 5), u)
            for u in range(users) for j in range(per_user)]


def _capped(element, max_samples):
    """A user's first ``max_samples`` events in time order, as ``(key, (time, value))``."""
    (key, _), events = element
    for e in sorted(events, key=lambda e: e[1])[:max_samples]:
        yield key, (e[1], e[2])


class _PlainMean(beam.DoFn):
    """Non-private: a key's running mean of its users' kept samples, every hour of the
    schedule (empty ones too; None before the first sample)."""

    def __init__(self, steps):
        self._steps = steps

    def process(self, element):
        key, samples = element
        sums, counts = [0.0] * self._steps, [0] * self._steps
        for t, value in samples:
            step = int(t // HOUR)
            sums[step] += value
            counts[step] += 1
        total, n = 0.0, 0
        for step in range(self._steps):
            total += sums[step]
            n += counts[step]
            yield key, step, total / n if n else None


class _Features:
    """Point features for the ERM cases: one of five fixed vectors of norm <= 1 in R^d, by value;
    a list, or with ``as_array`` a new 1-D float64 NumPy array per event (as a feature
    extractor working in NumPy returns them)."""

    def __init__(self, dim, as_array=False):
        self._vectors = [[((i * 7 + j * 3) % 11 - 5) / (5.0 * dim ** 0.5) for i in range(dim)]
                         for j in range(5)]
        self._as_array = as_array
        self._arrays = [np.array(v) for v in self._vectors]

    def __call__(self, event):
        if self._as_array:
            return self._arrays[int(event[2])].copy()
        return self._vectors[int(event[2])]


def _label(event):
    """The ERM cases' class of an event: its value's parity."""
    return int(event[2]) % 2


class _GatherPoints(beam.DoFn):
    """Non-private, the ``points-d…`` cases: each event's time, features (the ERM case's
    :class:`_Features`, as lists) and label appended to its (key, step)'s buffers over the
    bundle, float64 rows as in the ERM transforms' packed form, and sent on at the bundle's
    end grouped by the shard of their key, ``(shard, [(key, step, times, rows, labels),
    ...])``. No checks, no order, no model: what moving a key's points to one place costs.
    Unlike the transform's (``MAX_BUNDLE_POINTS``), the table has no bound: a bundle sends
    each (key, step) once, the fewest elements a grouping can be given."""

    def __init__(self, dim, shards):
        self._dim, self._shards = dim, shards

    def setup(self):
        self._features = _Features(self._dim)
        self._row, self._time = struct.Struct(f"<{self._dim}d"), struct.Struct("<d")

    def start_bundle(self):
        self._table = {}

    def process(self, e):
        slot = (e[0], int(e[1] // HOUR))
        entry = self._table.get(slot)
        if entry is None:
            entry = self._table[slot] = (bytearray(), bytearray(), [])
        entry[0].extend(self._time.pack(e[1]))
        entry[1].extend(self._row.pack(*self._features(e)))
        entry[2].append(_label(e))

    def finish_bundle(self):
        by_shard = {}
        for (key, step), (times, rows, labels) in self._table.items():
            by_shard.setdefault(shard_of(key, self._shards), []).append(
                (key, step, bytes(times), bytes(rows), labels))
        self._table = {}
        for shard, items in by_shard.items():
            yield GlobalWindows.windowed_value((shard, items))


class _ReadPoints(beam.DoFn):
    """Non-private, the ``points-d…`` cases: a shard's points read back as ``(n, d)`` arrays
    (what a release reads), ``(shard, points)``."""

    def __init__(self, dim):
        self._dim = dim

    def process(self, element):
        shard, lists = element
        points = 0
        for items in lists:
            for _, _, times, rows, labels in items:
                matrix = np.frombuffer(rows, dtype="<f8").reshape(-1, self._dim)
                points += matrix.shape[0]
        yield shard, points


class _PlainERM(beam.DoFn):
    """Non-private: a key's logistic model (L2 penalty λ‖θ‖², intercept) after every block of
    points, each fit on all points so far by L-BFGS-B, warm-started from the last model."""

    def __init__(self, dim, block=ERM_BLOCK, array_features=False):
        self._features = _Features(dim, array_features)
        self._dim = dim
        self._block = block

    def process(self, element):
        key, events = element
        events = sorted(events, key=lambda e: e[1])
        X = np.ones((len(events), self._dim + 1))
        X[:, :-1] = [self._features(e) for e in events]
        y = np.array([float(_label(e)) for e in events])
        theta = np.zeros(X.shape[1])
        for n in range(self._block, len(events) + 1, self._block):
            theta = optimize.minimize(_logistic, theta, args=(X[:n], y[:n]), jac=True,
                                      method="L-BFGS-B").x
            yield key, n, theta


def _logistic(theta, X, y):
    """Mean logistic loss plus λ‖θ‖², and its gradient."""
    z = X @ theta
    p = special.expit(z)
    value = float(np.mean(np.logaddexp(0.0, z) - y * z)) + ERM_LAMBDA * float(theta @ theta)
    return value, X.T @ (p - y) / len(y) + 2.0 * ERM_LAMBDA * theta


def private_transform(case, keys, steps, max_users=None, erm_block=ERM_BLOCK, array_features=False):
    common = dict(epsilon=1.0, step=HOUR, start=0, end=steps * HOUR, key_fn=lambda e: e[0],
                  keys=[f"k{k}" for k in range(keys)], noise_key=BENCH_KEY)
    if case == "per-key":
        return dpb.ContinualCount(shards=0, **common)
    if case == "sharded":
        return dpb.ContinualCount(**common)
    if case == "sharded-blt":
        return dpb.ContinualCount(noise="gaussian", delta=1e-6, **common)
    if case == "sum":
        return dpb.ContinualSum(value_fn=lambda e: e[2], lower=0.0, upper=4.0, **common)
    if case == "user-count":
        return dpb.ContinualCount(privacy_unit="user", user_fn=_user_of, max_contributions=steps,
                                  **common)
    if case == "mean":
        return dpb.ContinualMean(user_fn=_user_of,
                                 value_fn=lambda e: e[2], lower=0.0, upper=4.0,
                                 max_samples_per_user=steps,
                                 # max_users bounds the users of one stream: two per key here.
                                 max_users=2 if max_users is None else max_users, **common)
    if case.startswith("erm-d"):
        dim = int(case[len("erm-d"):])
        return dpb.ContinualERM(features_fn=_Features(dim, array_features), label_fn=_label,
                                classes=(0, 1), n_features=dim, feature_bound=1.0, lam=ERM_LAMBDA,
                                block_size=erm_block, base_size=2 * erm_block,
                                timestamp_fn=lambda e: e[1], **common)
    raise ValueError(f"unknown case {case!r}")


def _dropped(unused_event):
    return False


def run_once(case, keys, steps, events, flags=(), sink=None, max_users=None, erm_block=ERM_BLOCK,
             array_features=False):
    """(wall seconds, CPU seconds of this process) of one pipeline run (``max_users``: the
    mean's declared users per stream, if not the key axis's; ``erm_block``: the ERM cases'
    block size; ``array_features``: their features as NumPy arrays instead of lists)."""
    wall, cpu = time.perf_counter(), time.process_time()
    p = beam.Pipeline(options=PipelineOptions(flags=list(flags), runner="FnApiRunner"))
    stamped = p | _CreateEvents(events, reshuffle=False) | beam.Map(_stamp)
    if case == "filled":
        _ = (stamped | beam.Map(lambda e: (e[0], e[1])) | beam.GroupByKey()
             | beam.ParDo(_Filled(steps)))
    elif case == "input":
        _ = stamped | "Drop" >> beam.Filter(_dropped)
    elif case == "plain-mean":
        # max_samples_per_user = steps, as the private case's cap.
        _ = (stamped | beam.Map(lambda e: (_user_of(e), e)) | "PerUser" >> beam.GroupByKey()
             | beam.FlatMap(_capped, steps) | "PerKey" >> beam.GroupByKey()
             | beam.ParDo(_PlainMean(steps)))
    elif case.startswith("points-d"):
        dim = int(case[len("points-d"):])
        _ = (stamped | beam.ParDo(_GatherPoints(dim, default_shards(keys, bounded=True)))
             | "PerShard" >> beam.GroupByKey() | beam.ParDo(_ReadPoints(dim)))
    elif case.startswith("plain-erm-d"):
        _ = (stamped | beam.Map(lambda e: (e[0], e)) | beam.GroupByKey()
             | beam.ParDo(_PlainERM(int(case[len("plain-erm-d"):]), erm_block, array_features)))
    else:
        releases = (stamped | private_transform(case, keys, steps, max_users, erm_block,
                                                array_features)).releases
        if sink is not None:
            _ = (releases | beam.Map(lambda r: json.dumps([r.key, r.step, r.value]))
                 | beam.io.WriteToText(sink, shard_name_template=""))
    p.run().wait_until_finish()
    return time.perf_counter() - wall, time.process_time() - cpu


class _GcClock:
    """Seconds the garbage collector ran within a ``with`` block (``on`` False: not measured,
    0), from its start and stop callbacks."""

    def __init__(self, on):
        self._on, self.seconds, self._start = on, 0.0, None

    def _callback(self, phase, unused_info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def __enter__(self):
        if self._on:
            gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *unused_exc):
        if self._on:
            gc.callbacks.remove(self._callback)
        return False


def mechanism_seconds(case, keys, steps, events, erm_block=ERM_BLOCK):
    """``(wall seconds, CPU seconds, models)`` of an ERM case's engine-free mechanism alone on
    the case's points: per key, its points in time order through the
    ``ContinualERMMechanism`` of the transform's own configuration (``extend``), with
    production noise (the engine-free default: a fresh keyed source per stream, the same exact
    samplers). No Beam at all, so no pipeline releasing these models with this mechanism
    can take less: the filled count's time over this bounds the case's ratio (``--floor``)."""
    dim = int(case[len("erm-d"):])
    config = private_transform(case, keys, steps, erm_block=erm_block).config
    features = _Features(dim)
    points = {}
    for e in events:
        points.setdefault(e[0], []).append(e)
    wall, cpu, models = time.perf_counter(), time.process_time(), 0
    for key_events in points.values():
        key_events.sort(key=lambda e: e[1])
        stream = ContinualERMMechanism.from_config(config)
        models += len(stream.extend(np.array([features(e) for e in key_events]),
                                    [_label(e) for e in key_events]))
    return time.perf_counter() - wall, time.process_time() - cpu, models


def mean_mechanism_seconds(keys, steps, events, max_users=None):
    """``(wall seconds, CPU seconds, releases)`` of the mean case's mechanism alone on its
    events, engine-free, the way the sharded release runs it at its fastest: every user's
    samples in time order through the per-user schedule (``contribution``), merged per
    (key, step), and each shard's streams stepped together (``MeanLockstep``; the shards of
    :func:`~dp_beam.transforms.stream_keys.default_shards`, keys spread by the public hash),
    every stream and step drawing from its own keyed source. The per-user caps, the grouping
    and the records are left out, so no pipeline with this mechanism takes less."""
    transform = private_transform("mean", keys, steps, max_users)
    params, lower, upper = transform.params, transform._lower, transform._upper
    shards = default_shards(keys, bounded=True)
    wall, cpu = time.perf_counter(), time.process_time()
    users, rows = {}, {}
    for e in sorted(events, key=lambda e: e[1]):
        user = _user_of(e)
        state = users.get(user)
        if state is None:
            state = users[user] = UserState(uhash=user_hash(user))
        step = int(e[1] // HOUR)
        agg = contribution(params, state, (e[2] - lower[0]) / (upper[0] - lower[0]), step=step)
        row = rows.setdefault(e[0], {})
        if step in row:
            merge_into(row[step], agg)
        else:
            row[step] = merge_into(accumulator(), agg)
    released = 0
    for shard in range(shards):
        names = [f"k{k}" for k in range(keys) if shard_of(f"k{k}", shards) == shard]
        if not names:
            continue
        lock = MeanLockstep([ContinualMeanCore(params, lower, upper, transform._horizon)
                             for _ in names])
        for step in range(steps):
            released += len(lock.step(
                [rows.get(name, {}).get(step) for name in names],
                [KeyedNoise(BENCH_KEY, ("scale-floor", name, step)) for name in names]))
        lock.write_back()
    return time.perf_counter() - wall, time.process_time() - cpu, released


def floor_line(case, filled, floor, base=None):
    """The ``--floor`` line of an ERM case or the mean: its mechanism's time alone
    (:func:`mechanism_seconds`, :func:`mean_mechanism_seconds`) and the ratios to the filled
    count it leaves at best, without and with the input stage (``base``) that every pipeline
    also runs. ``filled`` is (wall, CPU), ``floor`` (wall, CPU, models or releases)."""
    bound = (f", filled / (input + it) {filled[0] / (base + floor[0]):.2f}"
             if base is not None else "")
    unit = "releases" if case == "mean" else "models"
    return (f"{case} mechanism alone, no Beam ({floor[2]:,} {unit}): {floor[0]:.2f} s "
            f"({floor[1]:.2f}); at best filled / it {filled[0] / floor[0]:.2f} "
            f"({filled[1] / floor[1]:.2f}){bound}")


def points_line(case, filled, points, mechanism):
    """The ``--floor`` line of an ERM case whose points were also moved alone (``points-d…``,
    the same d): the filled count's wall time over the time of moving the points to their
    shard plus the mechanism's. A pipeline that groups each key's points and trains these
    models on them takes at least both on this runner, so this bounds its ratio."""
    return (f"{case} with its points moved alone ({points:.2f} s): at best filled / "
            f"(points + mechanism) {filled / (points + mechanism):.2f}")


def input_line(cases, seconds):
    """The common input stage's share of the filled count's wall time, and every case's time
    beyond it, with the ratios of those (filled's over the case's: the transform's own cost
    against the non-private count's). Differences of medians: a rough measure."""
    base = seconds["input"]
    own = {c: seconds[c] - base for c in cases if c != "input"}
    # Where the filled count's own time is within the noise of the input stage's (<= 0), a
    # ratio to it means nothing.
    parts = [f"{c} {own[c]:.2f} s" + (f" ({own['filled'] / own[c]:.2f})"
                                       if c != "filled" and own[c] > 0 and own["filled"] > 0 else "")
             for c in cases if c != "input"]
    return (f"input stage {base:.2f} s = {base / seconds['filled']:.2f} of filled; beyond it "
            "(filled's / the case's): " + ", ".join(parts))


def state_bytes_per_key(keys, steps):
    """Pickled size of a shard's stream table per key, tree mechanism after ``steps`` steps."""
    entry = BinaryTreeMechanism(1.0, horizon=steps)
    for _ in range(steps):
        entry.step(2.0)
    state = entry.to_state()
    # A copy per key: pickle would store one shared object only once.
    table = {f"k{k}": {"mechanism": pickle.loads(pickle.dumps(state)), "next": steps, "first": 0}
             for k in range(keys)}
    return len(pickle.dumps(table, protocol=4)) / keys


def compare_workers(keys, steps, workers):
    """Wall seconds on 1 and on ``workers`` processes, and whether the released values agree."""
    events = events_for(keys, steps)
    out, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, workers):
            flags = ["--direct_num_workers", str(n), "--direct_running_mode", "multi_processing"]
            sink = os.path.join(tmp, f"releases-{n}")
            seconds[n] = run_once("sharded", keys, steps, events, flags, sink)[0]
            with open(sink) as f:
                out[n] = sorted(f.read().splitlines())
    return seconds[1], seconds[workers], out[1] == out[workers] and len(out[1]) == keys * steps


def build_seconds(case, keys, steps):
    """CPU seconds to build ``case``'s pipeline for ``keys`` declared keys and translate it to
    the runner API (what every runner does before it runs anything); the least of 3."""
    best = float("inf")
    for _ in range(3):
        cpu = time.process_time()
        p = beam.Pipeline(options=PipelineOptions(runner="FnApiRunner"))
        stamped = p | _CreateEvents([("k0", 0.0, 1.0)], reshuffle=False) | beam.Map(_stamp)
        if case == "filled":
            _ = (stamped | beam.Map(lambda e: (e[0], e[1])) | beam.GroupByKey()
                 | beam.ParDo(_Filled(steps)))
        else:
            _ = stamped | private_transform(case, keys, steps)
        p.to_runner_api()
        best = min(best, time.process_time() - cpu)
    return best


def peak_rss_mib(keys, steps):
    """Peak resident memory (MiB) of a child process running the sharded count once.

    The child reports its own high-water mark (``VmHWM``): ``RUSAGE_CHILDREN`` would also
    count this process's peak, which Linux carries through the child's fork and exec (a
    parent holding 1.5 GiB made a 13 MiB child report 1.5 GiB)."""
    code = (f"import sys; sys.argv=['scale']; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r});"
            f"import scale; scale.run_once('sharded', {keys}, {steps}, scale.events_for({keys}, {steps}, 1));"
            "print(scale.own_peak_kib())")
    out = subprocess.run([sys.executable, "-c", code], check=True, stderr=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, text=True).stdout
    return int(out.split()[-1]) / 1024


def own_peak_kib():
    """This process's peak resident memory in KiB (``VmHWM``; ``ru_maxrss`` where there is no
    /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def mean_users_axis(user_counts, keys, steps, repeats):
    """The mean's users axis: ``keys`` declared keys, each of ``users`` users with
    :data:`USER_EVENTS` events in one key; the private mean (``max_users`` the users per key)
    against the filled count and the non-private mean on the same events, in wall and CPU
    time (the same key-steps are published by all three, so time ratios are rate ratios)."""
    cases = ("mean", "plain-mean", "filled")
    print(f"mean, users axis: {keys} keys x {steps} steps, {USER_EVENTS} events per user; "
          f"seconds, medians of {repeats} interleaved runs")
    print(f"{'users':>7} | {'events':>8} | " + " | ".join(f"{c:>17}" for c in cases)
          + " | mean events/s | mean / filled wall (cpu) | mean / plain-mean wall (cpu)")
    for users in user_counts:
        events = user_events(users, keys, steps)
        per_key = -(-users // keys)
        wall = {c: [] for c in cases}
        cpu = {c: [] for c in cases}
        for _ in range(repeats):
            for case in cases:
                w, c = run_once(case, keys, steps, events, max_users=per_key)
                wall[case].append(w)
                cpu[case].append(c)
        w = {c: statistics.median(wall[c]) for c in cases}
        c = {k: statistics.median(cpu[k]) for k in cases}
        print(f"{users:>7,} | {len(events):>8,} | "
              + " | ".join(f"{w[k]:>7.2f} ({c[k]:>7.2f})" for k in cases)
              + f" | {len(events) / w['mean']:>13,.0f}"
              + f" | {w['filled'] / w['mean']:>13.2f} ({c['filled'] / c['mean']:.2f})"
              + f" | {w['plain-mean'] / w['mean']:>17.2f} ({c['plain-mean'] / c['mean']:.2f})",
              flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="10,100,1000")
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rss-keys", type=int, default=0)
    parser.add_argument("--rss-steps", type=int, default=4)
    parser.add_argument("--state-keys", type=int, default=100_000)
    parser.add_argument("--build-keys", type=int, default=0)
    parser.add_argument("--mean-users", default="")
    parser.add_argument("--mean-keys", type=int, default=10)
    parser.add_argument("--per-step", type=int, default=2)
    parser.add_argument("--erm-block", type=int, default=ERM_BLOCK)
    parser.add_argument("--array-features", action="store_true")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("--gc", action="store_true")
    parser.add_argument("--gc-freeze", action="store_true")
    args = parser.parse_args(argv)
    if args.per_step < 1 or args.erm_block < 1:
        parser.error("--per-step and --erm-block must be >= 1")
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown or "filled" not in cases or "sharded" not in cases:
        parser.error(f"--cases must include sharded and filled, from {', '.join(CASES)}")
    key_counts = [int(k) for k in args.keys.split(",") if k]
    if key_counts:
        print("out/s in wall time (CPU time in brackets); medians of "
              f"{args.repeats} interleaved runs, {args.steps} steps, {args.per_step} events per "
              f"key and step" + (f", ERM blocks of {args.erm_block}"
                                 + (", features as NumPy arrays" if args.array_features else "")
                                 if any(c.startswith(("erm-", "plain-erm-")) for c in cases) else "")
              + (", the events frozen out of the garbage collector's reach" if args.gc_freeze
                 else ""))
        print(f"{'keys':>6} | " + " | ".join(f"{c:>19}" for c in cases)
              + " | sharded/filled wall | cpu")
    for keys in key_counts:
        events = events_for(keys, args.steps, args.per_step)
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        wall = {c: [] for c in cases}
        cpu = {c: [] for c in cases}
        collecting = {c: [] for c in cases}
        for _ in range(args.repeats):
            for case in cases:      # interleaved: load drifts hit every case alike
                with _GcClock(args.gc) as clock:
                    w, c = run_once(case, keys, args.steps, events, erm_block=args.erm_block,
                                    array_features=args.array_features)
                wall[case].append(w)
                cpu[case].append(c)
                collecting[case].append(clock.seconds)
        if args.gc_freeze:
            gc.unfreeze()
        n = keys * args.steps
        rate = {c: n / statistics.median(wall[c]) for c in cases}
        crate = {c: n / statistics.median(cpu[c]) for c in cases}
        print(f"{keys:>6} | " + " | ".join(f"{rate[c]:>8,.0f} ({crate[c]:>8,.0f})" for c in cases)
              + f" | {rate['sharded'] / rate['filled']:>19.2f} | {crate['sharded'] / crate['filled']:.2f}",
              flush=True)
        # Every private case against the same run's filled count (the measure).
        print(f"{keys:>6} | / filled, wall (cpu): " + ", ".join(
            f"{c} {rate[c] / rate['filled']:.2f} ({crate[c] / crate['filled']:.2f})"
            for c in cases if c not in ("filled", "input") and not c.startswith(("plain-", "points-"))),
            flush=True)
        moved = [c for c in cases if c.startswith("points-")]
        if moved:
            print(f"{keys:>6} | points moved alone / filled, wall (cpu): " + ", ".join(
                f"{c} {rate[c] / rate['filled']:.2f} ({crate[c] / crate['filled']:.2f})"
                for c in moved), flush=True)
        if args.gc:
            print(f"{keys:>6} | garbage collection, s: " + ", ".join(
                f"{c} {statistics.median(collecting[c]):.2f}" for c in cases), flush=True)
        if "input" in cases:
            print(f"{keys:>6} | " + input_line(cases, {c: statistics.median(wall[c]) for c in cases}),
                  flush=True)
        if args.floor:
            filled = (statistics.median(wall["filled"]), statistics.median(cpu["filled"]))
            base = statistics.median(wall["input"]) if "input" in cases else None
            for c in cases:
                if c.startswith("erm-d") or c == "mean":
                    runs = [mean_mechanism_seconds(keys, args.steps, events) if c == "mean"
                            else mechanism_seconds(c, keys, args.steps, events, args.erm_block)
                            for _ in range(args.repeats)]
                    floor = (statistics.median(r[0] for r in runs),
                             statistics.median(r[1] for r in runs), runs[0][2])
                    print(f"{keys:>6} | " + floor_line(c, filled, floor, base), flush=True)
                    points = "points-" + c[len("erm-"):]
                    if points in cases:
                        print(f"{keys:>6} | " + points_line(
                            c, filled[0], statistics.median(wall[points]), floor[0]), flush=True)
        for c in cases:
            if c.startswith("plain-") and c[len("plain-"):] in cases:
                # A private case against the non-private pipeline publishing the same values.
                private = c[len("plain-"):]
                print(f"{keys:>6} | {private} / {c}: {rate[private] / rate[c]:.2f} "
                      f"({crate[private] / crate[c]:.2f})", flush=True)
    if args.mean_users:
        mean_users_axis([int(u) for u in args.mean_users.split(",")], args.mean_keys, args.steps,
                        args.repeats)
    if args.workers > 1 and key_counts:
        keys = max(key_counts)
        one, many, same = compare_workers(keys, args.steps, args.workers)
        print(f"multi_processing, {keys} keys: 1 worker {one:.1f} s, {args.workers} workers "
              f"{many:.1f} s: speed-up {one / many:.2f}; same releases: {same}", flush=True)
    if args.rss_keys:
        print(f"peak RSS, sharded count, {args.rss_keys:,} keys x {args.rss_steps} steps: "
              f"{peak_rss_mib(args.rss_keys, args.rss_steps):,.0f} MiB", flush=True)
    if args.build_keys:
        print(f"build and translate, {args.build_keys:,} declared keys: sharded count "
              f"{build_seconds('sharded', args.build_keys, args.steps):.2f} s, non-private "
              f"{build_seconds('filled', args.build_keys, args.steps):.2f} s (CPU)", flush=True)
    if args.state_keys:
        print(f"sharded state: {state_bytes_per_key(args.state_keys, args.steps):.0f} bytes per key "
              f"({args.state_keys:,} keys, tree after {args.steps} steps)")


if __name__ == "__main__":
    main()
