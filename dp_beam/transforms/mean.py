"""``ContinualMean``: a user-level mean released every step (seed 003, Algorithm 6).

Shape (docs/design.md D1.2, D2; docs/privacy/mean.md M-2, M-3): validate and
clamp every event in parallel (:mod:`.mean_users`) → the per-user
withhold-release schedule (one per key the user may touch, the cap m, and the
projection of every released element for every candidate prior;
:mod:`.mean_users`) → per-step ``CombinePerKey`` of fixed-size aggregates
(:mod:`.mean_aggregates`) → one ordered release DoFn per stream running the core
of Algorithm 6 (the L+1 trees, the medians, the count tree under participation,
and the estimate). Unbounded input keeps each user's schedules in one Beam state
cell (O(k·d) numbers per user) and places aggregates in event-time fixed
windows; bounded input groups each user's events (``GroupByKey``, each bundle's
events gathered per user first), runs the schedule in event-time order and keys
the combine by (key, step), because on the batch runners a state cell per user
cost more than the schedule itself (``benchmarks/mean_throughput.py``). With the
sharded release of bounded input the combine is that of the release itself: each
bundle's aggregates are merged per (key, step) where they are made and merged
across bundles in the shard's grouping (:class:`.mean_users.WithholdReleaseTotals`),
the same sums as the ``CombinePerKey``. Bounded input's per-user stage also turns a
user's events beyond a cap into their dead letters itself (it holds all of them), the
records the streaming path's :class:`.CountCapped` grouping makes.

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

Keys (``key_fn=``; docs/privacy/mean.md M-9, M-11; AC-2, AC-3)
    One mean stream per key of the public key set (``keys=[...]``), or per key
    admitted by private key selection (``keys=dpb.PrivateKeys(...)``, with
    ``max_keys_per_unit`` = ``max_keys_per_user``). Parallel composition over keys would need every
    user's samples to fall under a single key; a user who may appear under
    several keys (an aircraft flying for two carriers) touches several streams,
    which compose sequentially for that user. So each user keeps at most
    ``max_keys_per_user`` = k keys (default 1), the first of theirs seen;
    events under further keys go to ``.invalid`` ("max_keys_per_user
    exceeded"). "First" is arrival order in a streaming run and event-time
    order in batch, ties between a user's events of the same event time broken
    by key and value, so that a batch rerun keeps the same keys and samples (a
    streaming run's arrival order may differ between runs, whatever the event
    times). The privacy argument holds for any order: the
    choice for a user is made from that user's own events only, and afterwards
    the user touches at most k streams with at most m samples in each. Each stream is calibrated
    at ε/k (Laplace; with Gaussian noise at ρ/k, ρ = ρ(ε, δ)), so a user's
    total over the k streams it may touch is at most the transform's ε. Every key's ledger entry
    states that total (k times the stream's own cost), which makes the
    parallel composition of ``CombineAccounting`` (the maximum over a
    transform's keys) report the right per-user charge. Under ``"values"`` the
    key of an event is part of the public arrival pattern, like its time.

Vector values (M-4, M-6, M-7)
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
from typing import Any, Callable, Optional, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import FixedWindows, GlobalWindows

from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms.calibration import eps_from_rho_delta
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanAggregate, MeanConfig,
                                               MeanLockstep, MeanParams)
from dp_beam.records import LedgerEntry
from dp_beam.records_mean import MeanRelease
from dp_beam.transforms.contributions import CountCapped
from dp_beam.transforms.events import (CAPPED, INVALID, TRANSIENT_ERRORS, UNBOUNDED_LATENESS,
                                       check_transient_errors)
from dp_beam.transforms.keys import UNITS
from dp_beam.transforms.mean_aggregates import (MedianStoreInLog, MergeAggregates, PackedSamples,
                                                plain)
from dp_beam.transforms.mean_users import (PrepareMeanEvents, PrepareMeanEventsBatch,
                                           WithholdRelease, WithholdReleaseBatch,
                                           WithholdReleaseTotals)
from dp_beam.transforms.release_spec import ReleaseSpec
from dp_beam.transforms.steps import StepEnd, StepOf, in_global_window
from dp_beam.transforms.streams import (private_keys, raw_steps, release_shards, release_streams,
                                        set_release_options, validation)

__all__ = ["ContinualMean", "MeanReleaseSpec", "MECHANISM", "PackedSamples", "resolve_bounds"]

MECHANISM = "withhold_release_mean"

#: The fields of :class:`MeanConfig` that :class:`ContinualMean` passes on as given; the
#: others (max_users, max_samples_per_user, epsilon, dim) it checks or resolves first.
_CONFIG_KEYWORDS = frozenset(field.name for field in dataclasses.fields(MeanConfig)) - {
    "max_users", "max_samples_per_user", "epsilon", "dim"}


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


def resolve_bounds(lower: Any, upper: Any,
                   dim: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray, int]:
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


class MeanReleaseSpec(ReleaseSpec):
    """Feeds per-step :class:`MeanAggregate` s to a :class:`ContinualMeanCore` per stream.

    With Algorithm 7's medians (``preset="paper"``) the samples they read
    go to the stream's log instead of the rewritten state
    (:class:`MedianStoreInLog`, ``uses_log``).
    """

    def __init__(self, transform, step_seconds, params, lower, upper, horizon, ledger_template):
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = horizon
        self._params = params
        self._lower, self._upper = lower, upper
        self._ledger = ledger_template
        self.uses_log = bool(params.median_levels)
        self._mechanism = f"{MECHANISM}+{params.mechanism}"

    def zero(self):
        return MeanAggregate()

    def merge(self, a, b):
        return a.merge(b)

    def events(self, aggregate):
        return int(aggregate.events)

    def new_mechanism(self, rng, first=None, log=None):
        core = ContinualMeanCore(self._params, self._lower, self._upper, self.horizon, rng)
        return core if log is None else MedianStoreInLog(core, log)

    def restore(self, state, rng, log=None):
        if log is None:
            return ContinualMeanCore.from_state(self._params, state, self._lower, self._upper, rng)
        state = dict(state)
        stored = state.pop("store_entries", 0)
        core = ContinualMeanCore.from_state(self._params, state, self._lower, self._upper, rng)
        return MedianStoreInLog(core, log, stored)

    def reseed(self, mechanism, rng, log=None):
        # In place when the core can swap its trees' sources (the same releases as the
        # round trip through the state, tested in tests/mechanisms/test_continual_mean.py).
        if log is None and isinstance(mechanism, ContinualMeanCore) and mechanism.can_swap_source():
            mechanism.set_noise_source(rng)
            return mechanism
        return super().reseed(mechanism, rng, **({} if log is None else {"log": log}))

    def release(self, mechanism, key, step, aggregate):
        return (self._record(key, step, mechanism.step(aggregate)),)

    def lockstep(self, mechanisms):
        # Streams without a log (the tuned preset's, or any without medians) step their
        # trees together; a stream whose medians read a log steps on its own.
        return MeanLockstep(mechanisms) if MeanLockstep.eligible(mechanisms) else None

    def release_lockstep(self, lockstep, keys, step, aggregates, sources):
        outs = lockstep.step(aggregates, sources)
        return [self._record(key, step, out) for key, out in zip(keys, outs)]

    def _record(self, key, step, out):
        return MeanRelease(
            key=key, step=step, window_start=step * self.step_seconds,
            window_end=(step + 1) * self.step_seconds, value=plain(out.estimate),
            noise_std=plain(out.noise_std), ci95=plain(out.ci95),
            mechanism=self._mechanism,
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

    Algorithm 6 of seed 003 (arXiv:2212.09980; docs/privacy/mean.md):
    each user's samples are released to tree B_ℓ in exponentially growing
    sums (M-2), truncated around a per-level prior (private medians, M-6,
    with ``preset="paper"``; the earlier release, rounded, with the default
    ``preset="tuned"``, whose untruncated levels take samples as they arrive), and
    the estimate is ``Σ_ℓ B_ℓ / N_t`` in the units of ``[lower, upper]``
    (post-processing); d-dimensional values per M-4.

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
        widths (eq. (9) of the paper) and, in the tuned preset, by the level plan that
        decides which levels truncate (``MeanParams.planned_error``). It
        affects accuracy only, never privacy; declare a bound close to the
        real number of users: a loose one plans truncation that needs more
        users than the stream has.
      beta: failure probability of the accuracy guarantee (never privacy, M-7).
      noise, delta: ``"laplace"`` (pure ε) or ``"gaussian"`` (ρ-zCDP, needs
        ``delta``); ``None`` (default) means Gaussian when ``delta`` is given,
        else Laplace.
      preset: ``"tuned"`` (default) or ``"paper"`` (the paper's constants and
        Algorithm 7 medians, for reproducing seed 003); see
        :class:`dp_beam.mechanisms.continual_mean.MeanParams`. The medians
        read each user's first 2^{L−1} samples, kept until every level is
        active: (users seen before the last activation) · min(m, 2^{L−1}) · d
        numbers per stream, in an append-only ``BagState`` read back only at an
        activation (:class:`MedianStoreInLog`), never in the state cell
        rewritten at every step.
      median_budget: ``"per_L"`` or ``"per_L_minus_1"`` (M-6; ``"paper"`` only).
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
      horizon: steps per stream or ``None`` (unbounded trees, C-6).

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
      shards: as ``ContinualCount``; on streaming input, presets that keep
        median samples in a per-key log (``preset="paper"``) always release
        per key.

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
                 max_users: int = 1_000_000, beta: float = MeanConfig.beta,
                 neighbours: str = MeanConfig.neighbours, noise: Optional[str] = MeanConfig.noise,
                 delta: Optional[float] = MeanConfig.delta,
                 median_budget: Optional[str] = MeanConfig.median_budget,
                 tree_levels: Optional[int] = MeanConfig.tree_levels,
                 mechanism: Optional[str] = MeanConfig.mechanism,
                 horizon: Optional[int] = MeanConfig.horizon, preset: str = MeanConfig.preset,
                 prior_ratio: Optional[float] = MeanConfig.prior_ratio,
                 prior_query: Optional[bool] = MeanConfig.prior_query,
                 user_spread: float = MeanConfig.user_spread,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 allowed_lateness: Any = datetime.timedelta(days=1), late: str = "defer",
                 rng: Any = None, noise_key: Any = None, transient_errors: Any = TRANSIENT_ERRORS,
                 shards: Optional[int] = None, label: Optional[str] = None) -> None:
        # MeanConfig's fields from `beta` on, the parameter list the engine-free mechanism takes
        # too; the defaults above are MeanConfig's (max_users and dim have the transform's own).
        params = {name: value for name, value in locals().items() if name in _CONFIG_KEYWORDS}
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
        config = MeanConfig(max_users=max_users, max_samples_per_user=max_samples_per_user,
                            epsilon=epsilon, dim=self._dim, **params)
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
        # The schedule decides the steps, not the input's windows (design D2.1).
        events = in_global_window(events, "EventWindow")
        schedule, declared, side = validation(self)
        # Bounded: each bundle's events gathered per user for the per-user grouping.
        prepare = PrepareMeanEventsBatch if events.is_bounded else PrepareMeanEvents
        prepared = events | "Validate" >> beam.ParDo(prepare(
            label, self._value_fn, self._user_fn, self._key_fn, self._timestamp_fn,
            self._lower, self._upper, schedule, declared, self._transient),
            **side).with_outputs(INVALID, main="valid")
        invalids = [prepared[INVALID]]
        stage = dict(transform=label, params=self._params, lower=self._lower, upper=self._upper,
                     step_micros=self._step_micros, max_keys=self._max_keys,
                     selecting=private_keys(self) is not None)
        users = prepared.valid
        entry = self.plan_entry(label)
        spec = MeanReleaseSpec(label, self._step, self._params, self._lower, self._upper,
                               self._horizon, entry)
        combine_fn = None
        if events.is_bounded:
            # Batch: a user's events grouped and taken in event-time order; the
            # step is part of the key, so no event-time windows are needed.
            if raw_steps(self, events) and not spec.uses_log:
                # The sharded batch release groups per shard anyway: it merges the bundles'
                # partial aggregates per (key, step) there, instead of a combine's own grouping.
                combine_fn = MergeAggregates()
                stage_fn = WithholdReleaseTotals(shards=release_shards(self, events), gathered=True,
                                                 **stage)
            else:
                stage_fn = WithholdReleaseBatch(gathered=True, **stage)
            # A user's capped events leave as finished dead letters: no grouping of their own.
            per_user = (users
                        | "PerUser" >> beam.GroupByKey()
                        | "WithholdRelease" >> beam.ParDo(stage_fn)
                        .with_outputs(INVALID, UNITS, main="aggregates"))
            invalids.append(per_user[INVALID])
            aggregates = per_user.aggregates
            if combine_fn is None:
                aggregates = (aggregates
                              | "PerStep" >> beam.CombinePerKey(MergeAggregates())
                              | "StepIndex" >> beam.ParDo(StepEnd(self._step_micros)))
        else:
            per_user = users | "WithholdRelease" >> beam.ParDo(
                WithholdRelease(**stage)).with_outputs(CAPPED, UNITS, main="aggregates")
            # Unbounded lateness: the release applies `late` and `allowed_lateness`.
            aggregates = (per_user.aggregates
                          | "StepWindows" >> beam.WindowInto(
                              FixedWindows(self._step), allowed_lateness=UNBOUNDED_LATENESS)
                          | "PerStep" >> beam.CombinePerKey(MergeAggregates())
                          | "StepIndex" >> beam.ParDo(StepOf(self._step_micros))
                          | "Rewindow" >> beam.WindowInto(GlobalWindows()))
            invalids.append(per_user[CAPPED] | "CountCapped" >> CountCapped(label, self._step))
        return release_streams(self, events, aggregates, spec, entry, invalids,
                               units=per_user[UNITS], unit="user", combine_fn=combine_fn)
