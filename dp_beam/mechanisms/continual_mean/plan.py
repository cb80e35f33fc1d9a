"""The tuned preset's data-independent plan for :class:`~.params.MeanParams` (seed 003).

docs/privacy/mean.md M-8 (the tuned preset keeps the guarantee of M-3 to M-7):
the tuning constants, the choice of the prior ratio θ and of the
prior query by a model of the end-of-stream error
(:meth:`TunedPlan.planned_error`), the value trees, the count-tree weights
and the budget split by use. The inputs are the declared configuration,
never data, so the plan is public; the docstring of
:class:`~.params.MeanParams` states each change's privacy argument.
"""

import functools
import math
from typing import List, Optional, Tuple

import numpy as np

from ..calibration import eps_from_rho_delta, rho_from_eps_delta
from ..halfwidths import gaussian_halfwidth
from ..noise import ZeroNoise
from ..counting.registry import get_mechanism
from .schedule import element_size

__all__ = [
    "PRIOR_RATIOS",
    "QUERY_SHARE",
    "PLAN_HORIZON",
    "PLAN_USER_FRACTIONS",
    "CLIP_TAIL",
    "LAPLACE_TREES",
    "PRIOR_CONFIDENCE",
    "CENTRE_OFFSET",
    "prior_error_bound",
    "TunedPlan",
]


#: Tuned preset: the candidates for θ, the accuracy target of a level's prior
#: as a multiple of the level's Hoeffding truncation term (γ_ℓ·2^{ℓ−1} =
#: θ·H_ℓ). Smaller θ narrows I_ℓ but needs a more precise prior, so the level
#: activates later or, with few users, never; ``math.inf`` gives no level a
#: prior. :class:`MeanParams` takes the candidate whose planned error
#: (:meth:`MeanParams.planned_error`, public inputs only) is worst off the best
#: by the least factor over :data:`PLAN_USER_FRACTIONS`. On the flights
#: stream θ = 1 measured best, on the routes stream (223 users) larger θ
#: (benchmarks/user_mean_accuracy.py).
PRIOR_RATIOS = (1.0, 1.5, 2.0, 3.0, math.inf)

#: Tuned preset, ``neighbours="values"``: the share of ε (Laplace) or ρ
#: (Gaussian) that the prior query takes when the level plan chooses it (see
#: :class:`MeanParams` "prior query"); the trees share the rest. Chosen with a
#: prototype of the query on the routes stream (223 users, Laplace, ε = 1, 20
#: seeds): shares 0.1, 0.2 and 0.3 gave 1.16, 0.87 and 0.95 times Algorithm 2's
#: end-of-year error at their best θ. Accuracy only: never data.
QUERY_SHARE = 0.2

#: Tuned preset: the step count at which :meth:`MeanParams.planned_error`
#: evaluates the counters' noise when the horizon is unbounded (None).
PLAN_HORIZON = 1024

#: Tuned preset: the user counts, as fractions of ``max_users``, the plan of θ
#: hedges over (see :class:`MeanParams` "level plan").
PLAN_USER_FRACTIONS = (1.0, 0.5)

#: Tuned preset: per-element clipping tail. I_ℓ's Hoeffding term is
#: ``H_ℓ = √(s·ln(1/CLIP_TAIL)/2)``, so an i.i.d. level sum leaves
#: ``[sμ − H_ℓ, sμ + H_ℓ]`` with probability ≤ 2·CLIP_TAIL and the expected
#: clipped mass per sample is ≤ CLIP_TAIL/(2H_ℓ) (Mills-ratio bound on the
#: Hoeffding tail). Accuracy only: never data.
CLIP_TAIL = 0.03

#: Tuned preset, Laplace noise: how the levels share value trees: ``"single"``
#: (one tree for all levels), ``"split"`` (untruncated levels / truncated
#: levels) or ``"per_level"`` (the paper's B_ℓ). Gaussian noise always uses one
#: tree per level (see :class:`MeanParams` "value trees"). Chosen by
#: measurement (benchmarks/user_mean_accuracy.py): on the flights stream at
#: ε = 1 the end errors relative to Algorithm 2 were 0.75/0.71 (single),
#: 0.75/0.99 (split), 1.31/1.39 (per level) under participation/values.
LAPLACE_TREES = "single"

#: Tuned preset: confidence of the error bound that activates a level (see
#: :meth:`ContinualMeanCore._update_bound`). Accuracy only: never data.
PRIOR_CONFIDENCE = 0.95

#: Tuned preset, participation: the distance of an untruncated level's centre
#: (½ per sample) from the mean that the count-tree weights plan for, per sample.
#: Worst case ½; ¼ is the middle of [0, ½]. Accuracy only: never data.
CENTRE_OFFSET = 0.25


def prior_error_bound(std: float, den: float) -> float:
    """Tuned preset: public bound on a release's distance from μ, used to activate a level.

    ``z·std + √(ln(2/(1−c))/(2N))`` with c = :data:`PRIOR_CONFIDENCE` and z its
    two-sided normal quantile: the noise (Gaussian, or a sum of many Laplace
    nodes, close to Gaussian) and Hoeffding's deviation of the mean of the
    N = ``den`` included samples. Shared by the core's activation and the plan.
    """
    noise = gaussian_halfwidth(std, PRIOR_CONFIDENCE) if std > 0 else 0.0
    return noise + math.sqrt(math.log(2 / (1 - PRIOR_CONFIDENCE)) / (2 * den))


@functools.lru_cache(maxsize=32)
def _unit_noise_std(mechanism, noise, delta, horizon, t):
    """Noise std at step t of ``mechanism`` calibrated to sensitivity 1 and ε = 1 (Laplace) or
    the ρ of (1, δ) (Gaussian, zCDP): the stds of :meth:`MeanParams.planned_error` scale from it."""
    kw = dict(epsilon=1.0, sensitivity=1.0, horizon=horizon, dim=1, rng=ZeroNoise())
    if noise == "gaussian":
        kw.update(noise="gaussian", delta=delta, calibration="zcdp")
    return float(get_mechanism(mechanism)(**kw).noise_std(t))


def _clip_term(s):
    """``H = √(s·ln(1/CLIP_TAIL)/2)``: Hoeffding gives ``P(|S − sμ| > H) <= 2·CLIP_TAIL`` for
    a sum S of s i.i.d. samples in [0, 1], and ``E[(|S − sμ| − H)+] <= ∫_H^∞ 2e^{−2u²/s}du
    <= s·CLIP_TAIL/(2H)``, i.e. at most CLIP_TAIL/(2H) of clipped mass per sample."""
    return math.sqrt(s * math.log(1 / CLIP_TAIL) / 2)


class TunedPlan:
    """The tuned preset's part of :class:`~.params.MeanParams`, mixed into it.

    Reads the validated configuration and calls the sensitivities
    (``group_sensitivity``, ``count_sensitivity``) of the class it is mixed
    into; sets every constant that ``preset="tuned"`` derives.
    """

    def _init_tuned(self):
        self.prior = "release"
        self.median_levels = []
        self.eps_median = self.eps_median_coord = None
        self.k = {}
        thetas = PRIOR_RATIOS if self.prior_ratio is None else (self.prior_ratio,)
        # The prior query reads user means, which only the values relation makes
        # cheap to trigger (user counts are public there); see "prior query".
        queries = (False, True) if self.participation is False else (False,)
        if self.prior_query is not None:
            queries = (self.prior_query,)
        candidates = [(theta, q) for q in queries for theta in thetas]
        if len(candidates) == 1:
            self._tuned_layout(*candidates[0])
            if self.query and not self.prior_levels:
                raise ValueError("prior_query=True needs a level with a prior: none for this "
                                 "max_samples_per_user and prior_ratio")
            return
        # Plan θ and the query from public inputs only (see "level plan" in the class
        # docstring): least worst-case ratio to the best plan over the user counts n·f.
        errors = {}
        for cand in candidates:
            self._tuned_layout(*cand)
            if cand[1] and not self.prior_levels:
                continue                              # a query no level could use
            errors[cand] = [self.planned_error(self.n * f)[0] for f in PLAN_USER_FRACTIONS]
        if not errors:
            # Only queries were asked for (prior_query=True), and no ratio gives a level a prior.
            raise ValueError("prior_query=True needs a level with a prior: none for this "
                             "max_samples_per_user at any prior_ratio")
        candidates = list(errors)
        best = [min(e[i] for e in errors.values()) for i in range(len(PLAN_USER_FRACTIONS))]
        regret = {cand: max(e / b for e, b in zip(errs, best)) for cand, errs in errors.items()}
        self._tuned_layout(*min(candidates, key=lambda cand: regret[cand]))

    def _tuned_layout(self, theta, query=False):
        """Every tuned constant for prior ratio θ (``math.inf``: no level takes a prior) and
        with or without the prior query."""
        self.prior_ratio_used = theta
        self.query = bool(query)
        self.G, self.gamma, self.Delta, self.width, self.element_bound = {}, {}, {}, {}, {}
        self.prior_levels = []
        for level in self.levels:
            s = element_size(level)
            self.width[level] = float(s)
            self.element_bound[level] = s / 2 if self.participation else float(s)
            if level <= 1 or math.isinf(theta):
                continue
            H = _clip_term(s)
            G = math.ceil(2 * 2 ** (level / 2))
            gamma = theta * H / s
            Delta = H + s * (gamma + 1 / (2 * G) + self.user_spread)
            if 2 * Delta >= s:
                continue                                   # truncation cannot help: no prior
            self.prior_levels.append(level)
            self.G[level], self.gamma[level], self.Delta[level] = G, gamma, Delta
            self.width[level] = 2 * Delta
            self.element_bound[level] = Delta if self.participation else 2 * Delta
        weight = self._tuned_trees()
        self._tuned_budget(weight)
        self.query_target = self._tuned_query_target() if self.query else None

    def _tuned_trees(self):
        """The value trees and, under participation, the count tree's coordinates and
        weights; returns each tree's planned error weight (docs/privacy/mean.md M-8)."""
        lap = self.noise == "laplace"
        power = 2 / 3 if lap else 1.0
        plain_levels = tuple(lv for lv in self.levels if lv not in self.G)
        if not lap or LAPLACE_TREES == "per_level":
            self.tree_groups = [(lv,) for lv in self.levels]
        elif LAPLACE_TREES == "single" or not self.prior_levels:
            self.tree_groups = [tuple(self.levels)]
        else:
            self.tree_groups = [plain_levels, tuple(self.prior_levels)]
        weight = {j: self.group_sensitivity(j) ** power for j in range(len(self.tree_groups))}
        if self.participation:
            # Count coordinates: the untruncated levels share the centre ½ per
            # sample, so one coordinate counts their samples (in units of
            # S_u = Σ s_ℓ, at most 1 per user); each truncated level counts its
            # elements (at most 1 per user).
            S_u = float(sum(element_size(lv) for lv in plain_levels))
            self.count_groups = [plain_levels] + [(lv,) for lv in self.prior_levels]
            self.count_unit = [S_u] + [float(element_size(lv)) for lv in self.prior_levels]
            # Planned weight of each coordinate's noise in the estimate: the
            # distance of its centre from μ times its unit. A truncated level's
            # centre is off by the prior's error, typically a quarter of its
            # activation bound γ_ℓ, plus the grid's half-step.
            w = np.array([S_u * CENTRE_OFFSET] +
                         [element_size(lv) * (self.gamma[lv] / 4 + 1 / (2 * self.G[lv]))
                          for lv in self.prior_levels])
            v = (w / w.max()) ** (2 / 3 if lap else 0.5)
            self.count_weights = v
            self.count_offsets = w
            csens = float(v.sum()) if lap else float(np.sqrt((v * v).sum()))
            # Planned count error: σ per unit-weight coordinate ∝ csens, times √Σ(w/v)².
            weight["count"] = (csens * float(np.sqrt(((w / v) ** 2).sum()))) ** power
        else:
            self.count_groups, self.count_unit = [], []
            self.count_weights = self.count_offsets = np.zeros(0)
        return weight

    def _tuned_budget(self, weight):
        """ε (Laplace) or ρ (Gaussian) by use: the query's fixed share, the trees the rest
        in proportion to ``weight`` (basic or zCDP composition, M-7)."""
        lap = self.noise == "laplace"
        total = sum(weight.values())
        # The prior query takes a fixed share; the trees split the rest as planned.
        share = QUERY_SHARE if self.query else 0.0
        if lap:
            self.eps_level = {key: (1 - share) * self.epsilon * wt / total for key, wt in weight.items()}
            self.rho_level = None
            if self.query:
                self.eps_level["query"] = share * self.epsilon
        else:
            rho = self.rho_total = rho_from_eps_delta(self.epsilon, self.delta)
            self.rho_level = {key: (1 - share) * rho * wt / total for key, wt in weight.items()}
            if self.query:
                self.rho_level["query"] = share * rho
            self.eps_level = {key: eps_from_rho_delta(r, self.delta) for key, r in self.rho_level.items()}

    def _tuned_query_target(self):
        """The bound at which the prior query fires: the target of the most demanding
        level it can serve at n·min(PLAN_USER_FRACTIONS) users (the hedge of the plan);
        with no such level, the widest one's."""
        fewest = self.n * min(PLAN_USER_FRACTIONS)
        floor = self.query_bound(fewest, fewest / (1 << self.L))
        usable = [self.gamma[lv] for lv in self.prior_levels if self.gamma[lv] >= floor]
        return (min(usable) if usable else
                max((self.gamma[lv] for lv in self.prior_levels), default=0.0))

    def planned_error(self, users: Optional[float] = None) -> Tuple[float, List[int]]:
        """Tuned preset: the planned end-of-stream error of the estimate and the levels planned to activate.

        A model run from public inputs only (n, m, ε or ρ, the counters,
        their horizon or :data:`PLAN_HORIZON`): n users, each with m samples,
        whose level sums lie near their mean. Levels without a prior are
        active; a truncated level ℓ is planned to activate when the error
        bound of a release that covers the levels below it
        (:meth:`ContinualMeanCore._update_bound`, with the counters' noise at
        the horizon and n·Σ 2^{ℓ'−1} samples) is at most γ_ℓ, in increasing ℓ,
        since each activation sharpens the next prior; with the prior query,
        every level whose γ_ℓ is at least :attr:`query_target` activates too
        when the query's bound over n users of 2^L samples reaches that
        target. The planned error is the std of that final release, from the value trees of active levels
        and the count noise weighted by the planned centre offsets, plus the
        sampling deviation (at most ½ per sample) between the covered samples
        and all n·2^L. Returns ``(error in [0, 1] units, active levels)``.
        Privacy does not depend on it: it only picks θ among
        :data:`PRIOR_RATIOS`.

        >>> from dp_beam.mechanisms.continual_mean import MeanParams
        >>> many = MeanParams(10_000, 512, 1.0, horizon=365)
        >>> many.prior_levels, many.planned_error()[1] == many.levels
        ([6, 7, 8, 9], True)
        >>> MeanParams(200, 512, 1.0, horizon=365).prior_levels   # too few users for a prior
        []
        """
        if self.preset != "tuned":
            raise ValueError("planned_error applies to preset='tuned' only")
        users = self.n if users is None else users
        lap = self.noise == "laplace"
        T = self.horizon or PLAN_HORIZON
        unit = _unit_noise_std(self.mechanism, self.noise, self.delta, self.horizon, T)
        rho_unit = None if lap else rho_from_eps_delta(1.0, self.delta)

        def std(sens, key):
            if lap:
                return unit * sens / self.eps_level[key]
            return unit * sens * math.sqrt(rho_unit / self.rho_level[key])

        tree_std = [std(self.group_sensitivity(j), j) for j in range(len(self.tree_groups))]
        count_std = std(self.count_sensitivity(), "count") if self.participation else 0.0

        def moments(active):
            return self._planned_moments(users, active, tree_std, count_std)

        z = gaussian_halfwidth(1.0, PRIOR_CONFIDENCE)
        active = set(self.levels) - set(self.prior_levels)
        # The query fires (at about its target) if the users can bring its bound there.
        fired = self.query and self.query_bound(users, users / (1 << self.L)) <= self.query_target
        for lv in sorted(self.prior_levels):
            if fired and self.gamma[lv] >= self.query_target:
                active.add(lv)
                continue
            den, var, den_sd = moments(active)
            slack = den - z * den_sd
            if slack <= 0 or prior_error_bound(math.sqrt(var) / slack, den) > self.gamma[lv]:
                break
            active.add(lv)
        den, var, _ = moments(active)
        full = users * (1 << self.L)
        error = math.sqrt(var / den ** 2 + 0.25 * max(1 / den - 1 / full, 0.0))
        return error, sorted(active)

    def _planned_moments(self, users, active, tree_std, count_std):
        """Planned ``(denominator, numerator noise variance, denominator noise std)`` of a
        release over ``users`` users with the levels ``active``."""
        den = users * sum(element_size(lv) for lv in active)
        var = sum(sd ** 2 for sd, group in zip(tree_std, self.tree_groups)
                  if any(lv in active for lv in group))
        den_var = 0.0
        for j, group in enumerate(self.count_groups):
            if all(lv in active for lv in group):
                eta = count_std / self.count_weights[j]
                var += (self.count_offsets[j] * eta) ** 2
                den_var += (self.count_unit[j] * eta) ** 2
        return den, var, math.sqrt(den_var)

    def query_noise_scale(self) -> float:
        """Tuned preset, prior query: the per-coordinate noise of the query's sum of user means
        (sensitivity 1 per coordinate, L1 d, L2 √d): Laplace scale d/ε_q, or Gaussian σ = √(d/(2ρ_q))."""
        if self.noise == "laplace":
            return self.dim / self.eps_level["query"]
        return math.sqrt(self.dim / (2 * self.rho_level["query"]))

    def query_noise_halfwidth(self) -> float:
        """Tuned preset, prior query: the ``PRIOR_CONFIDENCE`` half-width of that noise (Laplace:
        the exact quantile ``scale·ln(1/(1−c))``)."""
        if self.noise == "laplace":
            return self.query_noise_scale() * math.log(1 / (1 - PRIOR_CONFIDENCE))
        return gaussian_halfwidth(self.query_noise_scale(), PRIOR_CONFIDENCE)

    def query_bound(self, users: float, inv_count: float) -> float:
        """Tuned preset, prior query: public bound on the distance from μ of the query's estimate
        over ``users`` users whose released samples number k_u, with ``inv_count`` = Σ_u 1/k_u.

        The noise half-width over ``users`` plus Hoeffding's deviation of the
        mean of user means, a weighted mean of i.i.d. samples in [0, 1] with
        weights 1/(n·k_u): ``√(ln(2/(1−c))·Σ_u 1/k_u / 2)/n``. Under
        ``"values"`` both inputs are functions of arrival times, which that
        relation makes public, so the bound is public.
        """
        if users <= 0:
            return math.inf
        dev = math.sqrt(math.log(2 / (1 - PRIOR_CONFIDENCE)) * inv_count / 2)
        return (self.query_noise_halfwidth() + dev) / users
