"""``ContinualMean``: a user-level mean released every step (seed 003, Algorithm 6).

Shape (DESIGN.md "time model"), spec withhold_release_and_composition.md §2.5,
§2.9: validate and clamp every event in parallel (``PrepareEvents``) → per-user
withhold-release state keyed by user (O(1) Beam state per user, the cap m, and
the projection of every released element for every candidate prior) → per-step
``CombinePerKey`` of fixed-size aggregates in event-time fixed windows → one
ordered release DoFn per stream running the core of Algorithm 6 (the L+1 trees,
the medians, the count tree under participation, and the estimate).

All DP math lives in :mod:`dp_beam.mechanisms.continual_mean`; this module
only moves data.

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
"""

import datetime
from typing import Any, Tuple

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import FixedWindows, GlobalWindows
from apache_beam.utils.timestamp import Duration

from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanAggregate, MeanParams,
                                               UserState, contribution, user_hash)
from dp_beam.records import InvalidElement, LedgerEntry
from dp_beam.mechanisms.registry import default_mechanism
from dp_beam.records_mean import MeanRelease
from dp_beam.transforms.continual import _StepOf, set_release_options
from dp_beam.transforms.events import INVALID, NAMESPACE, PrepareEvents
from dp_beam.transforms.release import ReleaseSpec, release_in_order

MECHANISM = "withhold_release_mean"


@beam.typehints.with_output_types(Tuple[Any, Any])
class _WithholdRelease(beam.DoFn):
    """Per-user schedule (§2.5): ``(user, (key, value))`` → ``(key, MeanAggregate)``.

    State per user: count, segment sum, first step, hash, latest event time.
    Samples beyond ``max_samples_per_user`` go to ``invalid``. The aggregate is
    emitted at the latest event time the user has shown, so a released element
    never lands in a step before one of its own samples (batch input reaches a
    user in arbitrary order).
    """

    STATE = ReadModifyWriteStateSpec("user", PickleCoder())

    def __init__(self, transform, params, lower, upper, step_seconds):
        self._transform = transform
        self._params = params
        self._lower, self._upper = lower, upper
        self._step = step_seconds
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                state=beam.DoFn.StateParam(STATE)):
        user, (key, value) = element
        stored = state.read()
        if stored is None:
            ustate, latest = UserState(uhash=user_hash(user)), None
        else:
            ustate, latest = UserState.from_tuple(stored[0]), stored[1]
        p = self._params
        if ustate.count >= p.m:
            self._over.inc()
            yield pvalue.TaggedOutput(INVALID, InvalidElement(
                self._transform, f"max_samples_per_user ({p.m}) exceeded for user",
                {"user": user, "key": key, "value": value}))
            return
        ts = timestamp.micros / 1e6
        latest = ts if latest is None else max(latest, ts)
        x = np.array([(value - self._lower) / (self._upper - self._lower)])
        agg = contribution(p, ustate, x, step=int(latest // self._step))
        state.write((ustate.to_tuple(), latest))
        yield beam.window.TimestampedValue((key, agg), latest)


class _MergeAggregates(beam.CombineFn):

    def create_accumulator(self):
        return MeanAggregate()

    def add_input(self, acc, agg):
        return acc.merge(agg)

    def merge_accumulators(self, accs):
        out = MeanAggregate()
        for a in accs:
            out = out.merge(a)
        return out

    def extract_output(self, acc):
        return acc


class MeanReleaseSpec(ReleaseSpec):
    """Feeds per-step :class:`MeanAggregate` s to a :class:`ContinualMeanCore` per stream."""

    def __init__(self, transform, step_seconds, params, lower, upper, horizon, ledger_template):
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = horizon
        self._params = params
        self._lower, self._upper = lower, upper
        self._ledger = ledger_template

    def zero(self):
        return MeanAggregate()

    def merge(self, a, b):
        return a.merge(b)

    def events(self, aggregate):
        return int(aggregate.events)

    def new_mechanism(self, rng):
        return ContinualMeanCore(self._params, self._lower, self._upper, self.horizon, rng)

    def restore(self, state, rng):
        return ContinualMeanCore.from_state(self._params, state, self._lower, self._upper, rng)

    def release(self, mechanism, key, step, aggregate):
        out = mechanism.step(aggregate)
        yield MeanRelease(
            key=key, step=step, window_start=step * self.step_seconds,
            window_end=(step + 1) * self.step_seconds, value=out.estimate,
            noise_std=out.noise_std, ci95=out.ci95,
            mechanism=f"{MECHANISM}+{self._params.mechanism}",
            transform=self.transform, t=out.t, diverse=out.diverse,
            denominator=float(out.denominator), active_levels=tuple(out.active),
            neighbours=self._params.neighbours)

    def ledger(self, key):
        return [self._ledger._replace(key=key)]


class ContinualMean(beam.PTransform):
    """The mean of all users' samples, released every step, user-level private.

    Algorithm 6 of seed 003 (spec withhold_release_and_composition.md §2.9):
    each user's samples are released to tree B_ℓ in exponentially growing
    sums (§2.5), truncated around a private per-level median prior (§2.8), and
    the estimate is ``Σ_ℓ B_ℓ / N_t`` in the units of ``[lower, upper]``.

    Privacy: ε-DP for each user (``noise="laplace"``), or ρ-zCDP with
    ρ = ρ(ε, δ) and hence (ε, δ)-DP (``noise="gaussian"``), over the whole
    output sequence, under the neighbour relation ``neighbours`` (see the
    module docstring): ``"participation"`` (default) or ``"values"``. The ledger
    entry on ``.accounting`` states the cost and the relation.

    Args:
      user_fn: element → user id (the privacy unit).
      value_fn: element → a real value; clamped to ``[lower, upper]``.
      lower, upper: public bounds, ``lower < upper``.
      max_samples_per_user: m; a user's later samples go to ``.invalid``.
      epsilon: total privacy parameter (> 0).
      step: step length (seconds or ``timedelta``), epoch-aligned.
      max_users: n, the upper bound on users used by the truncation widths
        (§2.9 eq. (9)); it affects accuracy only, never privacy.
      beta: failure probability of the accuracy guarantee (§6 A6).
      noise, delta: ``"laplace"`` or ``"gaussian"`` (needs ``delta``).
      horizon: steps per stream or ``None`` (unbounded trees, §1.6 U2).
      timestamp_fn, allowed_lateness, late, max_idle_steps: as ``ContinualCount``.
      mechanism: the continual-counting mechanism of every level's tree (as in
        ``ContinualCount``); ``None`` picks the most accurate for the noise and
        horizon. Each user enters each level at most once, so every
        mechanism keeps its single-participation sensitivity.
      rng: ``None`` (secure); tests only: an int seed or a ``NoiseSource``.

    Example (noise switched off to show the estimate):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms import ZeroNoise   # noise off: for the example only
    >>> events = [{"ts": float(t), "user": f"u{t % 10}", "delay": float(t % 5)} for t in range(30)]
    >>> mean = dpb.ContinualMean(user_fn=lambda e: e["user"], value_fn=lambda e: e["delay"],
    ...                          lower=0, upper=4, max_samples_per_user=4, epsilon=1.0, step=10,
    ...                          timestamp_fn=lambda e: e["ts"], neighbours="values",
    ...                          rng=ZeroNoise())
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(events) | mean
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, round(r.value, 3), r.diverse))
    0 2.0 True
    1 2.0 True
    2 2.0 True
    """

    def __init__(self, user_fn, value_fn, lower, upper, max_samples_per_user, epsilon, step, *,
                 max_users=1_000_000, beta=0.1, neighbours="participation", noise="laplace",
                 delta=None, median_budget="per_L", horizon=None, timestamp_fn=None,
                 allowed_lateness=datetime.timedelta(days=1), late="defer", max_idle_steps=1024,
                 mechanism=None, rng=None, label=None):
        super().__init__(label)
        for name, fn in (("user_fn", user_fn), ("value_fn", value_fn)):
            if not callable(fn):
                raise ValueError(f"{name} must be callable, got {fn!r}")
        if timestamp_fn is not None and not callable(timestamp_fn):
            raise ValueError(f"timestamp_fn must be callable, got {timestamp_fn!r}")
        self._user_fn, self._value_fn, self._timestamp_fn = user_fn, value_fn, timestamp_fn
        for name, v in (("lower", lower), ("upper", upper)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not lower < upper:
            raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
        self._lower, self._upper = float(lower), float(upper)
        set_release_options(self, step, allowed_lateness, late, max_idle_steps, rng)
        if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int)
                                    or horizon < 1):
            raise ValueError(f"horizon must be an int >= 1 or None, got {horizon!r}")
        self._horizon = horizon
        if mechanism is None:
            mechanism = default_mechanism(noise, horizon)
        self._params = MeanParams(max_users, max_samples_per_user, epsilon, beta,
                                  neighbours=neighbours, noise=noise, delta=delta,
                                  median_budget=median_budget, mechanism=mechanism)

    @property
    def params(self):
        return self._params

    def plan_entry(self, label) -> LedgerEntry:
        p = self._params
        cost = p.privacy_cost()
        return LedgerEntry(
            transform=label, unit="user", neighbours=p.neighbours,
            epsilon=float(cost["epsilon"]), delta=float(cost["delta"] or 0.0),
            rho=float(cost["rho"]), mechanism=f"{MECHANISM}+{p.mechanism}", scope="stream",
            key=None,
            sensitivity=float(p.tree_sensitivity(p.L)), noise=p.noise,
            calibration="zcdp" if p.noise == "gaussian" else "")

    def expand(self, events):
        label = self.label
        prepared = events | "Validate" >> beam.ParDo(PrepareEvents(
            label, self._value_fn, self._lower, self._upper, None, self._user_fn,
            self._timestamp_fn)).with_outputs(INVALID, main="valid")
        invalids = [prepared[INVALID]]
        per_user = (prepared.valid
                    | "UserWindow" >> beam.WindowInto(GlobalWindows())
                    | "WithholdRelease" >> beam.ParDo(_WithholdRelease(
                        label, self._params, self._lower, self._upper, self._step)
                    ).with_outputs(INVALID, main="aggregates"))
        invalids.append(per_user[INVALID])
        aggregates = (per_user.aggregates
                      | "StepWindows" >> beam.WindowInto(
                          FixedWindows(self._step),
                          allowed_lateness=Duration(micros=int(self._allowed_lateness * 1e6)))
                      | "PerStep" >> beam.CombinePerKey(_MergeAggregates())
                      | "StepIndex" >> beam.ParDo(_StepOf(self._step_micros))
                      | "Rewindow" >> beam.WindowInto(GlobalWindows()))
        bounded_input = events.is_bounded
        entry = self.plan_entry(label)
        spec = MeanReleaseSpec(label, self._step, self._params, self._lower, self._upper,
                               self._horizon, entry)
        return release_in_order(aggregates, spec, entry, invalids, bounded=bounded_input,
                                late=self._late, seed=self._seed,
                                max_idle_steps=self._max_idle)
