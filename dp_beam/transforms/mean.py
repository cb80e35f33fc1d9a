"""``ContinualMean``: a user-level mean released every step (seed 003, Algorithm 6).

Shape (DESIGN.md "time model"), spec withhold_release_and_composition.md §2.5,
§2.9: validate and clamp every event in parallel → the per-user withhold-release
schedule (one per key the user may touch, the cap m, and the projection of
every released element for every candidate prior) → per-step ``CombinePerKey``
of fixed-size aggregates → one ordered release DoFn per stream running the core
of Algorithm 6 (the L+1 trees, the medians, the count tree under participation,
and the estimate). Unbounded input keeps each user's schedules in one Beam state
cell (O(k·d) numbers per user) and places aggregates in event-time fixed
windows; bounded input groups each user's events (``GroupByKey``), runs the
schedule in event-time order and keys the combine by (key, step), because on
the batch runners a state cell per user cost more than the schedule itself
(``benchmarks/mean_throughput.py``).

All DP math lives in :mod:`dp_beam.mechanisms.continual_mean`; this module
only moves data and splits the budget over keys.

Neighbour relation (``neighbours=``)
    ``"values"`` is the paper's model: a user's *values* are protected while
    the arrival pattern (who sends a sample at which step, hence every count,
    activation time and the diversity flag) is treated as public.
    ``"participation"`` (default) protects whether and when a user takes part
    at all: counts are released through their own noisy tree, the estimate's
    denominator and the level activations are read from it, and elements are
    centred before they enter a tree. Use ``"values"`` only when the set of
    active users and their activity over time may be published; otherwise the
    default is the one that holds.

Keys (``key_fn=``, spec §4 R2/R3)
    One mean stream per key of the public key set (``keys=[...]``), or per key
    admitted by private key selection (``keys=dpb.PrivateKeys(...)``, with
    ``max_keys_per_unit`` = ``max_keys_per_user``). Parallel composition over keys would need every
    user's samples to fall under a single key; a user who may appear under
    several keys (an aircraft flying for two carriers) touches several streams,
    which compose sequentially for that user. So each user keeps at most
    ``max_keys_per_user`` = k keys (default 1), the first of theirs seen;
    events under further keys go to ``.invalid`` ("max_keys_per_user
    exceeded"). "First" is arrival order in a streaming run and event-time
    order in batch (ties between a user's events of the same event time are
    broken in arbitrary order, so which keys are kept may then differ between
    runs). The privacy argument holds for any order: the choice for a user is
    made from that user's own events only, and afterwards the user touches at
    most k streams with at most m samples in each. Each stream is calibrated
    at ε/k (Laplace; with Gaussian noise at ρ/k, ρ = ρ(ε, δ)), so a user's
    total over the k streams it may touch is at most the transform's ε. Every key's ledger entry
    states that total (k times the stream's own cost), which makes the
    parallel composition of ``CombineAccounting`` (the maximum over a
    transform's keys) report the right per-user charge. Under ``"values"`` the
    key of an event is part of the public arrival pattern, like its time.

Vector values (spec §3.3)
    ``value_fn`` may return a sequence of d reals; ``lower``/``upper`` are
    scalars (the same bounds for every coordinate) or sequences of length d.
    ``dim`` is taken from sequence bounds or given explicitly (scalar bounds
    and no ``dim`` mean d = 1). Coordinates are clamped separately; a value of
    the wrong length or with a non-finite coordinate goes to ``.invalid``. The
    d coordinates share the budget: every tree's sensitivity is d times a
    coordinate's (L1) and each median runs per coordinate at ε_M/d, so the
    whole vector costs ε per stream, as the ledger states.
"""

import dataclasses
import datetime
import math
import numbers
import pickle
from typing import Any, Callable, Optional

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import FixedWindows, GlobalWindows
from apache_beam.utils.timestamp import Timestamp

from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms.calibration import eps_from_rho_delta
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanAggregate, MeanParams,
                                               check_keywords, mean_config,
                                               UserState, contribution, user_hash)
from dp_beam.records import LedgerEntry
from dp_beam.records_mean import MeanRelease
from dp_beam.transforms.events import (CAPPED, INVALID, NAMESPACE, TRANSIENT_ERRORS,
                                       UNBOUNDED_LATENESS, CountCapped, ValidatingDoFn, as_real,
                                       capped, check_transient_errors)
from dp_beam.transforms.keys import UNITS
from dp_beam.transforms.release import ReleaseSpec
from dp_beam.transforms.steps import StepEnd, StepOf
from dp_beam.transforms.stream_keys import KV
from dp_beam.transforms.streams import (private_keys, release_streams, set_release_options,
                                        validation)

__all__ = ["ContinualMean", "MeanReleaseSpec", "MECHANISM", "PackedSamples", "resolve_bounds"]

MECHANISM = "withhold_release_mean"


def _bound_values(name, value):
    """A bound as a tuple of floats (one per coordinate) and whether it was a sequence."""
    if isinstance(value, np.ndarray):
        if value.ndim > 1:
            raise ValueError(f"{name} must be a number or a flat sequence of numbers, got {value!r}")
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must not be an empty sequence")
        items, seq = list(value), True
    else:
        items, seq = [value], False
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise ValueError(f"{name} must be finite numbers, got {value!r}")
        out.append(float(v))
    return tuple(out), seq


def resolve_bounds(lower, upper, dim=None):
    """``(lower, upper, dim)``: per-coordinate bounds as float arrays of length ``dim``.

    Scalar bounds apply to every coordinate; sequence bounds fix ``dim``
    (``dim=None``) or must have length ``dim``. Raises ``ValueError`` naming
    the parameter.

    >>> lo, hi, d = resolve_bounds(0, [1.0, 2.0])
    >>> lo.tolist(), hi.tolist(), d
    ([0.0, 0.0], [1.0, 2.0], 2)
    """
    lo, lo_seq = _bound_values("lower", lower)
    hi, hi_seq = _bound_values("upper", upper)
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)
                            or dim < 1):
        raise ValueError(f"dim must be an int >= 1 or None, got {dim!r}")
    lengths = {n for n, seq in ((len(lo), lo_seq), (len(hi), hi_seq)) if seq}
    if len(lengths) > 1:
        raise ValueError(f"lower and upper must have the same length, got lower={lower!r}, "
                         f"upper={upper!r}")
    inferred = lengths.pop() if lengths else None
    if dim is None:
        dim = inferred or 1
    elif inferred is not None and inferred != dim:
        which = "lower" if lo_seq and len(lo) != dim else "upper"
        raise ValueError(f"{which} has {inferred} coordinates but dim={dim}")
    dim = int(dim)
    lo_a = np.broadcast_to(np.asarray(lo), (dim,)).astype(np.float64)
    hi_a = np.broadcast_to(np.asarray(hi), (dim,)).astype(np.float64)
    if np.any(lo_a >= hi_a):
        raise ValueError(f"lower must be < upper (in every coordinate), got lower={lower!r}, "
                         f"upper={upper!r}")
    return lo_a, hi_a, dim


@beam.typehints.with_output_types(KV)
class _PrepareMeanEvents(ValidatingDoFn):
    """Event time, key, user and value of each event → ``(user, (key, value, ts))`` at time ``ts``.

    ``value`` is clamped to the bounds (a float for d = 1, a tuple of d floats
    otherwise; clamping counted in the ``clamped`` metric). Failing user
    functions, ``None`` users or keys, non-real or non-finite coordinates,
    values of the wrong length and event times outside Beam's range go to
    ``invalid`` with the reason.
    """

    def __init__(self, transform, value_fn, user_fn, key_fn, timestamp_fn, lower, upper,
                 schedule=None, keys=None, transient_errors=TRANSIENT_ERRORS):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._value_fn = value_fn
        self._user_fn = user_fn
        self._lo = [float(v) for v in lower]
        self._hi = [float(v) for v in upper]
        self._dim = len(self._lo)
        self._clamped = Metrics.counter(NAMESPACE, f"{transform}.clamped")

    def _value(self, raw):
        """The clamped value, or ``(None, reason)``."""
        d = self._dim
        if d == 1 and type(raw) is float and math.isfinite(raw):
            # The common case, without the generic checks below.
            lo, hi = self._lo[0], self._hi[0]
            if raw < lo or raw > hi:
                self._clamped.inc()
                return min(max(raw, lo), hi), None
            return raw, None
        if isinstance(raw, np.ndarray):
            raw = raw.tolist() if raw.ndim == 1 else raw
        if isinstance(raw, (list, tuple)):
            items = raw
        elif d == 1:
            items = (raw,)
        else:
            return None, (f"not a sequence of {d} real numbers: {type(raw).__name__}")
        if len(items) != d:
            return None, f"value has {len(items)} coordinates, expected {d}"
        out = []
        clamped = False
        for j, (item, lo, hi) in enumerate(zip(items, self._lo, self._hi)):
            v, err = as_real(item)
            if err:
                return None, err if d == 1 else f"coordinate {j}: {err}"
            if v < lo or v > hi:
                clamped = True
                v = min(max(v, lo), hi)
            out.append(v)
        if clamped:
            self._clamped.inc()
        return (out[0] if d == 1 else tuple(out)), None

    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        ts, key, err = self._time_and_key(element, timestamp, declared)
        if err:
            yield self._reject(element, err, timestamp)
            return
        user, err = self._user(element, self._user_fn)
        if err:
            yield self._reject(element, err, timestamp)
            return
        raw, err = self._call("value_fn", self._value_fn, element)
        if err:
            yield self._reject(element, err, timestamp)
            return
        value, err = self._value(raw)
        if err:
            yield self._reject(element, err, timestamp)
            return
        yield beam.window.TimestampedValue((user, (key, value, ts)), ts)


class _UserStage(beam.DoFn):
    """Per-user schedule (§2.5) of one event: the part both per-user stages share.

    A user's streams map each key it keeps to ``[UserState, latest event
    time]``: the schedule's count, segment sum (d numbers), first step and
    hash. A key beyond the user's first ``max_keys``, or a sample beyond
    ``max_samples_per_user`` in a key, goes to ``capped`` (one ``invalid``
    record per user, reason and step, :class:`CountCapped`). A sample's
    aggregate belongs to the step of the latest event time the user has shown
    in that key, so a released element never lands in a step before one of
    its own samples.
    """

    def __init__(self, transform, params, lower, upper, step_micros, max_keys, selecting=False):
        self._transform = transform
        # Private key selection: signal each user's first event under a key.
        self._selecting = selecting
        self._params = params
        self._lower = np.asarray(lower, dtype=np.float64)
        self._range = np.asarray(upper, dtype=np.float64) - self._lower
        self._step_micros = step_micros
        self._max_keys = max_keys
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")
        self._over_keys = Metrics.counter(NAMESPACE, f"{transform}.over_keys")

    def setup(self):
        # Scalars skip NumPy broadcasting on the per-event path.
        self._lo0, self._r0 = float(self._lower[0]), float(self._range[0])
        self._scalar = self._params.dim == 1

    def _reject(self, counter, reason, user, key, value, ts, by_key=False):
        counter.inc()
        return capped(reason, user, Timestamp.of(ts).micros // self._step_micros,
                      {"key": key, "value": list(value) if isinstance(value, tuple) else value}, ts,
                      key=by_key)

    def _consume(self, streams, user, key, value, ts):
        """``(aggregate, latest, step)`` of one event, updating ``streams``; or a rejection."""
        entry = streams.get(key)
        if entry is None:
            if len(streams) >= self._max_keys:
                return self._reject(self._over_keys,
                                    f"max_keys_per_user ({self._max_keys}) exceeded for user",
                                    user, key, value, ts, by_key=True)
            entry = streams[key] = [UserState(uhash=user_hash(user)), None]
        ustate = entry[0]
        m = self._params.m
        if ustate.count >= m:
            return self._reject(self._over, f"max_samples_per_user ({m}) exceeded for user",
                                user, key, value, ts)
        latest = ts if entry[1] is None else max(entry[1], ts)
        entry[1] = latest
        # The step of the event-time window Beam would assign (same microsecond rounding).
        step = Timestamp.of(latest).micros // self._step_micros
        if self._scalar:
            x = np.array([(value - self._lo0) / self._r0])
        else:
            x = (np.asarray(value, dtype=np.float64) - self._lower) / self._range
        return contribution(self._params, ustate, x, step=step), latest, step


@beam.typehints.with_output_types(KV)
class _WithholdRelease(_UserStage):
    """Streaming per-user stage: ``(user, (key, value, ts))`` → ``(key, MeanAggregate)``.

    All of a user's schedules live in one Beam state cell (O(k·d) numbers);
    events are taken in arrival order, so a user keeps the first keys it is
    seen with. The aggregate is stamped with the latest event time, and the
    step windows downstream place it.
    """

    STATE = ReadModifyWriteStateSpec("user", PickleCoder())

    def process(self, element, state=beam.DoFn.StateParam(STATE)):
        user, (key, value, ts) = element
        stored = state.read() or {}
        streams = {k: [UserState.from_tuple(t), latest] for k, (t, latest) in stored.items()}
        new = key not in streams
        out = self._consume(streams, user, key, value, ts)
        if isinstance(out, pvalue.TaggedOutput):
            yield out
            return
        if new and self._selecting:
            yield pvalue.TaggedOutput(UNITS, (key, ts))
        agg, latest, _ = out
        stored[key] = (streams[key][0].to_tuple(), latest)
        state.write(stored)
        yield beam.window.TimestampedValue((key, agg), latest)


@beam.typehints.with_output_types(KV)
class _WithholdReleaseBatch(_UserStage):
    """Bounded per-user stage: ``(user, [(key, value, ts), ...])`` → ``((key, step), MeanAggregate)``.

    All of a user's events arrive together (a ``GroupByKey``), so they are
    taken in event-time order (ties in arbitrary order): the schedule and the
    keys a user keeps are those of a stream that arrived in time order. A
    user's aggregates of one key and step are merged before they leave, and
    the step is part of the output key, so the combine downstream needs no
    event-time windows (bounded input has no late data). No Beam state is
    involved: on the batch runners, loading and measuring a state cell per
    user cost more than the schedule itself.
    """

    def process(self, element):
        user, events = element
        streams, pending = {}, {}
        for key, value, ts in sorted(events, key=lambda e: e[2]):
            new = key not in streams
            out = self._consume(streams, user, key, value, ts)
            if isinstance(out, pvalue.TaggedOutput):
                yield out
                continue
            if new and self._selecting:
                yield pvalue.TaggedOutput(UNITS, (key, ts))
            agg, _, step = out
            cur = pending.get(key)
            if cur is not None and cur[0] == step:
                _merge_into(cur[1], agg)
                continue
            if cur is not None:
                yield (key, cur[0]), cur[1]
            pending[key] = [step, agg]
        for key, (step, agg) in pending.items():
            yield (key, step), agg


class PackedSamples:
    """The ``(order_key, index, x)`` samples of a :class:`MeanAggregate`, packed for transport.

    The core only iterates over an aggregate's samples (the first 2^{L−1} of
    every user, kept for the medians of §2.8), so a step's samples can leave
    a worker as three arrays instead of one tuple and one NumPy array per
    sample: pickling, decoding and the runners' state-size measurement then
    cost per step, not per sample (measured: they were most of the
    transform's time on the flights data). Samples added as triples are kept
    loose (appending is cheap) and packed when pickled. Iteration yields the
    triples, ``order_key = (first_step, uhash)`` as Python ints and ``x`` a
    float64 d-vector; ``+`` and :meth:`extend` concatenate, as the list form does.

    >>> s = PackedSamples([((0, 7), 1, np.array([0.5])), ((0, 7), 2, np.array([0.25]))])
    >>> s = pickle.loads(pickle.dumps(s)) + [((1, 3), 1, np.array([1.0]))]
    >>> [(k, i, x.tolist()) for k, i, x in s]
    [((0, 7), 1, [0.5]), ((0, 7), 2, [0.25]), ((1, 3), 1, [1.0])]
    """

    __slots__ = ("_chunks", "_loose")

    def __init__(self, triples=(), chunks=()):
        self._chunks = list(chunks)
        self._loose = list(triples)

    def _pack(self):
        if self._loose:
            loose = self._loose
            keys = np.array([k for k, _, _ in loose], dtype=np.int64).reshape(-1, 2)
            idx = np.array([i for _, i, _ in loose], dtype=np.int64)
            xs = np.array([np.asarray(x, dtype=np.float64).reshape(-1) for _, _, x in loose])
            self._chunks.append((keys, idx, xs))
            self._loose = []
        return self._chunks

    def __len__(self):
        return sum(len(idx) for _, idx, _ in self._chunks) + len(self._loose)

    def __bool__(self):
        return bool(self._loose) or any(len(idx) for _, idx, _ in self._chunks)

    def __iter__(self):
        for keys, idx, xs in self._chunks:
            for (first, uhash), i, x in zip(keys.tolist(), idx.tolist(), xs):
                yield (first, uhash), i, x
        yield from self._loose

    def extend(self, other):
        if isinstance(other, PackedSamples):
            if other._chunks:
                self._pack()
                self._chunks.extend(other._chunks)
            self._loose.extend(other._loose)
        else:
            self._loose.extend(other)

    def __add__(self, other):
        out = PackedSamples(self._loose, self._chunks)
        out.extend(other)
        return out

    def __radd__(self, other):
        out = PackedSamples(other)
        out.extend(self)
        return out

    def __reduce__(self):
        chunks = self._pack()
        if len(chunks) > 1:
            # One chunk on the wire: a step's samples arrive from many workers.
            keys, idx, xs = zip(*chunks)
            chunks[:] = [(np.concatenate(keys), np.concatenate(idx), np.concatenate(xs))]
        return (PackedSamples, ((), chunks))


_MERGED_FIELDS = ("events", "counts", "low", "n_low", "prefix", "proj", "a_inc", "samples", "max_count")


def _merge_into(acc, agg):
    """Adds ``agg`` into the accumulator ``acc`` in place; ``agg`` is left unchanged.

    ``MeanAggregate.merge`` builds a new aggregate and copies the sample list
    each time, which made a step's combine quadratic in its events. Arrays of
    ``agg`` may be stored in ``acc`` but are never modified in place (sums make
    new arrays), so inputs stay intact. ``acc.samples`` must be ``acc``'s own
    (a fresh list or :class:`PackedSamples`).
    """
    if MeanAggregate.__slots__ != _MERGED_FIELDS:
        # A field this in-place merge does not know: the mechanism's own merge.
        merged = acc.merge(agg)
        for name in MeanAggregate.__slots__:
            setattr(acc, name, getattr(merged, name))
        return acc
    acc.events += agg.events
    for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc"):
        mine = getattr(acc, name)
        for key, val in getattr(agg, name).items():
            mine[key] = mine[key] + val if key in mine else val
    if agg.samples:
        acc.samples.extend(agg.samples)
    if agg.max_count > acc.max_count:
        acc.max_count = agg.max_count
    return acc


def _accumulator():
    acc = MeanAggregate()
    acc.samples = PackedSamples()
    return acc


class _MergeAggregates(beam.CombineFn):

    def create_accumulator(self):
        return _accumulator()

    def add_input(self, acc, agg):
        return _merge_into(acc, agg)

    def merge_accumulators(self, accs):
        out = _accumulator()
        for a in accs:
            _merge_into(out, a)
        return out

    def extract_output(self, acc):
        return acc


def _plain(x):
    """A core output (float or d-array) as a float or a list of floats (JSON-serialisable)."""
    if isinstance(x, np.ndarray):
        return [float(v) for v in x.ravel()]
    return float(x)


class _LoggedSamples(dict):
    """The core's median sample store (``ContinualMeanCore.store``), its history in a
    :class:`~dp_beam.transforms.release.BagLog`.

    Holds this step's new samples; the samples of earlier steps are read
    from the log only when the core iterates the store (the step where a
    level activates and runs its private median, at most once per level).
    """

    def __init__(self, log, stored):
        super().__init__()
        self._log = log
        self._stored = stored   # log entries 1..stored hold the earlier steps' samples
        self.loaded = False

    def new_samples(self):
        """This step's samples as ``[(order key, index, x as a list)]`` (before any load)."""
        return self._new if self.loaded else [
            (key, i, x.tolist()) for key, samples in dict.items(self) for i, x in samples]

    def items(self):
        if not self.loaded:
            self._new = self.new_samples()
            self.clear()
            for entry in self._log.read(0, self._stored) + [self._new]:
                for key, i, x in entry:
                    self.setdefault(key, []).append((i, np.asarray(x, dtype=np.float64)))
            self.loaded = True
        return super().items()


class _MedianStoreInLog:
    """A :class:`ContinualMeanCore` (``preset="paper"``) whose sample store lives in a log.

    Algorithm 7's medians read each user's first samples, so the core keeps
    them until every level is active: with ``preset="paper"`` that store
    grew with the data (11 KB to 535 KB over 300 steps of 100 samples) and
    was rewritten at every firing. Here each step's new samples are appended
    once to the stream's append-only log (a ``BagState``), read back only at
    an activation, and dropped when the store is (all levels active); the
    rewritten state holds no samples.
    """

    def __init__(self, core, log, stored=0):
        self.core = core
        self._log = log
        self._stored = stored

    @property
    def t(self):
        return self.core.t

    def step(self, agg=None):
        core = self.core
        live = core.store is not None and self._stored is not None
        store = core.store = _LoggedSamples(self._log, self._stored or 0) if live else {}
        out = core.step(agg)
        if live:
            if core.store is store:
                # Consecutive log indices: one entry per step while the store lives.
                self._stored += 1
                self._log.append(self._stored, store.new_samples())
            else:
                # Every level is active: the samples are never read again.
                self._log.release_before(self._stored + 1)
                self._stored = None
        core.store = {}
        return out

    def to_state(self):
        state = self.core.to_state()
        state["store_entries"] = self._stored
        return state


class MeanReleaseSpec(ReleaseSpec):
    """Feeds per-step :class:`MeanAggregate` s to a :class:`ContinualMeanCore` per stream.

    With Algorithm 7's medians (``preset="paper"``) the samples they read
    go to the stream's log instead of the rewritten state
    (:class:`_MedianStoreInLog`, ``uses_log``).
    """

    def __init__(self, transform, step_seconds, params, lower, upper, horizon, ledger_template):
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = horizon
        self._params = params
        self._lower, self._upper = lower, upper
        self._ledger = ledger_template
        self.uses_log = bool(params.median_levels)

    def zero(self):
        return MeanAggregate()

    def merge(self, a, b):
        return a.merge(b)

    def events(self, aggregate):
        return int(aggregate.events)

    def new_mechanism(self, rng, first=None, log=None):
        core = ContinualMeanCore(self._params, self._lower, self._upper, self.horizon, rng)
        return core if log is None else _MedianStoreInLog(core, log)

    def restore(self, state, rng, log=None):
        if log is None:
            return ContinualMeanCore.from_state(self._params, state, self._lower, self._upper, rng)
        state = dict(state)
        stored = state.pop("store_entries", 0)
        core = ContinualMeanCore.from_state(self._params, state, self._lower, self._upper, rng)
        return _MedianStoreInLog(core, log, stored)

    def reseed(self, mechanism, rng, log=None):
        # In place when the core can swap its trees' sources (the same releases as the
        # round trip through the state, tested in tests/mechanisms/test_continual_mean.py).
        if log is None and isinstance(mechanism, ContinualMeanCore) and mechanism.can_swap_source():
            mechanism.set_noise_source(rng)
            return mechanism
        return super().reseed(mechanism, rng, **({} if log is None else {"log": log}))

    def release(self, mechanism, key, step, aggregate):
        out = mechanism.step(aggregate)
        yield MeanRelease(
            key=key, step=step, window_start=step * self.step_seconds,
            window_end=(step + 1) * self.step_seconds, value=_plain(out.estimate),
            noise_std=_plain(out.noise_std), ci95=_plain(out.ci95),
            mechanism=f"{MECHANISM}+{self._params.mechanism}",
            transform=self.transform, t=out.t, diverse=out.diverse,
            denominator=float(out.denominator), active_levels=tuple(out.active),
            neighbours=self._params.neighbours)

    def ledger(self, key):
        return [self._ledger._replace(key=key)]


def _positive_real(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
            value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class ContinualMean(beam.PTransform):
    """The mean of all users' samples, released every step, user-level private.

    Algorithm 6 of seed 003 (spec withhold_release_and_composition.md §2.9):
    each user's samples are released to tree B_ℓ in exponentially growing
    sums (§2.5), truncated around a per-level prior (private medians, §2.8,
    with ``preset="paper"``; the earlier release, rounded, with the default
    ``preset="tuned"``, whose untruncated levels take samples as they arrive), and
    the estimate is ``Σ_ℓ B_ℓ / N_t`` in the units of ``[lower, upper]``
    (§3.1); d-dimensional values per §3.3.

    Privacy: ε-DP for each user (``noise="laplace"``), or ρ-zCDP with
    ρ = ρ(ε, δ) and hence (ε, δ)-DP (``noise="gaussian"``), over the whole
    output sequence of all keys, under the neighbour relation ``neighbours``
    (see the module docstring): ``"participation"`` (default) or
    ``"values"``. Each key's ledger entry on ``.accounting`` states the whole
    per-user cost and the relation.

    Args:
      user_fn: element → user id (the privacy unit).
      value_fn: element → a real value, or a sequence of d reals; clamped to
        ``[lower, upper]`` per coordinate.
      lower, upper: public bounds: numbers (every coordinate) or sequences of
        length d; ``lower < upper``.
      max_samples_per_user: m, per key; a user's later samples go to ``.invalid``.
      epsilon: total privacy parameter per user over all keys (> 0).
      step: step length (seconds or ``timedelta``), epoch-aligned.
      key_fn: optional element → key; one mean stream per key.
      max_keys_per_user: k, the keys a user may contribute to (the first seen:
        arrival order when streaming, event-time order in batch); events under
        further keys go to ``.invalid``. Each key's stream runs at ε/k (needs
        ``key_fn`` when > 1).
      dim: d; ``None`` takes it from sequence bounds (else 1).
      max_users: n, the upper bound on users per stream used by the truncation
        widths (§2.9 eq. (9)) and, in the tuned preset, by the level plan that
        decides which levels truncate (``MeanParams.planned_error``). It
        affects accuracy only, never privacy; declare a bound close to the
        real number of users: a loose one plans truncation that needs more
        users than the stream has.
      beta: failure probability of the accuracy guarantee (§6 A6).
      noise, delta: ``"laplace"`` (pure ε) or ``"gaussian"`` (ρ-zCDP, needs
        ``delta``); ``None`` (default) means Gaussian when ``delta`` is given,
        else Laplace.
      preset: ``"tuned"`` (default) or ``"paper"`` (the spec's constants and
        Algorithm 7 medians, for reproducing seed 003); see
        :class:`dp_beam.mechanisms.continual_mean.MeanParams`. The medians
        read each user's first 2^{L−1} samples, kept until every level is
        active: (users seen before the last activation) · min(m, 2^{L−1}) · d
        numbers per stream, in an append-only ``BagState`` read back only at an
        activation (:class:`_MedianStoreInLog`), never in the state cell
        rewritten at every step.
      median_budget: ``"per_L"`` or ``"per_L_minus_1"`` (§6 A5; ``"paper"`` only).
      user_spread: tuned preset: a public bound, as a fraction of
        ``upper - lower``, on how far a user's own mean may lie from the
        common mean (default 0: users alike, the paper's i.i.d. model).
        Clipping widens by that much per sample, so users that differ are
        not clipped toward the common mean; declare it when users differ
        and the stream is large (``MeanParams`` "user spread").
      prior_ratio, prior_query: tuned preset: force the level plan's prior
        ratio θ (``math.inf``: no level takes a prior) and whether the prior
        query is asked (``True`` needs ``neighbours="values"``); ``None``
        (default) lets the plan choose from the declared configuration
        (``MeanParams`` "level plan", "prior query"; accuracy only).
      tree_levels: the tree depth of ``MeanParams.noise_scale`` (default
        ``h(max_users)``); reporting only, the trees take their depth from
        their horizon.
      horizon: steps per stream or ``None`` (unbounded trees, §1.6 U2).

      The parameters from ``beta`` to ``horizon`` are the fields of
      :class:`dp_beam.mechanisms.continual_mean.MeanConfig`, the same the
      engine-free ``ContinualMeanMechanism`` takes.
      start, end: the public schedule, as ``ContinualCount``: every stream
        releases every step from ``start`` (the first user does not start it)
        to ``end`` (required for bounded input unless ``horizon`` is given).
      keys: the public key set (with ``key_fn``), or
        ``dpb.PrivateKeys(..., max_keys_per_unit=max_keys_per_user)``; as
        ``ContinualCount``.
      timestamp_fn, allowed_lateness, late, transient_errors: as ``ContinualCount``.
      mechanism: the continual-counting mechanism of every level's tree (as in
        ``ContinualCount``); ``None`` picks the most accurate for the noise and
        horizon. Each tree is calibrated to the sum over steps of one
        user's changes to its input (``MeanParams.group_sensitivity``),
        which bounds the noise any linear counter needs.
      rng: ``None`` (production noise from ``noise_key``); tests only: an int
        seed or a ``NoiseSource``.
      noise_key: the secret key of every noise draw, as ``ContinualCount``.
      shards: as ``ContinualCount``; presets that keep median samples in a
        per-key log (``preset="paper"``) always release per key.

    Example (noise switched off to show the estimate):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms import ZeroNoise   # noise off: for the example only
    >>> events = [{"ts": float(t), "user": f"u{t % 10}", "delay": float(t % 5)} for t in range(30)]
    >>> mean = dpb.ContinualMean(user_fn=lambda e: e["user"], value_fn=lambda e: e["delay"],
    ...                          lower=0, upper=4, max_samples_per_user=4, epsilon=1.0, step=10,
    ...                          start=0, end=30, timestamp_fn=lambda e: e["ts"], neighbours="values",
    ...                          rng=ZeroNoise())
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(events) | mean
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, round(r.value, 3), r.diverse))
    0 2.0 True
    1 2.0 True
    2 2.0 True

    Two keys and 2-dimensional values (each key's stream at ε/2; the ledger
    entry of each key states two streams' worth, the user's whole cost):

    >>> events = [{"ts": float(t), "user": f"u{t % 6}", "grp": "ab"[t % 2],
    ...            "xy": [0.5 + t % 2, 3.0]} for t in range(20)]
    >>> mean = dpb.ContinualMean(user_fn=lambda e: e["user"], value_fn=lambda e: e["xy"],
    ...                          lower=0, upper=[2, 4], max_samples_per_user=4, epsilon=1.0,
    ...                          step=10, start=0, end=20, key_fn=lambda e: e["grp"], keys=["a", "b"],
    ...                          max_keys_per_user=2,
    ...                          timestamp_fn=lambda e: e["ts"], neighbours="values",
    ...                          rng=ZeroNoise())
    >>> stream_epsilon = mean.params.privacy_cost()["epsilon"]
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(events) | mean
    ...     ledger = out.accounting | beam.Map(
    ...         lambda e: ("ledger", e.key, e.scope, round(e.epsilon / stream_epsilon, 9)))
    ...     last = (out.releases | "last" >> beam.Filter(lambda r: r.step == 1)
    ...             | "values" >> beam.Map(lambda r: ("value", r.key, [round(v, 3) for v in r.value])))
    ...     _ = ((ledger, last) | beam.Flatten() | beam.combiners.ToList()
    ...          | beam.FlatMap(sorted) | beam.Map(print))
    ('ledger', 'a', 'key', 2.0)
    ('ledger', 'b', 'key', 2.0)
    ('value', 'a', [0.5, 3.0])
    ('value', 'b', [1.5, 3.0])
    """

    def __init__(self, user_fn: Callable[[Any], Any], value_fn: Callable[[Any], Any], lower: Any,
                 upper: Any, max_samples_per_user: int, epsilon: float, step: Any, *,
                 start: Any = None, end: Any = None, key_fn: Optional[Callable[[Any], Any]] = None,
                 keys: Any = None, max_keys_per_user: int = 1, dim: Optional[int] = None,
                 max_users: int = 1_000_000, timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 allowed_lateness: Any = datetime.timedelta(days=1), late: str = "defer",
                 rng: Any = None, noise_key: Any = None, transient_errors: Any = TRANSIENT_ERRORS,
                 shards: Optional[int] = None, label: Optional[str] = None, **params: Any) -> None:
        # `params`: the rest of MeanConfig's fields (beta, neighbours, noise, delta, preset,
        # median_budget, tree_levels, mechanism, horizon, prior_ratio, prior_query,
        # user_spread), the parameter list the engine-free mechanism takes too.
        check_keywords(type(self).__name__, params)
        horizon = params.get("horizon")
        super().__init__(label)
        self._transient = check_transient_errors(transient_errors)
        for name, fn in (("user_fn", user_fn), ("value_fn", value_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        for name, fn in (("timestamp_fn", timestamp_fn), ("key_fn", key_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        self._user_fn, self._value_fn, self._timestamp_fn = user_fn, value_fn, timestamp_fn
        self._key_fn = key_fn
        self._lower, self._upper, self._dim = resolve_bounds(lower, upper, dim)
        if (isinstance(max_keys_per_user, bool) or not isinstance(max_keys_per_user, int)
                or max_keys_per_user < 1):
            raise ValueError(f"max_keys_per_user must be an int >= 1, got {max_keys_per_user!r}")
        if key_fn is None and max_keys_per_user != 1:
            raise ValueError("max_keys_per_user > 1 needs key_fn (without keys there is one "
                             f"stream), got max_keys_per_user={max_keys_per_user!r}")
        self._max_keys = max_keys_per_user
        set_release_options(self, step, allowed_lateness, late, rng, start=start, end=end,
                            horizon=horizon, key_fn=key_fn, keys=keys,
                            noise_key=noise_key, shards=shards)
        selecting = private_keys(self)
        if selecting is not None and selecting.max_keys_per_unit != max_keys_per_user:
            raise ValueError(
                "PrivateKeys.max_keys_per_unit must equal max_keys_per_user (the keys a user may "
                f"contribute to), got max_keys_per_unit={selecting.max_keys_per_unit} and "
                f"max_keys_per_user={max_keys_per_user}")
        self._horizon = horizon
        epsilon = _positive_real("epsilon", epsilon)
        # The whole budget first: it validates every parameter with its name.
        config = mean_config(type(self).__name__, max_users=max_users,
                             max_samples_per_user=max_samples_per_user, epsilon=epsilon,
                             dim=self._dim, **params)
        whole = MeanParams(config)
        k = self._max_keys
        if k == 1:
            self._params = whole
        elif whole.noise == "laplace":
            self._params = MeanParams(dataclasses.replace(config, epsilon=epsilon / k))
        else:
            # zCDP adds up over the k streams: each gets ρ/k of the whole ρ(ε, δ).
            eps_k = eps_from_rho_delta(whole.rho_total / k, whole.delta)
            self._params = MeanParams(dataclasses.replace(config, epsilon=eps_k))

    @property
    def params(self):
        """The :class:`MeanParams` of each key's stream (ε/k of the whole when k > 1)."""
        return self._params

    @property
    def dim(self):
        return self._dim

    def cost(self) -> Cost:
        """The per-user cost over all keys: k times one stream's."""
        p, k = self._params, self._max_keys
        stream = p.privacy_cost()
        if p.noise == "laplace":
            return k * stream
        # zCDP composes the k streams (the ρ add); δ is the conversion's, not k·δ.
        rho = k * stream.rho
        return Cost.gaussian(rho, p.delta,
                             epsilon=eps_from_rho_delta(rho, p.delta) if k > 1 else stream.epsilon)

    def _neighbours(self):
        p = self._params
        if self._key_fn is None:
            return p.neighbours
        return (f"{p.neighbours}; a user's samples in at most {self._max_keys} key(s), "
                f"each key's stream at 1/{self._max_keys} of the budget")

    def plan_entry(self, label) -> LedgerEntry:
        """The ledger entry every stream (key) of this transform charges: the whole per-user cost."""
        p = self._params
        cost = self.cost()
        return LedgerEntry(
            transform=label, unit="user", neighbours=self._neighbours(),
            epsilon=float(cost["epsilon"]), delta=float(cost["delta"] or 0.0),
            rho=float(cost["rho"]), mechanism=f"{MECHANISM}+{p.mechanism}",
            scope="key" if self._key_fn is not None else "stream", key=None,
            sensitivity=float(p.tree_sensitivity(p.L)), noise=p.noise,
            calibration="zcdp" if p.noise == "gaussian" else "",
            max_contributions=p.m * self._max_keys,  # samples one user can have used, all keys
            # "participation" protects whether and when a user takes part: add/remove
            # one user; "values" takes the arrival pattern as public.
            relation="values" if p.neighbours == "values" else "add/remove")

    def expand(self, events):
        label = self.label
        schedule, declared, side = validation(self)
        prepared = events | "Validate" >> beam.ParDo(_PrepareMeanEvents(
            label, self._value_fn, self._user_fn, self._key_fn, self._timestamp_fn,
            self._lower, self._upper, schedule, declared, self._transient), **side).with_outputs(
                INVALID, main="valid")
        invalids = [prepared[INVALID]]
        stage = dict(transform=label, params=self._params, lower=self._lower, upper=self._upper,
                     step_micros=self._step_micros, max_keys=self._max_keys,
                     selecting=private_keys(self) is not None)
        users = prepared.valid | "UserWindow" >> beam.WindowInto(GlobalWindows())
        if events.is_bounded:
            # Batch: a user's events grouped and taken in event-time order; the
            # step is part of the key, so no event-time windows are needed.
            per_user = (users
                        | "PerUser" >> beam.GroupByKey()
                        | "WithholdRelease" >> beam.ParDo(_WithholdReleaseBatch(**stage))
                        .with_outputs(CAPPED, UNITS, main="aggregates"))
            aggregates = (per_user.aggregates
                          | "PerStep" >> beam.CombinePerKey(_MergeAggregates())
                          | "StepIndex" >> beam.ParDo(StepEnd(self._step_micros)))
        else:
            per_user = users | "WithholdRelease" >> beam.ParDo(
                _WithholdRelease(**stage)).with_outputs(CAPPED, UNITS, main="aggregates")
            # Unbounded lateness: the release applies `late` and `allowed_lateness`.
            aggregates = (per_user.aggregates
                          | "StepWindows" >> beam.WindowInto(
                              FixedWindows(self._step), allowed_lateness=UNBOUNDED_LATENESS)
                          | "PerStep" >> beam.CombinePerKey(_MergeAggregates())
                          | "StepIndex" >> beam.ParDo(StepOf(self._step_micros))
                          | "Rewindow" >> beam.WindowInto(GlobalWindows()))
        invalids.append(per_user[CAPPED] | "CountCapped" >> CountCapped(label, self._step))
        entry = self.plan_entry(label)
        spec = MeanReleaseSpec(label, self._step, self._params, self._lower, self._upper,
                               self._horizon, entry)
        return release_streams(self, events, aggregates, spec, entry, invalids,
                               units=per_user[UNITS], unit="user")
