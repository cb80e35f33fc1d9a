"""``IncrementalRegression``: a private linear model of the stream so far, released every step.

Seed 002, Kasiviswanathan, Nissim, Jin, *Private Incremental Regression*
(arXiv:1701.01093); privacy arguments in ``docs/privacy/regression.md``. Engine-free
mechanisms:
:mod:`dp_beam.mechanisms.regression` (``method="tree"``: PrivIncReg1,
``"projection"``: PrivIncReg2, ``"batch"`` (alias ``"rerun"``): PrivIncERM).

Shape (docs/design.md D2): every event is validated, clipped to
``‖x‖ <= 1``, ``|y| <= 1`` (public bounds; counted in the ``clipped`` metric)
and mapped in parallel to z = x, or ``z = clip(Φx/√m)`` for the projection
method; a per-step ``CombinePerKey`` (keyed by (key, step) in the global
window for bounded input) sums the encodings ``(svec(zzᵀ), z·y)``, a batch of
points at a time (exact sums: every coordinate is on a 2^-30 grid, so the
order of addition never changes a bit); the ordered release DoFn
(:class:`~dp_beam.transforms.release.OrderedReleaseDoFn`) feeds one sum per
step and stream to the mechanism, which releases one model per step, steps
without events included. The raw records are never kept: the state of a
stream is the counters' state (PrivIncReg1/2: at most ``11·(D + k)`` numbers
with the default BLT counter and an ``end``, 12·(D + k) without, D = k(k+1)/2
and k = d or m, whatever the number of steps; the tree: ``h·(D + k)``), plus
Φ (m·d) for the projection method, or, for PrivIncERM, the exact sums.

Privacy: each stream is (ε, δ)-DP for its whole output sequence under
**replacing one event by another in the same step and key** (002 Def. 4,
replace-one; the number of events per step is public). That is what the
ledger states (``relation="replace"``), so a budget stated for add/remove
neighbours counts nothing from it and a replace budget composes it as it is.
The step sums' sensitivities are √2 (Gram upper triangle) and 2 (x·y), see
:mod:`dp_beam.mechanisms.regression.moments`. Keys compose in parallel; a
key must be declared (``keys=[...]``): private key selection is stated for
add/remove neighbours and is refused.

Φ (projection method) is drawn at construction, before any data, from the
noise key (or the test seed): it is public (``transform.projection``) and is
shared by the keys' streams.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Callable, Optional, Sequence, Type, Union

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.utils.timestamp import Timestamp
from numpy.typing import ArrayLike

from dp_beam.mechanisms import ZeroNoise, make_noise
from dp_beam.mechanisms.noise import NoiseSource
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
from dp_beam.mechanisms.regression import (Constraint, L2Ball, PrivIncERM, PrivIncERMParams, PrivIncReg1,
                                           PrivIncReg1Params, PrivIncReg2, PrivIncReg2Params,
                                           check_constraint, clip_point, encode_points,
                                           project_features, svec_dim)
from dp_beam.records import LedgerEntry
from dp_beam.records_regression import RegressionRecord
from dp_beam.transforms.events import (INVALID, NAMESPACE, TRANSIENT_ERRORS, ValidatingDoFn,
                                       as_real, check_transient_errors)
from dp_beam.transforms.release_spec import ReleaseSpec
from dp_beam.transforms.steps import global_element, in_global_window, per_step
from dp_beam.transforms.stream_keys import KV
from dp_beam.transforms.streams import (private_keys, release_streams, set_release_options,
                                        validation)

__all__ = ["IncrementalRegression", "RegressionReleaseSpec", "RegressionRecord", "METHODS",
           "NEIGHBOURS"]

#: ``method=`` values: PrivIncReg1, PrivIncReg2, PrivIncERM ("rerun" is the name ``docs/design.md`` D1 uses).
METHODS = {"tree": PrivIncReg1, "projection": PrivIncReg2, "batch": PrivIncERM,
           "rerun": PrivIncERM}

NEIGHBOURS = ("replace one event by another in the same step and key (the number of events "
              "per step is public)")


#: Event times whose Timestamp the validation remembers (a cache; any bound works).
_STAMPS = 4096


def _square_is_finite(x: np.ndarray) -> bool:
    """Whether ``x @ x`` is finite; its overflow is the answer, not a warning for the log."""
    with np.errstate(over="ignore"):
        return math.isfinite(x @ x)


@beam.typehints.with_output_types(KV)
class _EncodePoints(ValidatingDoFn):
    """``(key, (z, y))`` per valid event, z and y clipped; bad elements to ``invalid`` with a reason.

    Features must be a sequence of ``dim`` finite reals and the label a finite
    real; both are clipped (‖x‖ <= 1, |y| <= 1) and counted in ``clipped``.
    With a projection Φ, z = clip(Φx/√m), else z = x. Nothing raises. The
    encoding ``(svec(zzᵀ), z·y)`` is left to the per-step combine, which does
    it for many points at once (:class:`_SumMoments`).

    ``step_micros`` (bounded input): the output is ``((key, step), (z, y))``
    instead, keyed by the step of the event time as a re-stamped element would
    have it, for :func:`~dp_beam.transforms.steps.per_step` with ``stepped``
    (one DoFn per event fewer, and no timestamp to build).
    """

    def __init__(self, transform, features_fn, label_fn, dim, projection=None, key_fn=None,
                 timestamp_fn=None, schedule=None, keys=None, transient_errors=TRANSIENT_ERRORS,
                 step_micros=None):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._step_micros = step_micros
        self._features_fn, self._label_fn = features_fn, label_fn
        self._dim = dim
        self._phi = None if projection is None else np.asarray(projection, dtype=np.float64)
        self._clipped = Metrics.counter(NAMESPACE, f"{transform}.clipped")
        self._stamps = {}

    def _stamp(self, ts):
        """``Timestamp.of(ts)``, remembered: events come in runs of equal times (flights
        at the same minute), and building a Timestamp cost a fifth of this DoFn."""
        stamp = self._stamps.get(ts)
        if stamp is None:
            if len(self._stamps) >= _STAMPS:
                self._stamps.clear()
            stamp = self._stamps[ts] = Timestamp.of(ts)
        return stamp

    def _feature_vector(self, element):
        """``(x, ‖x‖₂, None)`` with x a new finite float64 array, or ``(None, None, reason)``."""
        raw, err = self._call("features_fn", self._features_fn, element)
        if err:
            return None, None, err
        # A finite float64 vector of the right length passes every per-value check
        # of ``_features`` (which costs about as much as the rest of this DoFn).
        # hypot is finite exactly when every value is (inf wins over NaN) and the
        # sum of squares stays in range: one pass checks x and gives the norm.
        if type(raw) is np.ndarray and raw.dtype == np.float64 and raw.shape == (self._dim,):
            norm = math.hypot(*raw.tolist())
            if math.isfinite(norm):
                return raw.copy(), norm, None
        features, err = self._features(lambda _: raw, self._dim, element)
        if err:
            return None, None, err
        return np.array(features, dtype=np.float64), math.hypot(*features), None

    def _clip(self, x, norm, label):
        """``(x, y)`` as :func:`clip_point` gives them, from x's norm; counted in ``clipped``."""
        if norm > 1e150 and not _square_is_finite(x):
            # Huge finite values: scale before the norm. (x @ x overflows only
            # past 1.3e154, so below 1e150 the test needs no dot product.)
            x = x / np.max(np.abs(x))
            self._clipped.inc()
            x, y, clipped = clip_point(x, label)
        else:
            # clip_point's arithmetic on the norm computed already.
            y, clipped = label, False
            if norm > 1.0:
                x, clipped = x / norm, True
            if abs(y) > 1.0:
                y, clipped = math.copysign(1.0, y), True
        if clipped:
            self._clipped.inc()
        return x, y

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        ts, key, err = self._time_and_key(element, micros, declared)
        if err:
            yield self._reject(element, err, micros)
            return
        x, norm, err = self._feature_vector(element)
        if err:
            yield self._reject(element, err, micros)
            return
        raw_label, err = self._call("label_fn", self._label_fn, element)
        if err:
            yield self._reject(element, err, micros)
            return
        label, err = as_real(raw_label)
        if err:
            yield self._reject(element, f"label {err}", micros)
            return
        z, y = self._clip(x, norm, label)
        if self._phi is not None:
            z = project_features(self._phi, z)
        if self._step_micros is not None:
            # Timestamp(seconds) keeps int(seconds · 10^6) microseconds.
            yield (key, int(ts * 1_000_000) // self._step_micros), (z, y)
            return
        # The transform takes its input in the global window (expand), so the point is
        # placed there directly: what a TimestampedValue would give, without a WindowFn
        # assignment per event.
        yield global_element((key, (z, y)), self._stamp(ts))


class _SumMoments(beam.CombineFn):
    """``(Σ svec(zzᵀ), Σ z·y, count)`` of one step's clipped points ``(z, y)``.

    Points wait in the accumulator and are encoded :data:`BATCH` at a time
    (:func:`~dp_beam.mechanisms.regression.moments.encode_points`): encoding
    one point at a time cost more than the rest of the per-event work. The
    sums are exact (every encoding is on a 2^-30 grid), so batching, merging
    and retries never change a bit. ``compact`` encodes what waits before an
    accumulator is shuffled.
    """

    BATCH = 256

    def create_accumulator(self):
        return [None, None, 0, []]

    def _fold(self, acc):
        pending = acc[3]
        if pending:
            gram, xy = encode_points(np.array([z for z, _ in pending]), [y for _, y in pending])
            if acc[0] is None:
                acc[0], acc[1] = gram, xy
            else:
                acc[0] += gram
                acc[1] += xy
            acc[2] += len(pending)
            acc[3] = []
        return acc

    def add_input(self, acc, value):
        acc[3].append(value)
        if len(acc[3]) >= self.BATCH:
            self._fold(acc)
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            self._fold(acc)
            if acc[0] is None:
                continue
            if out[0] is None:
                out[0], out[1] = acc[0].copy(), acc[1].copy()
            else:
                out[0] += acc[0]
                out[1] += acc[1]
            out[2] += acc[2]
        return out

    def compact(self, acc):
        return self._fold(acc)

    def extract_output(self, acc):
        self._fold(acc)
        if acc[0] is None:
            return None
        return (acc[0], acc[1], acc[2])


class RegressionReleaseSpec(ReleaseSpec):
    """Feeds each step's sums to the stream's mechanism and emits its model."""

    def __init__(self, transform: str, step_seconds: float, mechanism_cls: type, params: Any,
                 ledger_template: LedgerEntry, projection: Optional[np.ndarray] = None) -> None:
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = None  # the schedule's end stops the streams
        self._cls = mechanism_cls
        self._params = params
        self._ledger = ledger_template
        self._projection = projection
        self._k = params.dim if projection is None else projection.shape[0]
        self._constraint = str(params.constraint)
        self._mechanism_name = ledger_template.mechanism

    def zero(self):
        return (np.zeros(svec_dim(self._k)), np.zeros(self._k), 0)

    def merge(self, a, b):
        if a is None:
            return b
        if b is None:
            return a
        return (np.asarray(a[0]) + b[0], np.asarray(a[1]) + b[1], int(a[2]) + int(b[2]))

    def events(self, aggregate):
        return 0 if aggregate is None else int(aggregate[2])

    def new_mechanism(self, rng, first=None):
        if self._projection is not None:
            return self._cls(self._params, rng=rng, projection=self._projection)
        return self._cls(self._params, rng=rng)

    def restore(self, state, rng):
        return self._cls.from_state(state, rng=rng)

    def reseed(self, mechanism, rng):
        # The same as the default state round trip, which cost about a fifth of
        # a release (the counters' states rebuilt at every step).
        if not hasattr(mechanism, "set_noise_source"):
            return super().reseed(mechanism, rng)
        mechanism.set_noise_source(rng)
        return mechanism

    def release(self, mechanism, key, step, aggregate):
        if aggregate is None:
            aggregate = self.zero()
        gram, xy, count = aggregate
        rel = mechanism.step(gram, xy, count)
        first = step - rel.t + 1
        covers = None if rel.covers == (0, 0) else (first + rel.covers[0] - 1,
                                                    first + rel.covers[1] - 1)
        yield RegressionRecord(
            key=key, step=step, window_start=step * self.step_seconds,
            window_end=(step + 1) * self.step_seconds, t=rel.t, n=rel.n,
            theta=rel.theta.tolist(), constraint=self._constraint, method=rel.method,
            solver=rel.solver, covers=covers, noise_std_gram=float(rel.noise_std_gram),
            noise_std_xy=float(rel.noise_std_xy), noise_std_model=float(rel.noise_std_model),
            alpha=float(rel.alpha), mechanism=self._mechanism_name, transform=self.transform)

    def ledger(self, key):
        return [self._ledger._replace(key=key)]


def _projection_source(rng, noise_key):
    """Where Φ comes from: the test seed (an int ``rng``), else the noise key (public draw)."""
    if isinstance(rng, int) and not isinstance(rng, bool):
        return make_noise(np.random.default_rng([rng, 0x0002]))
    return KeyedNoise(noise_key, ("dp_beam.IncrementalRegression", "projection"))


class IncrementalRegression(beam.PTransform):
    """A private least-squares model θ ∈ C of each stream's data so far, released every step (seed 002).

    ``method="tree"`` (default): PrivIncReg1, noisy running sums of x xᵀ
    (upper triangle) and x·y by a continual counter (BLT by default; the
    tree, 002's TreeMech, with ``counter="tree"``) and a solver of the noisy
    quadratic over C (``solver="exact"`` by default, ``"noisy_proj_grad"``
    for 002's NoisyProjGrad). Its error grows like √d.
    ``method="projection"``: PrivIncReg2, the same on ``u = clip(Φx/√m)`` in
    R^m and lifted back into C; it pays off for a constraint and data of small
    Gaussian width (an L1 ball and sparse x).
    ``method="batch"`` (or ``"rerun"``): PrivIncERM, a private ridge fit on
    all data every ``tau`` steps (a baseline; needs ``end``).

    Every stream is (ε, δ)-DP for the whole sequence of models, per event
    under replace-one neighbours (see the module docstring); ``.accounting``
    states it per key.

    Example (a test seed; production leaves ``rng=None``):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms.regression import L2Ball
    >>> test_seed = 3   # tests only; production leaves rng=None (secure noise)
    >>> points = [{"ts": float(t), "x": [(t * 7 % 10) / 10, 0.5], "y": 0.6 * (t * 7 % 10) / 10}
    ...           for t in range(40)]
    >>> reg = dpb.IncrementalRegression(
    ...     features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], dim=2, epsilon=1.0,
    ...     delta=1e-6, step=10, start=0, end=40, constraint=L2Ball(1.0),
    ...     timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(points) | reg
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.t, r.n, len(r.theta), r.covers))
    0 1 10 2 (0, 0)
    1 2 20 2 (0, 1)
    2 3 30 2 (0, 2)
    3 4 40 2 (0, 3)

    Args:
      features_fn: element → a sequence of ``dim`` finite reals (scaled by the
        caller with public constants; clipped to ‖x‖₂ <= 1).
      label_fn: element → a finite real (clipped to [−1, 1]).
      dim: d, the number of features.
      epsilon, delta: privacy parameters of every stream (δ in (0, 1): Gaussian noise).
      step: event-time step (seconds or ``timedelta``); one model per step.
      method: ``"tree"``, ``"projection"`` or ``"batch"``/``"rerun"``.
      constraint: ``L2Ball(radius)`` (default radius 1) or ``L1Ball(radius)``
        from :mod:`dp_beam.mechanisms.regression`.
      start, end: the public schedule, as ``ContinualCount`` (``end`` required
        for bounded input and for ``"batch"``); events outside go to ``.invalid``.
      key_fn, keys: optional keys (declared with ``keys=[...]``, one stream each).
      timestamp_fn: optional element → event time in epoch seconds.
      counter: ``"blt"`` (default) or ``"tree"``; calibration: ``"zcdp"`` or
        ``"analytic"``; split: ``"zcdp"`` (default) or ``"basic"`` (each sum
        (ε/2, δ/2), the paper's; regression.md R-5); solver: ``"exact"`` or ``"noisy_proj_grad"``.
      projection_dim, feature_width, expected_events: PrivIncReg2's m, or the
        public w(X) and expected record count of the rule for m (R-7).
      tau, lam, batch_noise: PrivIncERM's period (steps), ridge λ and noise
        (``"l2_laplace"`` or ``"gaussian"``).
      allowed_lateness, late, noise_key, transient_errors, label: as ``ContinualCount``.
      rng: ``None`` (production noise from ``noise_key``); tests only: an int
        seed or a ``NoiseSource``.
    """

    def __init__(self, features_fn: Callable[[Any], ArrayLike], label_fn: Callable[[Any], float],
                 dim: int, epsilon: float, delta: float, step: Union[float, datetime.timedelta], *,
                 method: str = "tree", constraint: Optional[Constraint] = None, start: Any = None,
                 end: Any = None, key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None, counter: str = "blt",
                 solver: str = "exact", calibration: str = "zcdp", split: str = "zcdp",
                 projection_dim: Optional[int] = None, feature_width: Optional[float] = None,
                 expected_events: Optional[int] = None, tau: Optional[int] = None,
                 lam: Optional[float] = None, batch_noise: str = "l2_laplace",
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        self._transient = check_transient_errors(transient_errors)
        self._check_functions(features_fn, label_fn, timestamp_fn, method)
        self._features_fn, self._label_fn = features_fn, label_fn
        self._key_fn, self._timestamp_fn = key_fn, timestamp_fn
        set_release_options(self, step, allowed_lateness, late, rng, start=start, end=end,
                            key_fn=key_fn, keys=keys, noise_key=noise_key)
        if private_keys(self) is not None:
            raise ValueError(
                "keys=PrivateKeys(...) is not available for IncrementalRegression: its neighbours "
                "replace one event, while private key selection is stated for adding or removing "
                "a unit; declare the keys (keys=[...])")
        constraint = L2Ball(1.0) if constraint is None else check_constraint(constraint)
        horizon = self._schedule.steps
        self._method = method
        self._cls = METHODS[method]
        common = dict(dim=dim, epsilon=epsilon, delta=delta, constraint=constraint)
        incremental = dict(horizon=horizon, counter=counter, solver=solver,
                           calibration=calibration, split=split)
        self._projection = None
        self._params = self._plan_params(method, common, incremental, horizon,
                                         projection_dim=projection_dim,
                                         feature_width=feature_width,
                                         expected_events=expected_events, tau=tau, lam=lam,
                                         batch_noise=batch_noise)
        self._probe = self._build_probe(method, rng)
        self._cost = self._probe.privacy_cost()

    @staticmethod
    def _check_functions(features_fn, label_fn, timestamp_fn, method):
        """``ValueError`` naming the first of the user functions or ``method`` that is invalid."""
        for name, fn in (("features_fn", features_fn), ("label_fn", label_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        if timestamp_fn is not None and not callable(timestamp_fn):
            raise ValueError(f"timestamp_fn must be callable, got {timestamp_fn!r}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, got {method!r}")

    @staticmethod
    def _plan_params(method, common, incremental, horizon, *, projection_dim, feature_width,
                     expected_events, tau, lam, batch_noise):
        """The validated parameters of ``method`` (their constructors raise ``ValueError``
        naming a bad one)."""
        if method == "tree":
            return PrivIncReg1Params(**common, **incremental)
        if method == "projection":
            return PrivIncReg2Params(**common, **incremental, projection_dim=projection_dim,
                                     feature_width=feature_width,
                                     expected_records=expected_events)
        if horizon is None:
            raise ValueError(f"end is required for method={method!r}: the number of batch runs "
                             "k = ceil(T/tau) over the T steps sets each run's budget")
        return PrivIncERMParams(**common, horizon=horizon, tau=tau, lam=lam, noise=batch_noise)

    def _build_probe(self, method, rng):
        """A noise-free mechanism of the planned parameters (drawing Φ first for the
        projection method)."""
        if method == "projection":
            m = self._params.resolved_projection_dim()
            source = _projection_source(rng, self._noise_key)
            self._projection = np.asarray(source.gaussian(1.0, m * self._params.dim),
                                          dtype=np.float64).reshape(m, self._params.dim)
            return PrivIncReg2(self._params, rng=ZeroNoise(), projection=self._projection)
        return self._cls(self._params, rng=ZeroNoise())

    @property
    def projection(self) -> Optional[np.ndarray]:
        """Φ of the projection method (public, drawn before any data), else ``None``."""
        return None if self._projection is None else self._projection.copy()

    @property
    def params(self):
        """The mechanism's public parameters (a frozen dataclass)."""
        return self._params

    def _mechanism_name(self) -> str:
        if self._method in ("batch", "rerun"):
            return f"{PrivIncERM.name}({self._params.noise})"
        return f"{self._cls.name}({self._params.counter})"

    def plan_entry(self, label) -> LedgerEntry:
        """The ledger entry every stream (key) of this transform charges."""
        if self._method in ("batch", "rerun"):
            noise, calibration = self._params.noise, ""
            sensitivity = 2.0  # |y − ⟨x, θ⟩|·‖x‖ terms; the per-run noise is in the records
        else:
            noise, calibration = "gaussian", self._params.calibration
            sensitivity = math.sqrt(2.0 + 4.0)  # joint (Gram, x·y) replace-one sensitivity
        return LedgerEntry(
            transform=label, unit="event", neighbours=NEIGHBOURS,
            epsilon=float(self._cost["epsilon"]), delta=float(self._cost["delta"]),
            rho=float(self._cost["rho"]), mechanism=self._mechanism_name(),
            scope="key" if self._key_fn is not None else "stream", key=None,
            sensitivity=sensitivity, noise=noise, calibration=calibration, relation="replace")

    def expand(self, events):
        label = self.label
        # The schedule decides the steps, not the input's windows (design D2.1).
        events = in_global_window(events, "EventWindow")
        schedule, declared, side = validation(self)
        bounded = events.is_bounded
        encoded = events | "Validate" >> beam.ParDo(_EncodePoints(
            label, self._features_fn, self._label_fn, self._params.dim, self._projection,
            self._key_fn, self._timestamp_fn, schedule, declared, self._transient,
            step_micros=self._step_micros if bounded else None),
            **side).with_outputs(INVALID, main="valid")
        invalids = [encoded[INVALID]]
        aggregates = per_step(encoded.valid, _SumMoments(), self._step, self._step_micros,
                              bounded, stepped=bounded)
        entry = self.plan_entry(label)
        spec = RegressionReleaseSpec(label, self._step, self._cls, self._params, entry,
                                     self._projection)
        return release_streams(self, events, aggregates, spec, entry, invalids)

