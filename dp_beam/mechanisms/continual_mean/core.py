"""The central, single-stream part of Algorithm 6 (seed 003): :class:`ContinualMeanCore`.

docs/privacy/mean.md M-3 to M-5 (M-5 for the order within a
step): the continual counters of the levels (and the count tree under
participation), buffering of inactive levels, activation, priors and the
released estimate, stepped once per time step with one merged
:class:`~.aggregate.MeanAggregate`. Its state is the plain dict of
:meth:`ContinualMeanCore.to_state`.
"""

import dataclasses
import functools
import itertools
import math
from typing import Any, Dict, Optional

import numpy as np

from ..halfwidths import gaussian_halfwidth, laplace_sum_halfwidth
from ..noise import make_noise
from ..counting.registry import get_mechanism
from ..state import StateRecord, float_array, optional, state_field
from .aggregate import MeanAggregate
from .median import private_median
from .plan import PRIOR_CONFIDENCE, prior_error_bound
from .schedule import element_size

__all__ = [
    "MeanStep",
    "ContinualMeanCore",
    "ContinualMeanState",
]


class MeanStep:
    """One release of the core: rescaled estimate and its public metadata."""

    __slots__ = ("t", "estimate", "diverse", "noise_std", "ci95", "denominator", "active",
                 "priors", "events")

    def __init__(self, t: Any = None, estimate: Any = None, diverse: Any = None,
                 noise_std: Any = None, ci95: Any = None, denominator: Any = None,
                 active: Any = None, priors: Any = None, events: Any = None) -> None:
        self.t, self.estimate, self.diverse = t, estimate, diverse
        self.noise_std, self.ci95, self.denominator = noise_std, ci95, denominator
        self.active, self.priors, self.events = active, priors, events

    def __repr__(self):
        return f"MeanStep(t={self.t}, estimate={self.estimate}, diverse={self.diverse})"


class ContinualMeanCore:
    """The central, single-stream part of Algorithm 6 (docs/privacy/mean.md M-3 to M-7), stepped once per time step.

    Per step (M-5 order): update counts (count tree under participation) →
    activate levels whose condition holds (median, flush of the buffer) →
    feed every tree this step's level sum → output. Inactive trees are fed
    zero and left out of the estimate (they hold no element). Values are in
    [0,1]^d here; ``lower``/``upper`` rescale the output (M-4, post-processing).

    ``horizon``: number of steps per tree (None: unbounded, docs/privacy/counting.md C-6).
    """

    name = "withhold_release_mean"

    def __init__(self, params: Any, lower: Any = 0.0, upper: Any = 1.0,
                 horizon: Optional[int] = None, rng: Any = None) -> None:
        self.p = params
        self.lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (params.dim,)).copy()
        self.upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (params.dim,)).copy()
        self.horizon = horizon
        self.source = make_noise(rng)
        self.t = 0
        # Value tree j takes the per-step sum of the elements of the levels in tree_groups[j]
        # (the paper: one tree B_ℓ per level).
        self.trees = {j: self._tree(j, params.group_sensitivity(j), params.dim)
                      for j in range(len(params.tree_groups))}
        self.count_tree = (self._tree("count", self.p.count_sensitivity(), self.p.count_dim)
                           if params.participation else None)
        self.active = {lv: lv not in params.prior_set for lv in params.levels}
        self.prior = {}                      # level → grid indices (d,)
        self.buffer = {}                     # level → G × d projected sums of buffered elements
        self.counts = {lv: 0 for lv in params.levels}
        self.samples_in = {lv: 0 for lv in params.immediate}    # samples of levels fed at once
        self.a = {lv: 0 for lv in params.median_levels}
        self.max_count = 0
        self.store = {}                      # order key → list of samples (index order)
        self.noisy_counts = None
        # Release-prior preset: the previous release (rescaled to [0,1]) and its error bound.
        self.last_est01 = None
        self.last_bound = math.inf
        # Prior query: running Σ_u m_u and Σ_u 1/k_u, and the answer once given.
        self.prefix_mean = np.zeros(params.dim)
        self.prefix_inv = 0.0
        self.query = None                    # (estimate in [0,1]^d, public bound, step)
        self._init_fast()

    def _init_fast(self):
        """Derived values that are not state: rebuilt by the constructor and :meth:`from_state`.

        With d = 1 a step's vectors are Python floats (``_scalar``): the same IEEE-754
        operations in the same order as on 1-element arrays, so the same bits, at a
        fraction of the cost of NumPy's small-array calls (tests/mechanisms/
        test_continual_mean.py compares the two paths).
        """
        p = self.p
        self._scalar = p.dim == 1
        self._lo0 = float(self.lower[0])
        self._range0 = float(self.upper[0] - self.lower[0])
        self._weights = p.count_weights.tolist()
        self._weight_scalars = list(p.count_weights)
        self._count_key = (tuple(p.count_unit), tuple(self._weight_scalars))
        # Each tree's release of the current step, as its step returned it (the same
        # value ``current()`` reads back from the nodes).
        self._released = {}
        self._nc = None                      # this step's noisy counts (list of floats)
        self._centres = {}                   # level → centre per sample, fixed by its prior
        # (active levels, tree keys, count coordinates whose levels are all active, the others)
        self._active_sets = None
        self._group_centres = None           # count group → centre per sample, with them
        # Per count group: its levels fed at once, its other levels with their sizes, its
        # samples per unit and its weight.
        self._count_plan = [(tuple(lv for lv in group if lv in p.immediate),
                             tuple((lv, element_size(lv)) for lv in group if lv not in p.immediate),
                             unit, weight)
                            for group, unit, weight in zip(p.count_groups, p.count_unit,
                                                           self._weights)]
        # Per level, for the d = 1 inputs: the level, whether it takes a prior, whether its
        # samples are fed at once (looked up once per stream, not per level and step).
        self._level_plan = tuple((lv, lv in p.prior_set, lv in p.immediate) for lv in p.levels)
        self._tree_list = [self.trees[j] for j in range(len(p.tree_groups))]
        self._tokens = {j: _config_token(tree) for j, tree in self.trees.items()}
        if self.count_tree is not None:
            self._tokens["count"] = _config_token(self.count_tree)
        # Asked before every step by a release that reseeds in place; the trees are fixed.
        self._can_swap = self._trees_can_swap()

    # The last step's clamped noisy counts and (tuned) release in [0, 1], as float64 arrays:
    # kept as the step made them (a list, a float) and made arrays only when read (the
    # median activation, the next prior, the state), not at every step of every stream.
    @property
    def noisy_counts(self) -> Optional[np.ndarray]:
        if self._noisy_counts is None and self._noisy_list is not None:
            self._noisy_counts = np.array(self._noisy_list, dtype=np.float64)
        return self._noisy_counts

    @noisy_counts.setter
    def noisy_counts(self, value: Optional[np.ndarray]) -> None:
        self._noisy_counts, self._noisy_list = value, None

    @property
    def last_est01(self) -> Optional[np.ndarray]:
        if self._last_est01 is None and self._last_float is not None:
            self._last_est01 = np.array([self._last_float], dtype=np.float64)
        return self._last_est01

    @last_est01.setter
    def last_est01(self, value: Optional[np.ndarray]) -> None:
        self._last_est01, self._last_float = value, None

    def can_swap_source(self) -> bool:
        """True when :meth:`set_noise_source` can swap every tree's source in place."""
        return self._can_swap

    def _trees_can_swap(self):
        trees = list(self.trees.values()) + ([self.count_tree] if self.count_tree is not None else [])
        return all(hasattr(tree, "set_noise_source") for tree in trees)

    def set_noise_source(self, rng: Any) -> None:
        """Draw all later noise from ``rng``: the state is unchanged, so this equals
        ``from_state(params, to_state(), ..., rng)`` without the round trip, which a release
        DoFn would otherwise pay at every step to give the step its own keyed source."""
        self.source = make_noise(rng)
        for tree in self.trees.values():
            tree.set_noise_source(self.source)
        if self.count_tree is not None:
            self.count_tree.set_noise_source(self.source)

    def _tree(self, key, sensitivity, dim):
        p = self.p
        kw = dict(epsilon=p.tree_epsilon(key), sensitivity=sensitivity, horizon=self.horizon, dim=dim,
                  rng=self.source)
        if p.noise == "gaussian":
            kw.update(noise="gaussian", delta=p.delta, calibration="zcdp")
        return get_mechanism(p.mechanism)(**kw)

    # -- serialisation ---------------------------------------------------------

    def state_record(self) -> "ContinualMeanState":
        """The core's state as its record (the trees as their states); :meth:`to_state` writes
        it. The record shares the core's arrays and dicts: write it before the next step."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(ContinualMeanState)
                  if f.name not in _SPECIAL}
        trees = {j: tree.to_state() for j, tree in self.trees.items()}
        count_tree = None if self.count_tree is None else self.count_tree.to_state()
        return ContinualMeanState(mechanism=self.name, trees=trees, count_tree=count_tree, **values)

    def to_state(self) -> Dict[str, Any]:
        """The core's state as plain Python values (lists, dicts, numbers), for Beam state
        (:class:`ContinualMeanState`)."""
        return self.state_record().to_state()

    @classmethod
    def from_state(cls, params: Any, state: Dict[str, Any], lower: Any = 0.0, upper: Any = 1.0,
                   rng: Any = None) -> "ContinualMeanCore":
        """The core :meth:`to_state` saved, drawing later noise from ``rng``."""
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError("state is not a continual-mean core state")
        record = ContinualMeanState.from_state(state)
        core = cls(params, lower, upper, horizon=next(iter(record.trees.values()))["horizon"], rng=rng)
        for f in dataclasses.fields(record):
            if f.name not in _SPECIAL:
                setattr(core, f.name, getattr(record, f.name))
        core.trees = {j: _tree_from(s, core.source) for j, s in record.trees.items()}
        core.count_tree = None if record.count_tree is None else _tree_from(record.count_tree, core.source)
        core._init_fast()
        return core

    # -- the step --------------------------------------------------------------

    def _prior_values(self, level):
        return self.p.grid(level)[self.prior[level]]          # (d,)

    def _pick(self, level, proj):
        """Row of the chosen prior in each coordinate of a G × d projected sum."""
        return proj[self.prior[level], np.arange(self.p.dim)]

    def _activation_due(self, level):
        p = self.p
        if not p.participation:
            return self.a[level] >= p.activation_threshold(level)
        # Noisy A_ℓ/2^{ℓ−1} minus a public margin (the count tree's 95 % half-width),
        # so that activation rarely happens before k_ℓ arrays can be filled.
        j = len(p.count_groups) + p.median_levels.index(level)
        margin = self.count_tree.ci_halfwidth(self.count_tree.t) / p.count_weights[j]
        return self.noisy_counts[j] - margin >= p.k[level]

    def _ask_query(self):
        """Prior query: answer it once, at the first step whose public bound reaches the target."""
        p = self.p
        users = self.counts[0]                  # users so far: public under "values"
        bound = p.query_bound(users, self.prefix_inv)
        if bound > p.query_target:
            return
        draw = self.source.laplace if p.noise == "laplace" else self.source.gaussian
        noise = draw(p.query_noise_scale(), p.dim)
        self.query = (np.clip((self.prefix_mean + noise) / users, 0.0, 1.0), bound, self.t)

    def _release_prior(self, level):
        """Tuned preset: grid index of level ℓ's prior, or None while no public estimate's
        bound is at most γ_ℓ: the previous release or the prior query's answer, whichever
        has the smaller bound (post-processing of released outputs only)."""
        bound, query = self.last_bound, self.query
        if query is not None and query[1] < bound:
            est, bound = query[0], query[1]
        elif bound > self.p.gamma[level]:
            return None                      # (without reading the release's array)
        else:
            est = self.last_est01
        if est is None or bound > self.p.gamma[level]:
            return None
        G = self.p.G[level]
        y = np.clip(est, 0.0, 1.0)
        return np.minimum(np.floor(y * G), G - 1).astype(np.int64)

    def step(self, agg: Optional[MeanAggregate] = None) -> MeanStep:
        """Consume one step's :class:`MeanAggregate` (None = empty step); return a :class:`MeanStep`."""
        agg = agg if agg is not None else MeanAggregate()
        x = self.step_begin(agg)
        inputs = self.step_middle(agg, None if x is None else self.count_tree.step(x))
        return self.step_end(agg, [tree.step(v) for tree, v in zip(self._tree_list, inputs)])

    # A step in three parts around its tree steps, so that many streams of one
    # configuration can step their trees together (:mod:`.lockstep`): step_begin,
    # the count tree's step, step_middle, each value tree's step, step_end. Each
    # part draws what it draws in the order of a whole step (the prior query before
    # the count tree, a median after it), so a stream's draws and state are the same
    # whether its trees are stepped alone or with others.

    def step_begin(self, agg: MeanAggregate) -> Any:
        """The first part of :meth:`step` (``agg`` not None): the public counters and the
        prior query; returns the count tree's input (``None`` without a count tree)."""
        p = self.p
        self.t += 1
        for lv, c in agg.counts.items():
            self.counts[lv] += c
        for lv, c in agg.n_low.items():
            self.samples_in[lv] += c
        if agg.prefix:
            self.prefix_mean = self.prefix_mean + agg.prefix["mean"]
            self.prefix_inv += agg.prefix["inv"]
        if p.query and self.query is None and not all(self.active.values()):
            self._ask_query()
        for lv, c in agg.a_inc.items():
            self.a[lv] += c
        self.max_count = max(self.max_count, agg.max_count)
        if p.median_levels and any(not self.active[lv] for lv in p.median_levels):
            for key, idx, x in agg.samples:
                self.store.setdefault(key, []).append((idx, np.asarray(x, dtype=np.float64)))
        if self.count_tree is None:
            return None
        return self._count_input(agg)

    def step_middle(self, agg: MeanAggregate, noisy: Any) -> list:
        """The second part of :meth:`step`: reads the count tree's release ``noisy`` (``None``
        without a count tree), activates levels; returns each value tree's input, in the
        order of :attr:`tree_list`."""
        if self.count_tree is not None:
            self._read_counts(noisy)
        feed, fed_n = self._activate(agg)
        totals = self._tree_inputs(agg, feed, fed_n)
        return [sum(totals[lv] for lv in group) for group in self.p.tree_groups]

    def step_end(self, agg: MeanAggregate, released: list) -> MeanStep:
        """The last part of :meth:`step`: the estimate from the value trees' releases
        (in the order of :attr:`tree_list`)."""
        self._released = dict(enumerate(released))
        return self._output(agg)

    @property
    def tree_list(self) -> list:
        """The value trees, tree j of ``p.tree_groups`` at position j."""
        return self._tree_list

    def _count_input(self, agg):
        """Participation: the count tree's input this step (M-5)."""
        p = self.p
        # Per coordinate in floats: float64 products and quotients, as on arrays.
        n_low, counts = agg.n_low, agg.counts
        # Integer sums (exact in any order) of _new_samples over each group's levels, per
        # unit; coordinate j carries v_j times its count (public weights), divided back below.
        x = [((sum(n_low.get(lv, 0) for lv in fed) if fed and n_low else 0)
              + (sum(size * counts.get(lv, 0) for lv, size in whole) if whole and counts else 0))
             / unit * w for fed, whole, unit, w in self._count_plan]
        if p.median_levels:
            x += [agg.a_inc.get(lv, 0) / element_size(lv) * w
                  for lv, w in zip(p.median_levels, self._weights[len(x):])]
        return x[0] if len(x) == 1 else x

    def _read_counts(self, noisy):
        """Participation: the count tree's release read back as clamped noisy counts (M-5)."""
        p = self.p
        if type(noisy) is float:
            noisy = [noisy]
        else:
            noisy = (noisy if type(noisy) is np.ndarray and noisy.ndim == 1
                     else np.ravel(noisy)).tolist()
        nc = [v / w for v, w in zip(noisy, self._weights)]
        if p.preset == "tuned":
            # Post-processing: every count coordinate is a number of users (or of
            # elements, one per user) in [0, n]. With centred elements a level whose
            # count clamps to 0 drops out of numerator and denominator alike.
            n = float(p.n)
            nc = [_clip(v, 0.0, n) for v in nc]
        self._nc = nc
        self._noisy_counts, self._noisy_list = None, nc

    def _activate(self, agg):
        """Buffer inactive levels' elements, activate the levels whose prior is due and
        return what each truncated level feeds its tree this step (the order of M-5)."""
        p = self.p
        feed, fed_n = {}, {}
        for lv in p.prior_levels:
            if lv in agg.proj:
                if self.active[lv]:
                    feed[lv] = self._pick(lv, agg.proj[lv])
                    fed_n[lv] = agg.counts.get(lv, 0)
                else:
                    self.buffer[lv] = self.buffer[lv] + agg.proj[lv] if lv in self.buffer else agg.proj[lv]
        for lv in p.prior_levels:
            if self.active[lv]:
                continue
            if p.prior == "median":
                if not self._activation_due(lv):
                    continue
                store = {k: [x for _, x in sorted(v, key=lambda e: e[0])] for k, v in self.store.items()}
                self.prior[lv] = private_median(lv, store, p, self.source)
            else:
                idx = self._release_prior(lv)
                if idx is None:
                    continue
                self.prior[lv] = idx
            self.active[lv] = True
            self._centres.pop(lv, None)
            self._active_sets = self._group_centres = None
            if lv in self.buffer:
                # The buffer holds every level-ℓ element so far, this step's included (M-3).
                feed[lv] = self._pick(lv, self.buffer.pop(lv))
                fed_n[lv] = self.counts[lv]
        if all(self.active.values()):
            self.store = {}
        return feed, fed_n

    def _tree_inputs(self, agg, feed, fed_n):
        """Each level's input this step, centred under participation (M-4)."""
        p = self.p
        if self._scalar:
            return self._tree_inputs_scalar(agg, feed, fed_n)
        totals = {}
        for lv in p.levels:
            x = np.zeros(p.dim)
            if lv not in p.prior_set:
                if lv in agg.low:
                    x = np.asarray(agg.low[lv], dtype=np.float64)
                n_new = agg.counts.get(lv, 0)
            else:
                if lv in feed:
                    x = np.asarray(feed[lv], dtype=np.float64)
                n_new = fed_n.get(lv, 0)
            if p.participation:
                # Centre before the tree: presence, not spread, is what a user changes.
                if lv in p.immediate:
                    x = x - 0.5 * agg.n_low.get(lv, 0)
                elif n_new:
                    x = x - n_new * self._centre(lv)
            totals[lv] = x
        return totals

    def _tree_inputs_scalar(self, agg, feed, fed_n):
        """:meth:`_tree_inputs` with d = 1, each input a float (M-4)."""
        p = self.p
        totals = {}
        participation = p.participation
        low, counts, n_low = agg.low, agg.counts, agg.n_low
        for lv, prior, immediate in self._level_plan:
            x = 0.0
            if not prior:
                if lv in low:
                    x = _scalar(low[lv])
                n_new = counts.get(lv, 0)
            else:
                if lv in feed:
                    x = _scalar(feed[lv])
                n_new = fed_n.get(lv, 0)
            if participation:
                if immediate:
                    x = x - 0.5 * n_low.get(lv, 0)
                elif n_new:
                    x = x - n_new * self._centre(lv)
            totals[lv] = x
        return totals

    def _new_samples(self, level, agg):
        """Samples a step adds to level ℓ's sums: fed at once (tuned, untruncated) or whole elements."""
        if level in self.p.immediate:
            return agg.n_low.get(level, 0)
        return element_size(level) * agg.counts.get(level, 0)

    def _covered(self, level):
        """Samples level ℓ's sums cover so far."""
        if level in self.p.immediate:
            return self.samples_in[level]
        return element_size(level) * self.counts[level]

    def _centre(self, level):
        s = element_size(level)
        if level not in self.p.prior_set:
            return 0.5 * s
        centre = self._centres.get(level)
        if centre is None:
            # Fixed once the level's prior is: computed once per activation.
            centre = self._centres[level] = self._prior_centre(level, s)
        return centre

    def _prior_centre(self, level, s):
        """The centre of a level with a prior (a float with d = 1, else a d-array)."""
        c = s * self._prior_values(level)
        if self.p.preset == "paper":
            return float(c[0]) if self._scalar else c
        # Tuned: midpoint of J_ℓ = I_ℓ ∩ [0, s], so |Π(S) − centre| <= min(Δ_ℓ, s/2).
        D = self.p.Delta[level]
        c = (np.maximum(c - D, 0.0) + np.minimum(c + D, s)) / 2
        return float(c[0]) if self._scalar else c

    def _output(self, agg):
        p = self.p
        if self._active_sets is None:
            # Changes only when a level activates.
            whole = tuple(j for j, group in enumerate(p.count_groups)
                          if all(self.active[lv] for lv in group))
            self._active_sets = (
                [lv for lv in p.levels if self.active[lv]],
                [j for j, group in enumerate(p.tree_groups) if any(self.active[lv] for lv in group)],
                whole, tuple(j for j in range(len(p.count_groups)) if j not in whole))
        active, tree_keys = self._active_sets[:2]
        if not p.participation:
            est01, std01, ci01, den = self._estimate_values(active, tree_keys)
            diverse = self._diverse_values()
        else:
            est01, std01, ci01, den, bound_std = self._estimate_participation(tree_keys)
            diverse = self._diverse_participation()
        if p.prior == "release":
            self._update_bound(est01, std01 if not p.participation else bound_std, den)
        return self._release(agg, active, est01, std01, ci01, den, diverse)

    def _estimate_values(self, active, tree_keys):
        """``(estimate, std, 95 % half-width, denominator)`` in [0, 1] units; counts public (M-1)."""
        p = self.p
        num = sum(self._released[key] for key in tree_keys)
        den = float(sum(self._covered(lv) for lv in active))
        est01 = np.asarray(num, dtype=np.float64) / den if den > 0 else np.full(p.dim, 0.5)
        trees = [self.trees[key] for key in tree_keys] if self.t else []
        std = math.sqrt(sum(tr.noise_std(self.t) ** 2 for tr in trees))
        std01 = std / den if den > 0 else math.inf
        if den <= 0:
            ci01 = math.inf
        elif p.noise == "gaussian":
            ci01 = gaussian_halfwidth(std01)
        elif all(hasattr(tr, "noise_scales") for tr in trees):
            # Trees expose their independent Laplace node scales: exact interval.
            ci01 = laplace_sum_halfwidth(
                [s for tr in trees for s in tr.noise_scales(self.t)]) / den
        else:
            # Other mechanisms mix their Laplace noises; a Bonferroni union of
            # the per-tree exact intervals keeps coverage >= 95 %.
            ci01 = sum(tr.ci_halfwidth(self.t, 1 - 0.05 / len(trees)) for tr in trees) / den
        return est01, std01, ci01, den

    def _estimate_participation(self, tree_keys):
        """``(estimate, std, half-width, denominator, activation std)`` from noisy counts (M-5).

        With d = 1 the estimate and its std are floats, else d-arrays (``_init_fast``)."""
        p = self.p
        scalar = self._scalar
        nc = self._nc
        released = self._released
        if scalar:
            num = sum(released[key] for key in tree_keys) + 0.0
        else:
            num = sum(np.asarray(released[key], dtype=np.float64) for key in tree_keys)
            num = num + np.zeros(p.dim)
        den = 0.0
        groups = self._active_sets[2]
        # Per count coordinate: samples per unit and centre per sample (levels of a
        # merged coordinate are untruncated and share the centre ½).
        units = p.count_unit
        centres = self._group_centres
        if centres is None:
            # Fixed while the active levels are: a level's prior is set when it activates.
            centres = self._group_centres = {
                j: self._centre(p.count_groups[j][0]) / element_size(p.count_groups[j][0])
                for j in groups}
        for j in groups:
            num = num + centres[j] * units[j] * nc[j]
            den += units[j] * nc[j]
        den_raw = den
        # First-order (delta-method) std: tree noise plus the count noise
        # weighted by how far each coordinate's centre is from the estimate
        # (coordinate j of the count tree carries v_j times its count: noise cstd/v_j).
        t = self.t
        tokens = self._tokens
        cstd = _public_noise(self.count_tree, tokens["count"], t, "std")
        tvar = sum(_public_noise(self.trees[key], tokens[key], t, "std") ** 2 for key in tree_keys)
        # Public: a function of t and of which coordinates are in, shared by every stream.
        eta, sd_den, floor = _count_noise(cstd, groups, *self._count_key)
        # Post-processing of noisy counts: the denominator is at least one sample
        # and, tuned, at least its noise's 95 % half-width (public). Below that a
        # ratio estimate divides by noise (heavy Laplace tails made single runs
        # of the routes stream miss by the whole range); the missing mass is
        # filled with samples at the public centre ½, shrinking toward it.
        if p.preset == "paper":
            den = max(den, 1.0)
        else:
            if den < floor:
                num = num + 0.5 * (floor - den)
                den = floor
        est01 = num / den

        if scalar:
            # Squares as products, as NumPy squares an array (x ** 2 on a float calls pow).
            var = tvar + sum(_square(units[j] * (centres[j] - est01) * eta[j]) for j in groups)
            std01 = math.sqrt(var) / den
        else:
            var = tvar + sum((units[j] * (centres[j] - est01) * eta[j]) ** 2 for j in groups)
            std01 = np.sqrt(var) / den
        ci01 = _Z95 * std01
        # For the activation bound: the error is exactly (a − r·b)/den̂, with a, b the
        # numerator and denominator noises and r the exact mean. The std sd(r) of
        # a − r·b satisfies sd(r) <= sd(est) + |r − est|·sd(b) (triangle inequality),
        # so |error| <= z·sd(r)/den̂ implies |error| <= z·sd(est)/(den̂ − z·sd(b)).
        z = _Z_PRIOR
        slack = den_raw - z * sd_den
        if slack > 0:
            bound_std = std01 * den / slack
        else:
            bound_std = math.inf if scalar else np.full(p.dim, math.inf)
        return est01, std01, ci01, den, bound_std

    def _release(self, agg, active, est01, std01, ci01, den, diverse):
        """The :class:`MeanStep` in the units of ``[lower, upper]`` (post-processing)."""
        p = self.p
        if self._scalar and p.participation:
            # Floats throughout (_estimate_participation): the same products and sum.
            R = self._range0
            estimate, noise_std, ci95 = float(self._lo0 + R * est01), float(R * std01), float(R * ci01)
            return MeanStep(self.t, estimate, bool(diverse), noise_std, ci95, den, tuple(active),
                            {lv: self._prior_values(lv).tolist() for lv in self.prior}, agg.events)
        R = self.upper - self.lower
        estimate = self.lower + R * est01
        noise_std = R * std01
        ci95 = R * ci01
        if p.dim == 1:
            estimate, noise_std, ci95 = float(estimate[0]), float(np.ravel(noise_std)[0]), float(np.ravel(ci95)[0])
        else:
            noise_std = np.broadcast_to(noise_std, (p.dim,)).copy()
            ci95 = np.broadcast_to(ci95, (p.dim,)).copy()
        return MeanStep(t=self.t, estimate=estimate, diverse=bool(diverse), noise_std=noise_std,
                        ci95=ci95, denominator=den, active=tuple(active),
                        priors={lv: self._prior_values(lv).tolist() for lv in self.prior},
                        events=agg.events)

    def _update_bound(self, est01, std01, den):
        """Tuned preset: keep this release and a public bound on its distance from μ (max over coordinates).

        The bound is :func:`prior_error_bound`; under participation N and the
        std are the noisy, first-order ones. Everything here is computed from released
        values and public constants, so activation is post-processing.
        """
        if self._scalar and self.p.participation:
            # The float estimate of _estimate_participation, read as the array it stands for.
            self._last_est01, self._last_float = None, est01
            std = float(std01)
        else:
            self.last_est01 = np.asarray(est01, dtype=np.float64).copy()
            std = float(np.max(std01))
        if den <= 0 or not math.isfinite(std):
            self.last_bound = math.inf
            return
        self.last_bound = prior_error_bound(std, den)

    def _diverse_values(self):
        """Canonical Div(t) (M-1, M-5): ℓ* = ⌊log2 M_t⌋ ≤ 1 or A_{ℓ*} ≥ 2^{ℓ*−1}k_{ℓ*}. Public.

        With the release prior (tuned preset): every level up to ℓ* is active."""
        if self.max_count <= 0:
            return False
        top = min(self.max_count.bit_length() - 1, self.p.L)
        if self.p.prior == "release":
            return all(self.active[lv] for lv in self.p.levels if lv <= top)
        return top <= 1 or self.a[top] >= self.p.activation_threshold(top)

    def _diverse_participation(self):
        """Participation: M_t is private, so the flag says every level whose noisy
        element count exceeds its 95 % noise half-width is active (post-processing)."""
        margin = _public_noise(self.count_tree, self._tokens["count"], self.count_tree.t, "ci")
        nc, weights = self._nc, self._weight_scalars
        return all(nc[j] <= margin / weights[j] for j in self._active_sets[3])


#: gaussian_halfwidth(1.0) and gaussian_halfwidth(1.0, PRIOR_CONFIDENCE): the z of the 95 %
#: interval and of the activation bound, asked at every step of every stream.
_Z95 = gaussian_halfwidth(1.0)
_Z_PRIOR = gaussian_halfwidth(1.0, PRIOR_CONFIDENCE)


def _clip(x: float, low: float, high: float) -> float:
    """``np.clip`` of one float: the bound only when x is strictly outside it (so that a
    signed zero stays as NumPy leaves it)."""
    if not x >= low:
        x = low
    if not x <= high:
        x = high
    return x


def _scalar(value: Any) -> float:
    """The float of a 1-vector (an array of shape (1,), or already a float)."""
    return value if type(value) is float else float(np.ravel(value)[0])


def _square(x: Any) -> Any:
    return x * x


#: Public noise figures of counters by (configuration token, t, what): every stream of a
#: transform has counters of the same few configurations, and each asks at every step.
_PUBLIC_NOISE: Dict[Any, float] = {}
_CONFIG_TOKENS: Dict[Any, int] = {}
_NEXT_TOKEN = itertools.count()


def _config_token(tree: Any) -> Optional[int]:
    """A small key for a counter's class and configuration (None: no configuration to key by)."""
    config = getattr(tree, "config", None)
    if config is None:
        return None
    key = (type(tree), config)
    token = _CONFIG_TOKENS.get(key)
    if token is None:
        if len(_CONFIG_TOKENS) >= 4096:
            _CONFIG_TOKENS.clear()
        # Never reused: a token cached below always means one configuration.
        token = _CONFIG_TOKENS[key] = next(_NEXT_TOKEN)
    return token


def _public_noise(tree: Any, token: Optional[int], t: int, what: str) -> float:
    """``tree.noise_std(t)`` (``what="std"``) or ``tree.ci_halfwidth(t)`` (``"ci"``), computed
    once per configuration and t: both are public functions of these alone (C-7)."""
    if token is None:
        return tree.noise_std(t) if what == "std" else tree.ci_halfwidth(t)
    key = (token, t, what)
    value = _PUBLIC_NOISE.get(key)
    if value is None:
        if len(_PUBLIC_NOISE) >= 65536:
            _PUBLIC_NOISE.clear()
        value = _PUBLIC_NOISE[key] = tree.noise_std(t) if what == "std" else tree.ci_halfwidth(t)
    return value


@functools.lru_cache(maxsize=4096)
def _count_noise(cstd: float, groups: tuple, units: tuple, weights: tuple) -> tuple:
    """``(η_j per coordinate, sd of the noisy denominator, its tuned floor)`` of
    :meth:`ContinualMeanCore._estimate_participation`: public, a function of the count
    tree's std at t and of which coordinates are in (M-5)."""
    eta = {j: cstd / weights[j] for j in groups}
    sd_den = math.sqrt(sum((units[j] * eta[j]) ** 2 for j in groups))
    floor = max(1.0, gaussian_halfwidth(sd_den))
    return eta, sd_den, floor


def _tree_from(state: Any, source: Any) -> Any:
    return get_mechanism(state["mechanism"]).from_state(state, rng=source)


def _int_arrays(value: Dict[Any, Any]) -> Dict[Any, np.ndarray]:
    return {k: np.asarray(v, dtype=np.int64) for k, v in value.items()}


def _float_arrays(value: Dict[Any, Any]) -> Dict[Any, np.ndarray]:
    return {k: float_array(v) for k, v in value.items()}


def _store_from(store: Dict[Any, Any]) -> Dict[Any, list]:
    return {k: [(i, float_array(x)) for i, x in v] for k, v in store.items()}


def _query_from(query: Any) -> Any:
    return (float_array(query[0]), float(query[1]), int(query[2]))


@dataclasses.dataclass(frozen=True)
class ContinualMeanState(StateRecord):
    """The state of a :class:`ContinualMeanCore`: its name, then the core attributes of the
    same names in their saved order (the trees as their own states). ``last_est01`` and
    ``last_bound`` may be missing: states saved before they existed read as no previous
    release."""

    mechanism: str
    t: int
    trees: Dict[Any, Dict[str, Any]]
    count_tree: Optional[Dict[str, Any]]
    active: Dict[Any, bool] = state_field(decode=dict)
    prior: Dict[Any, np.ndarray] = state_field(decode=_int_arrays)
    buffer: Dict[Any, np.ndarray] = state_field(decode=_float_arrays)
    counts: Dict[Any, int] = state_field(decode=dict)
    samples_in: Dict[Any, int] = state_field(decode=dict)
    a: Dict[Any, int] = state_field(decode=dict)
    max_count: int = state_field()
    store: Dict[Any, list] = state_field(decode=_store_from)
    noisy_counts: Optional[np.ndarray] = state_field(decode=optional(float_array))
    last_est01: Optional[np.ndarray] = state_field(decode=optional(float_array), default=None,
                                                   kw_only=True)
    last_bound: float = state_field(decode=float, default=math.inf, kw_only=True)
    prefix_mean: np.ndarray = state_field(decode=float_array, kw_only=True)
    prefix_inv: float = state_field(decode=float, kw_only=True)
    query: Optional[tuple] = state_field(decode=optional(_query_from), kw_only=True)


#: The record fields that are not plain core attributes (the trees need the noise source).
_SPECIAL = ("mechanism", "trees", "count_tree")
