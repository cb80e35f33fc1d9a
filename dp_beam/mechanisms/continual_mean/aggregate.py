"""What one time step contributes to a stream of Algorithm 6 (seed 003).

docs/privacy/mean.md M-2 to M-5: :func:`contribution` turns one
user's sample into a :class:`MeanAggregate` (per user, in parallel; with
Algorithm 7 the only reader of sample values, so the rest is
post-processing, AC-5); aggregates merge per
step and feed :class:`~.core.ContinualMeanCore`. The Beam transform and the
engine-free :class:`~.stream.ContinualMeanMechanism` build the same aggregates.
"""

from typing import Any

import numpy as np

from .params import MeanParams
from .schedule import UserState, element_size, release_level, withhold_release

__all__ = [
    "MeanAggregate",
    "contribution",
]


class MeanAggregate:
    """What one time step contributes to a stream: built per user, combined, fed to the core.

    * ``events``: samples in the step (used, i.e. within the cap m);
    * ``counts[ℓ]``: level-ℓ elements released in the step;
    * ``low[ℓ]`` (ℓ not truncated: 0, 1 and, in the tuned preset, levels without
      a prior): sum of the raw elements, a d-vector; for the tuned preset's
      levels fed at once (:attr:`MeanParams.immediate`) the sum of the level's samples
      that arrived in the step;
    * ``n_low[ℓ]`` (levels fed at once): the number of those samples;
    * ``prefix`` (prior query): ``{"mean": Σ change of the users' means m_u,
      "inv": Σ change of 1/k_u}`` over the users whose released samples grew;
    * ``proj[ℓ]`` (ℓ truncated around a prior): ``G_ℓ × d`` array, row j = Σ of the elements projected
      onto ``I_ℓ`` for the candidate prior ``μ̃_ℓ = (j+½)/G_ℓ``. The prior is
      on a public finite grid, so every element can be projected for every
      candidate where it arises, in parallel, and the core picks the row of the
      chosen prior; this keeps the aggregate of fixed size;
    * ``a_inc[ℓ]`` (ℓ with a median): increments of ``A_ℓ = Σ_v min(M_v, 2^{ℓ−1})``;
    * ``samples``: ``(order_key, index, x)`` of samples with index ≤ 2^{L−1} (for medians);
    * ``max_count``: the largest user count seen in the step (values model: public).
    """

    __slots__ = ("events", "counts", "low", "n_low", "prefix", "proj", "a_inc", "samples", "max_count")

    def __init__(self, params: Any = None) -> None:
        self.events = 0
        self.counts = {}
        self.low = {}
        self.n_low = {}
        self.prefix = {}
        self.proj = {}
        self.a_inc = {}
        # No samples is the empty tuple, not a list per aggregate: most aggregates have none,
        # and each list is one more object for the garbage collector to track and traverse.
        self.samples = ()
        self.max_count = 0

    def merge(self, other: "MeanAggregate") -> "MeanAggregate":
        out = MeanAggregate()
        out.events = self.events + other.events
        for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc"):
            a, b = getattr(self, name), getattr(other, name)
            merged = dict(a)
            for key, val in b.items():
                merged[key] = merged[key] + val if key in merged else val
            setattr(out, name, merged)
        a, b = self.samples, other.samples
        # The empty tuple concatenates as a list (a list or PackedSamples stays what it is).
        out.samples = (list(a) if type(a) is tuple else a) + (list(b) if type(b) is tuple else b)
        out.max_count = max(self.max_count, other.max_count)
        return out

    def fields(self) -> tuple:
        """The fields in ``__slots__`` order, as a tuple: :meth:`from_fields` rebuilds the
        aggregate from it. With d = 1 and no medians it holds only ints, floats, dicts of
        them and the empty tuple, which a runner's coder writes without pickling."""
        return (self.events, self.counts, self.low, self.n_low, self.prefix, self.proj,
                self.a_inc, self.samples, self.max_count)

    @staticmethod
    def from_fields(fields: tuple) -> "MeanAggregate":
        """The aggregate of :meth:`fields` (its dicts and arrays taken over, not copied)."""
        return _rebuild_aggregate(fields)

    def __reduce__(self):
        return (_rebuild_aggregate, (self.fields(),))


def _rebuild_aggregate(fields):
    # Every field is set below: no empty dicts to build first.
    agg = MeanAggregate.__new__(MeanAggregate)
    (agg.events, agg.counts, agg.low, agg.n_low, agg.prefix, agg.proj, agg.a_inc, agg.samples,
     agg.max_count) = fields
    return agg


# Pickle names a function by its module. The package's name, where this was
# defined before the split, keeps MeanAggregate pickles byte-identical and
# loadable by either layout.
_rebuild_aggregate.__module__ = __package__


def contribution(params: MeanParams, state: UserState, x: Any, step: int = 0) -> MeanAggregate:
    """One user's sample x ∈ [0,1]^d → its :class:`MeanAggregate` (per-user, parallel part).

    ``state`` (a :class:`UserState`) is updated in place. This is the only
    place besides Algorithm 7 that reads sample values (AC-5); every projection
    happens here, for every candidate prior. With d = 1 and no prior query, ``x`` may be a
    float: then the aggregate's element sums are floats too (:func:`_contribution_scalar`).
    """
    store_upto = element_size(max(params.median_levels)) if params.median_levels else 0
    if type(x) is float and params.dim == 1 and not params.query:
        return _contribution_scalar(params, state, x, step, store_upto)
    out = withhold_release(state, x, params.L, store_upto, step)
    agg = MeanAggregate()
    agg.events = 1
    count = out["count"]
    agg.max_count = count
    for level in params.median_levels:
        if count <= element_size(level):
            agg.a_inc[level] = 1
    if out["sample"] is not None:
        agg.samples = [((state.first_step, state.uhash), count, out["sample"])]
    # Sample index k lies in level ℓ = ⌈log2 k⌉ (samples 2^{ℓ−1}+1 … 2^ℓ; level 0: k = 1).
    sample_level = (count - 1).bit_length()
    if sample_level in params.immediate:
        agg.low[sample_level] = np.array(x, dtype=np.float64)
        agg.n_low[sample_level] = 1
    level = out["level"]
    if level is not None and params.query:
        # The user's mean m_u over its released samples (the first `count` = 2^ℓ)
        # replaces the one over the first count/2; the sums telescope to Σ_u m_u.
        old = 0.0 if state.covered is None else state.covered / (count // 2)
        state.covered = out["element"] + (0.0 if state.covered is None else state.covered)
        agg.prefix = {"mean": state.covered / count - old,
                      "inv": 1.0 / count - (2.0 / count if count > 1 else 0.0)}
    if level is not None:
        agg.counts[level] = 1
        if level in params.immediate:
            pass                                   # its samples went in as they arrived
        elif level not in params.prior_set:
            agg.low[level] = out["element"].copy()
        else:
            s = element_size(level)
            centres = s * params.grid(level).reshape(-1, 1)              # G × 1
            D = params.Delta[level]
            agg.proj[level] = np.clip(out["element"].reshape(1, -1), centres - D, centres + D)
    return agg


def _contribution_scalar(params: MeanParams, state: UserState, x: float, step: int,
                         store_upto: int) -> MeanAggregate:
    """:func:`contribution` of a sample of d = 1 given as a float (M-2).

    The schedule of :func:`~.schedule.withhold_release` on Python floats: the segment
    sums are the same float64 additions as on 1-element arrays (so the same bits), and
    the aggregate's ``low`` sums are floats, which merge by the same additions and
    pickle without an array each. Median samples and projections stay arrays, as
    the core reads them.
    """
    if state.count == 0:
        state.first_step = step
        segment = 0.0
    else:
        segment = state.segment
        if type(segment) is not float:
            segment = float(segment[0])
    count = state.count = state.count + 1
    segment = segment + x
    agg = MeanAggregate()
    agg.events = 1
    agg.max_count = count
    for level in params.median_levels:
        if count <= element_size(level):
            agg.a_inc[level] = 1
    if count <= store_upto:
        agg.samples = [((state.first_step, state.uhash), count, np.array([x], dtype=np.float64))]
    # Sample index k lies in level ℓ = ⌈log2 k⌉ (samples 2^{ℓ−1}+1 … 2^ℓ; level 0: k = 1).
    sample_level = (count - 1).bit_length()
    if sample_level in params.immediate:
        agg.low[sample_level] = x
        agg.n_low[sample_level] = 1
    level = release_level(count, params.L)
    if level is None:
        state.segment = segment
        return agg
    state.segment = 0.0
    agg.counts[level] = 1
    if level in params.immediate:
        pass                                   # its samples went in as they arrived
    elif level not in params.prior_set:
        agg.low[level] = segment
    else:
        s = element_size(level)
        centres = s * params.grid(level).reshape(-1, 1)              # G × 1
        D = params.Delta[level]
        agg.proj[level] = np.clip(np.array([[segment]]), centres - D, centres + D)
    return agg
