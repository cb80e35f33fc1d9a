"""``ContinualERM``, ``SlidingWindowERM``, ``MultiResolutionERM``: private models released over a stream.

``docs/privacy/erm.md`` (seed 004) and design D1.3 (mapping to
a streaming engine). Shape (docs/design.md D2): validate, clip and key
every event in parallel → per-step ``CombinePerKey`` collecting the step's
points in event-time fixed windows → one ordered release DoFn per stream
(:class:`~dp_beam.transforms.release.OrderedReleaseDoFn`) that feeds the points
of each step, in event-time order, to the engine-free stream of
:mod:`dp_beam.mechanisms.erm`. That stream cuts them into blocks of exactly
``block_size`` points and trains and releases models on its count-based
schedule, so a step may yield no model or several.

State (design D1.3, per-key state table and its notes): the stream's small state
(partial block, the O(log t) models it still regularises toward, counters) is
the one cell rewritten at every firing; every complete block goes once to an
append-only per-key log, a ``BagState``
(:class:`~dp_beam.transforms.bag_log.BagLog`), read back only in the firings
whose models train on older blocks. Blocks that fall out of every future
training are dropped from the log by a rewrite at most once per as many
released blocks as it keeps (amortised O(1) per point). So a firing writes
O(b0·d + log(t)·p) numbers plus the blocks it completes, whatever t; the
class docstrings say what each log retains.

Time in the mechanisms is the point count (E-1), so block boundaries are
count-triggered. That is private for *replace-one-event* neighbours, the
relation of seed 004 (E-1); under add/remove the release times would reveal the
count (design D1.3 "Counts as time"), which is why the ledger states the replace
relation.

Order within a step (which point goes to which block): points are sorted by
event time, and points with the same event time by a key that never depends
on their content. Had ties been broken by content (features, label), replacing
one point of a tie group could move it to the group's other end and shift
every later point across block boundaries, changing almost every later model
(tests/privacy/test_erm_ties.py: with 120 blocks of 4 tied points that order
changed the training data of all 119 ContinualERM models, the order below only
of the 2 trained on the replaced point; with one model per block at ε = 1 the
privacy loss at the outputs was 12.4, against 0.1). So:

* with ``id_fn``, ties are broken by ``(event time, id)``, the id being a
  public, immutable event id (an int, a finite float, a str, bytes or a tuple
  of these; anything else goes to ``.invalid``). A replacement keeps its
  event's timestamp, key and id, so every point keeps its position (events
  with equal ids are ordered by the tie-breaker below).
* without ``id_fn``, each point gets a 64-bit tie-breaker that is a keyed
  pseudo-random function (BLAKE2b under the transform's secret
  ``noise_key``) of (stream, event time, content, occurrence), where the
  occurrence numbers identical points of one step 0, 1, 2, ...; points are
  sorted by ``(event time, tie-breaker)``. To anyone without the key the
  tie-breakers of distinct inputs are independent uniform draws (identical
  points get distinct inputs through their occurrence, and their mutual
  order changes nothing), so the argument below is that of a random draw
  per point, independent of its content. The relation is
  replace-one *keeping timestamp and key*, so the tie-breakers of the two neighbours can be
  coupled (the same draw for every event): given the draws, both inputs
  reach the stream in the same order and differ in exactly one position,
  the replace-one neighbours the streams of :mod:`dp_beam.mechanisms.erm`
  are private for; the position of the replaced point is identically
  distributed under both, so mixing over the draws keeps ε. (Two equal
  64-bit draws in one step, probability below k²/2^65 for k tied points,
  keep the aggregate's order, which comes from the runner, not from content.)

Only points that share their event time (and id) with another point of the
step are ever compared by their tie-breaker, so only theirs is computed: the
order, and every release, is the one all tie-breakers would give.

The tie-breaker is computed in the release stage from the key and the step's
points, so it is replay-stable like the noise: a retried firing, a replay or
a re-run with the same ``noise_key`` on the same data orders the ties, and
hence releases the models, exactly as before.

Test modes (``rng`` an int seed or a ``NoiseSource``) need reproducible runs,
so there the tie-breaker is a hash of (seed, event time, features, class):
content-dependent, but only where the noise is not private anyway. Tests of
the production order inject tie-breakers or pass ``id_fn``.
"""

import collections
import datetime
from typing import Any, Callable, Dict, Optional, Sequence, Type, Union

import apache_beam as beam
import numpy as np
from numpy.typing import ArrayLike

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms import erm as erm_mech
from dp_beam.mechanisms.erm.config import field_names
from dp_beam.mechanisms.noise import NoiseSource
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import LedgerEntry
from dp_beam.records_erm import ModelRecord
from dp_beam.transforms.erm_points import (PackPoints, PointBatch, PreparePoints,
                                           PreparePointTotals)
from dp_beam.transforms.events import INVALID, TRANSIENT_ERRORS, check_transient_errors
from dp_beam.transforms.release_spec import ReleaseSpec, key_label
from dp_beam.transforms.steps import in_global_window, per_step
from dp_beam.transforms.streams import (private_keys, raw_steps, release_shards, release_streams,
                                        set_release_options, validation)

NEIGHBOURS = "replace one event (the event count per stream is public: blocks are count-triggered)"


def _order_key(point):
    """The release order of a step's points: ``(event time, (id, tiebreak))``, never their content.

    ``id`` is ``()`` without ``id_fn``; see
    :class:`~dp_beam.transforms.erm_points.PreparePoints` for the tie-breaker and
    the module docstring for why this order is private.
    """
    return point[0], point[1]


def _listify(value):
    return value.tolist() if hasattr(value, "tolist") else value


#: A step with at least this many points goes to the stream as one array (``extend``: one
#: clipping of all rows) instead of a push per point. Measured per row (d = 10): 4.5 µs by
#: ``clip_point``, 0.7 µs in an array of 64 rows and 9 µs in one of 2; the records are the
#: same either way (tests/transforms/test_erm.py).
_ARRAY_POINTS = 8


class ERMReleaseSpec(ReleaseSpec):
    """Feeds each step's points, in event-time order, to an engine-free ERM stream."""

    #: Complete blocks go to the per-key log (design D1.3), not the rewritten state.
    uses_log = True

    def __init__(self, transform: str, step_seconds: float, stream_cls: type,
                 stream_args: Dict[str, Any], ledger_template: LedgerEntry,
                 noise_key: Optional[NoiseKey] = None) -> None:
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = None
        self._cls = stream_cls
        self._args = stream_args
        self._ledger = ledger_template
        self._noise_key = noise_key
        self._class_index = {c: i for i, c in enumerate(stream_args.get("classes") or ())}

    def ordered(self, key, aggregate):
        """A step's points in release order: ``(ts, id, tiebreak)``, never their content.

        Production tie-breakers (``None`` from the first stage) are the keyed
        pseudo-random function of the module docstring: identical points of
        the step are numbered by occurrence, so every point gets its own input.
        """
        points, order = self._order(key, list(aggregate))
        return [points[i] for i in order]

    def _order(self, key, points):
        """``(points, positions)``: the points with their tie-breakers drawn, and their
        positions in release order (:meth:`ordered`)."""
        if points and any(p[1][1] is None for p in points):
            # The sort compares tie-breakers only within a group of equal (ts, id): a point
            # alone in its group keeps None (a keyed draw per point was most of the cost of
            # ordering a step without ties, the usual case).
            groups = collections.Counter((p[0], p[1][0]) for p in points)
            if len(groups) < len(points):
                seen = {}
                keyed = []
                for ts, (event_id, tiebreak), features, label in points:
                    if tiebreak is None and groups[ts, event_id] > 1:
                        content = (ts, tuple(features), self._class_index.get(label, -1))
                        occurrence = seen.get(content, 0)
                        seen[content] = occurrence + 1
                        tiebreak = self._noise_key.stream(
                            "erm.tiebreak", self.transform, key_label(key), *content,
                            occurrence).randbits(64)
                    keyed.append((ts, (event_id, tiebreak), features, label))
                points = keyed
        # Stable, as sorting the points themselves by their keys would be.
        return points, sorted(range(len(points)), key=lambda i: _order_key(points[i]))

    def zero(self):
        return []

    def merge(self, a, b):
        return list(a) + list(b)

    def events(self, aggregate):
        return len(aggregate)

    def new_mechanism(self, rng, first=None, log=None):
        return self._cls(rng=rng, log=log, **self._args)

    def restore(self, state, rng, log=None):
        return self._cls.from_state(state, rng=rng, log=log)

    def reseed(self, mechanism, rng, log=None):
        # In place when the stream keeps its log: the same releases as the round trip
        # through the state (tests/transforms/test_erm.py), which would otherwise rebuild
        # the config, the models and the buffer at every step.
        if log is None or log is mechanism.log:
            mechanism.set_noise_source(rng)
            return mechanism
        return super().reseed(mechanism, rng, log=log)

    def _batch_order(self, batch):
        """The release order of a :class:`PointBatch` read from its times and order keys
        alone, or None where a tie-breaker must be drawn (two points with the same event
        time and id, one without a tie-breaker): :meth:`_order` then reads the points' content.
        Without such a tie it is :meth:`_order`'s order, as it draws nothing then."""
        times, orders = batch.times(), batch.orders()
        pairs = list(zip(times, orders))
        if (any(order[1] is None for order in orders)
                and len({(ts, order[0]) for ts, order in pairs}) < len(pairs)):
            return None
        # Stable, as _order's sort of the same keys.
        return sorted(range(len(pairs)), key=pairs.__getitem__)

    def _feed(self, mechanism, key, aggregate):
        """The stream's releases on a step's points, fed to it in release order."""
        batch = type(aggregate) is PointBatch
        # A wide step's features stay in the batch's buffer: unpacking every row into a tuple
        # of floats only to sort the points took a sixth of the release at d = 100.
        order = self._batch_order(aggregate) if batch and len(aggregate) >= _ARRAY_POINTS else None
        if order is None:
            points, order = self._order(key, list(aggregate))
            if len(points) < _ARRAY_POINTS:
                return [rel for i in order for rel in mechanism.push(points[i][2], points[i][3])]
            if not batch:
                return mechanism.extend(np.array([points[i][2] for i in order], dtype=np.float64),
                                        [points[i][3] for i in order])
        labels = aggregate.labels()
        # Its rows are the points' features as float64, without a float object each.
        return mechanism.extend(aggregate.matrix()[order], [labels[i] for i in order])

    def release(self, mechanism, key, step, aggregate):
        bs = mechanism.block_size
        releases = self._feed(mechanism, key, aggregate)
        for rel in releases:
            # The stream's loss has the release's shape: one unpack, not one per field.
            weights, intercept = mechanism.loss.unpack(rel.params)
            yield ModelRecord(
                key=key, step=step, window_start=step * self.step_seconds,
                window_end=(step + 1) * self.step_seconds, t=rel.t, kind=rel.kind,
                level=rel.level, weights=_listify(weights), intercept=_listify(intercept),
                classes=tuple(rel.classes), trained_on=tuple(rel.trained_on),
                blocks=(rel.trained_on[0] // bs, rel.trained_on[1] // bs),
                data_window=tuple(rel.window), depends_on=tuple(rel.depends_on),
                regulariser=rel.regulariser, noise=rel.noise, noise_scale=float(rel.noise_scale),
                noise_std=float(rel.noise_std), call_epsilon=rel.call_epsilon,
                call_rho=float(rel.call_rho), mechanism=mechanism.name, transform=self.transform)

    def ledger(self, key):
        return [self._ledger._replace(key=key)]


class _ERMTransform(beam.PTransform):
    """Common construction: validation of every parameter, the plan, the pipeline."""

    _stream_cls = None

    def __init__(self, features_fn, label_fn, step, model, *, start=None, end=None, key_fn=None,
                 keys=None, timestamp_fn=None, id_fn=None,
                 allowed_lateness=datetime.timedelta(days=1), late="defer", rng=None,
                 noise_key=None, transient_errors=TRANSIENT_ERRORS, shards=None, label=None):
        # `model`: the keyword arguments of the stream's config (the public class's
        # parameters that are fields of `_stream_cls.config_cls`).
        super().__init__(label)
        self._transient = check_transient_errors(transient_errors)
        for name, fn in (("features_fn", features_fn), ("label_fn", label_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        for name, fn in (("key_fn", key_fn), ("timestamp_fn", timestamp_fn), ("id_fn", id_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        self._features_fn, self._label_fn = features_fn, label_fn
        self._id_fn = id_fn
        self._key_fn, self._timestamp_fn = key_fn, timestamp_fn
        set_release_options(self, step, allowed_lateness, late, rng, start=start, end=end,
                            key_fn=key_fn, keys=keys, noise_key=noise_key, shards=shards)
        if private_keys(self) is not None:
            raise ValueError(
                "keys=PrivateKeys(...) is not available for ERM streams: their neighbours replace "
                "one event and their blocks are count-triggered, while private key selection is "
                "stated for adding or removing a unit; declare the keys (keys=[...])")
        # The engine-free stream's config checks every model parameter (ValueError naming it).
        self._config = self._stream_cls.config_cls(**model)
        self._args = self._config.to_dict()
        probe = self._stream_cls.from_config(self._config, rng=ZeroNoise())
        self._probe = probe
        self._cost = probe.privacy_cost()

    @property
    def config(self) -> erm_mech.ERMConfig:
        """The validated parameters of every stream (an :class:`~dp_beam.mechanisms.erm.ERMConfig`)."""
        return self._config

    @property
    def stream(self):
        """A noise-free probe of the engine-free stream: its public parameters and noise scales."""
        return self._probe

    def plan_entry(self, label) -> LedgerEntry:
        """The ledger entry every stream (key) of this transform charges."""
        probe = self._probe
        return LedgerEntry(
            transform=label, unit="event", neighbours=NEIGHBOURS,
            epsilon=float(self._cost["epsilon"]), delta=float(self._cost["delta"] or 0.0),
            rho=float(self._cost["rho"]), mechanism=probe.name,
            scope="key" if self._key_fn is not None else "stream", key=None,
            sensitivity=2.0 * probe.loss.lipschitz / probe.lam, noise=probe.noise,
            calibration="zcdp" if probe.noise == "gaussian" else "",
            # Count-triggered blocks: private for replacing one event only (the count is public).
            relation="replace")

    def expand(self, events):
        label = self.label
        probe = self._probe
        # The schedule decides the steps, not the input's windows (design D2.1).
        events = in_global_window(events, "EventWindow")
        schedule, declared, side = validation(self)
        args = (label, self._features_fn, self._label_fn, probe.loss.n_features,
                probe.loss.classes, probe.loss.feature_bound, self._key_fn, self._timestamp_fn,
                schedule, declared)
        options = dict(id_fn=self._id_fn, reproducible=self._seed is not None,
                       seed=self._seed if isinstance(self._seed, int) else None,
                       transient_errors=self._transient)
        entry = self.plan_entry(label)
        spec = ERMReleaseSpec(label, self._step, self._stream_cls, self._args, entry,
                              self._noise_key)
        if raw_steps(self, events):
            # The sharded release of bounded input groups per shard anyway: each bundle's
            # points go there gathered per (key, step), merged by the release.
            prepared = events | "Validate" >> beam.ParDo(PreparePointTotals(
                *args, step_micros=self._step_micros, shards=release_shards(self, events),
                **options), **side).with_outputs(INVALID, main="valid")
            return release_streams(self, events, prepared.valid, spec, entry,
                                   [prepared[INVALID]], combine_fn=PackPoints(),
                                   markers_aside=True)
        prepared = events | "Validate" >> beam.ParDo(PreparePoints(*args, **options),
                                                     **side).with_outputs(INVALID, main="valid")
        # Combiner lifting compacts each bundle's partial lists: wide ones cross the grouping
        # packed, as on the sharded path.
        aggregates = per_step(prepared.valid, PackPoints(), self._step, self._step_micros,
                              events.is_bounded)
        return release_streams(self, events, aggregates, spec, entry, [prepared[INVALID]])


#: Parameters of the public ERM transforms passed to :class:`_ERMTransform` by position.
_POSITIONAL = frozenset(("self", "__class__", "features_fn", "label_fn", "step"))


def _split(config_cls, arguments):
    """``(model, options)``: a public ERM transform's arguments that are fields of its stream's
    config, and the transform's own options, forwarded to :class:`_ERMTransform`.

    The public classes spell out their signatures, with the config's defaults,
    so that a misspelled keyword is reported against them and ``help()`` shows
    every option."""
    fields = set(field_names(config_cls))
    model = {k: v for k, v in arguments.items() if k in fields}
    options = {k: v for k, v in arguments.items() if k not in fields and k not in _POSITIONAL}
    return model, options


# The public classes' model defaults are their configs', so signature and config cannot drift.
_CONTINUAL = erm_mech.ContinualERMConfig
_SLIDING = erm_mech.SlidingWindowERMConfig
_MULTIRES = erm_mech.MultiResolutionERMConfig

_COMMON_ARGS = """
    Args:
      features_fn: element → a sequence of ``n_features`` finite reals (a list, a tuple
        or a 1-D NumPy array of floats or ints, which is read in one call).
      label_fn: element → one of ``classes``.
      classes: the public list of labels (2: binary logistic; K >= 3: softmax).
      n_features: d.
      feature_bound: R_x; feature vectors are scaled down to ``‖x‖₂ <= R_x``
        (counted in the ``clipped`` metric). The Lipschitz constant comes from
        it (erm.md E-2), never from the data.
      lam: λ of the regulariser ``λ‖θ − θ_ref‖²``.
      epsilon: privacy parameter of every stream (> 0).
      block_size: points per block (b0 / w0 / B).
      step: event-time step (seconds or ``timedelta``) at which points are
        handed to the mechanism, in event-time order; models are released when
        blocks complete, not at every step.
      start, end: the public schedule, as ``ContinualCount`` (``end`` required
        for bounded input); points outside it go to ``.invalid``.
      key_fn: optional element → key; one independent stream per key (parallel
        composition: each event feeds one key). Needs ``keys``.
      keys: the public key set (an iterable or a bounded PCollection); points of
        other keys go to ``.invalid``. Private key selection is not offered:
        it is stated for add/remove neighbours, these streams for replace-one.
      timestamp_fn: optional element → event time, as ``ContinualCount``.
      id_fn: optional element → a public, immutable event id (an int, a
        finite float, a str, bytes or a tuple of these; other values go to
        ``.invalid``) that orders events with the same event time. Without
        it such ties are broken at random, independently of the events'
        content (see the module docstring: either way a point's position in
        the stream does not depend on its content).
      fit_intercept: append a constant feature (regularised like the weights).
      noise: ``"l2_laplace"`` (default, pure ε), ``"coord_laplace_l1"`` (pure
        ε) or ``"gaussian"`` (needs ``delta``; ρ-zCDP).
      allowed_lateness, late: as ``ContinualCount``.
      noise_key: the secret key of every noise draw, as ``ContinualCount``.
      transient_errors: exception types of the user functions re-raised for the
        runner to retry the bundle, as ``ContinualCount``; every other
        exception sends the element to ``.invalid``.
      tol_fraction: the solver's tolerance as a fraction of the noise scale
        (see :class:`dp_beam.mechanisms.erm.OutputPerturbation`).
      shards: how bounded input is released. ``None`` (default): one shard
        per 64 declared keys, at least one (0 when the key set is not known
        at construction: a ``PCollection`` of keys, private selection). 0: one
        stateful key (and timer) per stream. n > 0: streams go to n shards by
        a public hash of the key, each shard's grouped input released in one
        pass without state or timers, each stream's log held in memory for
        that pass; the records are those of ``shards=0``. Streaming input
        always releases one stateful key per stream (its log in a
        ``BagState``).
      label: the transform's label.
      rng: ``None`` (production noise from ``noise_key``); tests only: an int seed or a ``NoiseSource``
        (then ties without ``id_fn`` are broken by a hash of the seed and the
        point, so runs repeat; not private, like the test noise).
"""


class ContinualERM(_ERMTransform):
    __doc__ = """Cumulative private models released every ``block_size`` points (Alg. 2 bases + Alg. 4; erm.md E-6).

    A base model on all data at t = 2^k·B, doubling updates at t_g + 2^j·b0
    and single-block updates in between, each regularised toward a released
    model. ε is split in halves between the base models and the updates, so
    every stream is ε-DP per event (replace-one neighbours). ``base_size`` is
    B, a multiple of ``block_size`` = b0. See
    :class:`dp_beam.mechanisms.erm.ContinualERMMechanism`; the model parameters
    are the fields of :class:`dp_beam.mechanisms.erm.ContinualERMConfig` (:attr:`config`).

    State per key (design D1.3): each firing rewrites the partial block (< b0 points),
    at most 2 models (f_g, f_c) and counters — O(b0·d + p) numbers — and
    appends its completed blocks to the key's log. The log keeps the whole
    history (inherent: the base at 2^k·B trains on (0, t]) and is read back
    only in firings with a base or doubling release.

    Example (a test seed; production leaves ``rng=None``):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> test_seed = 3   # tests only; production leaves rng=None (secure noise)
    >>> points = [{"ts": float(t), "x": [(t * 7 % 10) / 10, (t * 3 % 10) / 10],
    ...            "y": int(t * 7 % 10 > 4)} for t in range(40)]
    >>> erm = dpb.ContinualERM(
    ...     features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=8, base_size=16,
    ...     step=10, start=0, end=40,
    ...     timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(points) | erm
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.kind, len(r.weights)))
    1 base 2
    2 doubling 2
    3 base 2
    3 doubling 2
    """ + _COMMON_ARGS + """      base_size: B.
    """

    _stream_cls = erm_mech.ContinualERMMechanism

    def __init__(self, features_fn: Callable[[Any], ArrayLike], label_fn: Callable[[Any], Any],
                 classes: Sequence[Any], n_features: int, feature_bound: float, lam: float,
                 epsilon: float, block_size: int, base_size: int,
                 step: Union[float, datetime.timedelta], *, start: Any = None, end: Any = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 id_fn: Optional[Callable[[Any], Any]] = None,
                 fit_intercept: bool = _CONTINUAL.fit_intercept, noise: str = _CONTINUAL.noise,
                 delta: Optional[float] = _CONTINUAL.delta,
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 tol_fraction: float = _CONTINUAL.tol_fraction, shards: Optional[int] = None,
                 label: Optional[str] = None) -> None:
        model, options = _split(_CONTINUAL, locals())
        super().__init__(features_fn, label_fn, step, model, **options)


class SlidingWindowERM(_ERMTransform):
    __doc__ = """A private model of the last ``window`` points, every ``block_size`` points (Alg. 5; erm.md E-7).

    Exact for ``window = (2^k − 1)·block_size``; ``window_policy`` =
    ``"round_down"`` or ``"general"`` handles other windows as erm.md E-7 says.
    Each stream is ε-DP per event. See :class:`dp_beam.mechanisms.erm.SlidingWindowERMMechanism`;
    the model parameters are the fields of
    :class:`dp_beam.mechanisms.erm.SlidingWindowERMConfig` (:attr:`config`).

    State per key (design D1.3): each firing rewrites the partial block (< w0 points)
    and one model per bucket (log₂(W + 1) models for W = w/w0 blocks in exact
    mode) — O(w0·d + log(W)·p) numbers — and appends its completed blocks to
    the key's log. The log keeps the W − 1 newest blocks (the part of the next
    window already seen; the bag itself holds fewer than 2(W − 1) blocks after
    every firing, as released blocks are dropped by a rewrite once they are as
    many as the kept ones) and is read back in firings that train a bucket
    older than the new block (even offsets and refreshes).

    Example (a test seed; production leaves ``rng=None``):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> test_seed = 3   # tests only; production leaves rng=None (secure noise)
    >>> points = [{"ts": float(t), "x": [(t * 7 % 10) / 10, (t * 3 % 10) / 10],
    ...            "y": int(t * 7 % 10 > 4)} for t in range(40)]
    >>> erm = dpb.SlidingWindowERM(
    ...     features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=8, window=24,
    ...     step=10, start=0, end=40,
    ...     timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(points) | erm
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.kind, len(r.weights)))
    2 left 2
    3 right 2
    3 left 2
    """ + _COMMON_ARGS + """      window: w, in points.
      window_policy: ``"exact"`` (default), ``"round_down"`` or ``"general"``.
    """

    _stream_cls = erm_mech.SlidingWindowERMMechanism

    def __init__(self, features_fn: Callable[[Any], ArrayLike], label_fn: Callable[[Any], Any],
                 classes: Sequence[Any], n_features: int, feature_bound: float, lam: float,
                 epsilon: float, block_size: int, window: int,
                 step: Union[float, datetime.timedelta], *, window_policy: str = _SLIDING.window_policy,
                 start: Any = None, end: Any = None, key_fn: Optional[Callable[[Any], Any]] = None,
                 keys: Any = None, timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 id_fn: Optional[Callable[[Any], Any]] = None,
                 fit_intercept: bool = _SLIDING.fit_intercept, noise: str = _SLIDING.noise,
                 delta: Optional[float] = _SLIDING.delta,
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 tol_fraction: float = _SLIDING.tol_fraction, shards: Optional[int] = None,
                 label: Optional[str] = None) -> None:
        model, options = _split(_SLIDING, locals())
        super().__init__(features_fn, label_fn, step, model, **options)


class MultiResolutionERM(_ERMTransform):
    __doc__ = """Models on the last 2^k·B points for every scale k with 2^k | t/B (Alg. 2; erm.md E-5).

    Each stream is ε-DP per event. ``max_scale`` caps k. See
    :class:`dp_beam.mechanisms.erm.MultiResolutionERMMechanism`; the model parameters
    are the fields of :class:`dp_beam.mechanisms.erm.MultiResolutionERMConfig` (:attr:`config`).

    State per key (design D1.3): each firing rewrites the partial block (< B points) and
    counters — O(B·d) numbers, no models — and appends its completed blocks to
    the key's log. With ``max_scale`` = K the log keeps the blocks of the
    current aligned interval of 2^K blocks (< 2^K·B points; cleared, unread,
    when the interval completes); without a cap the whole history (the
    scale-k model at 2^k·B trains on all of it). It is read back in firings
    that complete an even block (scale 1 and up).

    Example (a test seed; production leaves ``rng=None``):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> test_seed = 3   # tests only; production leaves rng=None (secure noise)
    >>> points = [{"ts": float(t), "x": [(t * 7 % 10) / 10, (t * 3 % 10) / 10],
    ...            "y": int(t * 7 % 10 > 4)} for t in range(40)]
    >>> erm = dpb.MultiResolutionERM(
    ...     features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=8, step=10, start=0, end=40,
    ...     timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(points) | erm
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.kind, len(r.weights)))
    0 scale 2
    1 scale 2
    1 scale 2
    2 scale 2
    3 scale 2
    3 scale 2
    3 scale 2
    3 scale 2
    """ + _COMMON_ARGS + """      max_scale: optional cap on k.
    """

    _stream_cls = erm_mech.MultiResolutionERMMechanism

    def __init__(self, features_fn: Callable[[Any], ArrayLike], label_fn: Callable[[Any], Any],
                 classes: Sequence[Any], n_features: int, feature_bound: float, lam: float,
                 epsilon: float, block_size: int, step: Union[float, datetime.timedelta], *,
                 max_scale: Optional[int] = _MULTIRES.max_scale, start: Any = None, end: Any = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 id_fn: Optional[Callable[[Any], Any]] = None,
                 fit_intercept: bool = _MULTIRES.fit_intercept, noise: str = _MULTIRES.noise,
                 delta: Optional[float] = _MULTIRES.delta,
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 tol_fraction: float = _MULTIRES.tol_fraction, shards: Optional[int] = None,
                 label: Optional[str] = None) -> None:
        model, options = _split(_MULTIRES, locals())
        super().__init__(features_fn, label_fn, step, model, **options)


__all__ = ["ContinualERM", "SlidingWindowERM", "MultiResolutionERM", "ERMReleaseSpec", "ModelRecord"]
