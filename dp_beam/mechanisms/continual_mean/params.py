"""The constants of Algorithm 6 (seed 003): :class:`MeanParams`.

docs/privacy/mean.md M-3 to M-7 (the canonical constants, the sensitivities
and the budget split, with d dimensions) and M-8 (the worked values and the
tuned preset). The parameters are :class:`~.config.MeanConfig`; the tuned
preset's plan is in :mod:`.plan`; the sensitivities both presets calibrate
to are here.
"""

import math
from typing import Any, Optional

import numpy as np

from ...accounting.cost import Cost
from ..calibration import eps_from_rho_delta, rho_from_eps, rho_from_eps_delta
from ..counting.registry import default_mechanism
from .config import NEIGHBOURS, PRESETS, MeanConfig, h
from .median import grid
from .plan import TunedPlan
from .schedule import element_size

__all__ = [
    "NEIGHBOURS",
    "PRESETS",
    "MeanParams",
]


class MeanParams(TunedPlan):
    """Every constant of Algorithm 6 (docs/privacy/mean.md M-3 to M-7), for [0,1]-rescaled values.

    ``max_users`` (n) and ``max_samples_per_user`` (m) are configuration upper
    bounds (M-3); ``beta`` only affects Δ_ℓ, k_ℓ, the prior accuracy
    targets and reported bounds, never privacy (M-7). ``tree_levels`` fixes
    the tree depth used by :meth:`noise_scale` (the paper's ``h(n)``; default
    ``h(n)``); the actual trees take their depth from their horizon.

    ``noise=None`` means ``"gaussian"`` when ``delta`` is given, else
    ``"laplace"`` (pure ε stays the default without δ, so that a pipeline
    can compose it with pure-ε transforms under an ε-only budget).
    ``mechanism=None`` means the binary tree (C-3) for ``preset="paper"`` and
    ``default_mechanism(noise, horizon)`` (the most accurate continual
    counter for the noise family) for ``preset="tuned"``.

    Presets
    -------
    ``preset="paper"`` is Algorithm 6 with the canonical constants (M-7): equal shares of
    ε/2 (ρ/2) over the L+1 value trees (and the count tree), ε/(2L) per
    median (Algorithm 7), W_ℓ = 2Δ_ℓ (M-4). It reproduces the paper's parameter
    tables (``tree_levels=h(n)``) and is what the property tests use.

    ``preset="tuned"`` (default) keeps the algorithm (withhold-release,
    truncation of each level around a per-level prior, buffering until a
    level activates, the ratio estimate) and changes only data-independent
    constants, how the levels share noise, and where the prior comes from.
    Each change and its privacy argument:

    * *tight range* (M-8 (a); rescaling: M-4). A level-ℓ sum lies in
      ``[0, s]^d`` (s = 2^{ℓ−1}), so clipping it to ``I_ℓ`` lands in
      ``J_ℓ = I_ℓ ∩ [0, s]``, whose width is ``<= min(2Δ_ℓ, s)``: that is the
      per-coordinate element width under ``"values"``. Under
      ``"participation"`` the element is centred at the midpoint of ``J_ℓ``
      (a function of the prior only), so its magnitude is ``<= min(Δ_ℓ, s/2)``
      per coordinate (half the width of J_ℓ).
    * *skip trivial levels* (M-8 (b)). When ``2Δ_ℓ >= s`` truncation cannot
      shrink the width below the raw range s, so the level takes no prior:
      it is active from the first step and its raw sums are used (width s,
      centred magnitude s/2 under participation), like levels 0 and 1. The
      decision depends on m and the constants below only.
    * *truncation width for a bounded clipping bias*. ``Δ_ℓ = H_ℓ +
      s·(γ_ℓ + 1/(2G_ℓ))`` as eq. (9), but with ``H_ℓ = √(s·ln(1/τ)/2)``,
      τ = :data:`CLIP_TAIL`, instead of the union bound over n users and L
      levels: an i.i.d. level sum is clipped with probability <= 2τ and the
      expected clipped mass is <= τ/(2H_ℓ) per sample (Hoeffding, Mills
      ratio). Accuracy only; β no longer enters Δ_ℓ.
    * *prior from the release* (replaces Algorithm 7). The prior of a
      truncated level is the estimate already released at the previous
      step, clipped to [0, 1] and rounded to the public grid ``T_ℓ`` of
      ``G_ℓ = ⌈2·2^{ℓ/2}⌉`` points (the aggregates are projected for every grid
      point, as for the medians). It is post-processing of released outputs,
      so it costs no budget and needs no sample store; the value trees'
      later inputs are then chosen from earlier outputs, the adaptive
      sequential composition (AC-2) that the count tree's activation
      already relies on (each tree's calibration holds for any prior, since
      Δ_ℓ does not depend on it). A continual counter fed such adaptively
      chosen inputs keeps its guarantee: with independent Laplace node noises
      (tree, smooth binary; Honaker is post-processing of the tree), the chain
      rule over the nodes bounds the log-ratio of the output densities by
      Σ_nodes ε_node·|x_node − x'_node|/sens, at most ε for every history,
      because the sensitivity bound holds whatever the prior; Gaussian
      factorisation mechanisms (BLT, the Gaussian tree) are private for
      adaptively chosen streams with the same ρ (Denisov, McMahan, Rush,
      Smith, Thakurta 2022, the adaptive-stream theorem). A level activates at the first step whose
      previous release has a public error bound ``<= γ_ℓ = θ·H_ℓ/s`` (θ from
      the level plan below); the bound (:meth:`ContinualMeanCore._update_bound`)
      is computed from released values and public constants only, so
      activation is post-processing too. The bound holds with probability
      about :data:`PRIOR_CONFIDENCE` per activation (not the paper's 1 − β
      for the whole run): a worse prior shifts I_ℓ and clips more, which
      costs accuracy, never privacy.
    * *level plan* (data-independent). θ trades the width of I_ℓ against how
      precise a prior must be: with few users the release never gets
      precise enough for θ = 1, a truncated level never activates, its
      elements never count and its share of the budget is lost (measured:
      2.8–3.5× Algorithm 2's error on a stream of 223 users). θ is chosen
      among :data:`PRIOR_RATIOS` (``math.inf``: no level takes a prior, so
      every level is plain and, with plain levels fed at once, the estimate
      is Algorithm 2's) and, under ``"values"``, with or without the prior
      query (below) by :meth:`planned_error`, a model of the end-of-stream
      error that assumes n users with m samples each. Since ``max_users`` is
      an upper bound, the choice hedges: it minimises the worst ratio to the
      best candidate over ``n·f`` users, f in :data:`PLAN_USER_FRACTIONS`.
      The inputs are the declared n, m, ε (δ), noise, counter and horizon,
      never data, so the choice is public; each candidate is calibrated to
      the whole budget like any fixed θ. ``prior_ratio`` forces θ.
    * *prior query* (``"values"``, when the plan chooses it). With few
      users the release is never precise enough for a narrow prior, because
      every step of a continual counter pays for its tree; a single noisy
      mean is about ten times as precise for the same budget. The query
      takes :data:`QUERY_SHARE` of ε (ρ) and is answered once: at the first
      step whose public bound (:meth:`query_bound`) is at most
      :attr:`query_target`, it releases ``(Σ_u m_u + noise)/n_t``, m_u the mean
      of user u's released samples and n_t the users so far. A user's m_u
      lies in [0, 1]^d and it adds one term, so the sum has sensitivity 1 per
      coordinate (L1 d, L2 √d) under ``"values"``; n_t, the k_u and hence
      the step and the bound depend on arrival times only, public under
      that relation (so the query is offered only there). A level then
      takes the query's estimate or the release, whichever has the smaller
      public bound, both post-processing; the budget composes sequentially
      (basic for ε, zCDP for ρ), so :meth:`privacy_cost` still sums to ε.
    * *user spread* (``user_spread``, default 0). The truncation widths
      assume i.i.d. users; users whose own means lie apart from the common
      mean see their level sums clipped, a bias that grows with s and shows
      once the noise is small (measured: 2.3–4.4× Algorithm 2's error with
      100,000 users of 4,096 samples). A declared public bound on how far
      a user's mean may lie from the common one, as a fraction of the
      range, widens every I_ℓ by s·``user_spread`` on each side. It enters
      Δ_ℓ, hence the element bounds the trees are calibrated to; like every
      width, it is public and changes accuracy only.
    * *clamped counts* (participation): the count coordinates are numbers
      of users or of elements (one per user), so the noisy counts are
      clamped to [0, n] (post-processing). The estimate's denominator is at
      least the 95 % half-width of its own noise (a public std); below it
      the missing mass is filled with samples at the centre ½, so a count
      that is mostly noise shrinks the release toward ½ instead of dividing
      by noise (post-processing).
    * *value trees by noise family* (:attr:`tree_groups`). A tree may take the
      per-step sum of several levels' (truncated, centred) elements: a user
      puts at most one element into each level, at any steps, so its
      per-step changes add up to at most ``Σ_ℓ sens_ℓ`` over the tree's levels
      in L1, and by the triangle inequality ``Σ_t ‖x_t − x'_t‖₂ <= Σ_ℓ sens_ℓ``:
      the sensitivity the counters are calibrated to (:meth:`group_sensitivity`).
      Gaussian: one tree per level with ρ_ℓ ∝ sens_ℓ, which minimises
      Σ σ_ℓ² ∝ Σ sens_ℓ²/ρ_ℓ at (Σ sens_ℓ)²/ρ, the variance of a single tree,
      while early releases (few active levels) carry only their own levels'
      noise. Laplace: one tree for all levels (:data:`LAPLACE_TREES`): any
      split is worse at the end, since the optimal ε_ℓ ∝ sens_ℓ^{2/3} gives
      ``(Σ sens_ℓ^{2/3})^{3/2} >= Σ sens_ℓ``.
    * *plain levels fed at once*. Withholding a level's samples until the
      element is complete serves only its truncation: an untruncated level
      ℓ takes each of a user's samples 2^{ℓ−1}+1 … 2^ℓ (level 0: the first)
      in the step it arrives. The user's changes to that level's input still
      add up to at most s (values) or s/2 (participation, each sample centred
      at ½), the element bound the trees are calibrated to, whatever the
      steps, so every sensitivity above holds unchanged; the released sums
      then cover every sample up to 2^L instead of 2^{⌊log2 M_u⌋} per user.
      Truncated levels still withhold (their elements must be complete to be
      clipped), and ``preset="paper"`` withholds every level (M-2).
    * *a small count tree* (participation). Untruncated levels share the
      centre ½ per sample, so one coordinate counts their samples in units
      of ``S_u = Σ s_ℓ`` over those levels (a user adds at most 1); each
      truncated level counts its elements (at most 1 per user). Coordinate j
      carries ``v_j`` times its count (public weights): L1 sensitivity Σ v_j,
      L2 √(Σ v_j²). The count noise reaches the estimate through the distance
      of each centre from μ, planned as ``w = S_u·CENTRE_OFFSET`` and
      ``s·(γ_ℓ/4 + 1/(2G_ℓ))``; ``v ∝ √w`` (Gaussian) or ``w^{2/3}`` (Laplace)
      minimises that error.
    * *budget by use* (data-independent): the value trees and the count tree
      share ε (Laplace, ∝ effective sensitivity^{2/3}) or ρ (Gaussian, ∝
      effective sensitivity; zCDP composition, the ρ add) as the planned
      error shares above.
    * *near-optimal counters*: the calibration above bounds the sum over
      steps of a user's changes to each tree's input, which any linear
      continual counter turns into its noise scale (its largest column norm
      times that sum, by the triangle inequality), so any counter applies;
      ``mechanism=None`` picks BLT (Gaussian) or smooth binary (Laplace,
      known horizon).

    Why not the private median with tuned constants: under participation the
    hashed array layout wastes partial buckets; on the flights stream (4,037
    aircraft) at most ~540 full arrays of 256 samples exist at the year's
    end, while even the zCDP exponential mechanism (ε²/8-zCDP) with the
    participation cost sensitivity 1 needs k of about 640 at ε = 1, so the
    top levels would never activate.

    Budgets are in :attr:`eps_level` / :attr:`rho_level` (keys: the index j
    of value tree ``tree_groups[j]`` — the level itself for the paper's one
    tree per level — and ``"count"``) for both presets; :attr:`eps_tree` /
    :attr:`rho_tree` are the paper's single per-tree values, a float or None
    (``rho_tree`` with Laplace noise; both with ``preset="tuned"``, whose
    trees have budgets by use).

    Built from one :class:`~.config.MeanConfig` (``MeanParams(config)``) or
    from its arguments (``MeanParams(n, m, epsilon, ...)``); :attr:`config`
    keeps it. The constants are read-only once derived.

    >>> p = MeanParams(1000, 16, 1.0, 0.1, neighbours="values", preset="paper")
    >>> p.L, p.eps_tree, p.eps_median, [p.k[l] for l in (2, 3, 4)]
    (4, 0.1, 0.125, [702, 791, 791])
    >>> round(p.noise_scale(4), 1)   # η_4 of the paper preset, n = 1000, m = 16 (M-7)
    3241.6
    >>> t = MeanParams(10_000, 512, 1.0, delta=1e-6, horizon=365)
    >>> t.noise, t.mechanism, t.prior_levels, t.median_levels
    ('gaussian', 'blt', [6, 7, 8, 9], [])
    >>> round(t.privacy_cost()["epsilon"], 12)
    1.0
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # One MeanConfig, or the arguments of MeanConfig itself: the parameter list is
        # written once, in MeanConfig.
        if len(args) == 1 and not kwargs and isinstance(args[0], MeanConfig):
            config = args[0]
        else:
            config = MeanConfig(*args, **kwargs)
        self.config = config
        self.preset = config.preset
        self.n = config.max_users
        self.m = config.max_samples_per_user
        self.epsilon = config.epsilon
        self.beta = config.beta
        self.dim = config.dim
        self.neighbours = config.neighbours
        self.noise = noise = config.resolved_noise()
        self.delta = config.delta if noise == "gaussian" else None
        self.horizon = config.horizon
        self.prior_ratio = config.prior_ratio
        self.prior_query = config.prior_query
        self.user_spread = config.user_spread
        # Any continual-counting mechanism works per level: the trees are
        # calibrated to a bound on the sum over steps of a user's changes (see
        # group_sensitivity), which a linear counter turns into its noise scale
        # through its largest column norm, whatever the factorisation.
        self.mechanism = config.mechanism or (
            "tree" if self.preset == "paper" else default_mechanism(noise, self.horizon))
        self.median_budget = config.median_budget or "per_L"
        self.tree_levels = h(self.n) if config.tree_levels is None else config.tree_levels
        self.L = self.m.bit_length() - 1                            # M-2: L = ⌊log2 m⌋
        self.levels = list(range(self.L + 1))
        self.participation = self.neighbours == "participation"
        self.eps_tree = self.rho_tree = None
        if self.preset == "paper":
            self._init_paper()
        else:
            self._init_tuned()
        self.prior_set = frozenset(self.prior_levels)
        # Tuned: untruncated levels take each sample as it arrives (see "plain levels
        # fed at once" in the class docstring); the paper withholds every level.
        self.immediate = (frozenset(lv for lv in self.levels if lv not in self.prior_set)
                          if self.preset == "tuned" else frozenset())
        self.n_trees = len([key for key in self.eps_level if key != "query"])
        self.count_dim = len(self.count_weights)
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        # The plan is derived once from the config: a changed constant would no longer
        # match the budget split it was calibrated with.
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"MeanParams is read-only after construction: cannot set {name!r}")
        object.__setattr__(self, name, value)

    # -- preset "paper": canonical constants (M-7) ---------------------------------

    def _init_paper(self):
        L, d = self.L, self.dim
        self.prior = "median"
        self.query, self.query_target = False, None
        self.median_levels = list(range(2, L + 1))
        self.prior_levels = list(self.median_levels)
        n_trees = L + 1 + (1 if self.participation else 0)
        self.tree_groups = [(lv,) for lv in self.levels]
        # Count tree coordinates: new elements per level, then A_ℓ/2^{ℓ−1} for ℓ = 2..L.
        self.count_groups = [(lv,) for lv in self.levels]
        self.count_unit = [float(element_size(lv)) for lv in self.levels]
        self.count_weights = np.ones((L + 1) + len(self.median_levels))
        n_medians = len(self.median_levels)
        if self.noise == "laplace":
            tree_share = self.epsilon / 2 if n_medians else self.epsilon
            self.eps_tree = tree_share / n_trees                      # ε/(2(L+1)) (values)
            if n_medians:
                div = L if self.median_budget == "per_L" else L - 1
                self.eps_median = self.epsilon / (2 * div)            # ε/(2L), M-6, M-7
            else:
                self.eps_median = None
            self.rho_tree = None
            self.eps_median_coord = None if self.eps_median is None else self.eps_median / d
        else:
            rho = rho_from_eps_delta(self.epsilon, self.delta)
            self.rho_total = rho
            tree_share = rho / 2 if n_medians else rho
            self.rho_tree = tree_share / n_trees
            # Tree given as (ε', δ) so that the zCDP calibration of the tree
            # lands on exactly ρ_tree (eps_from_rho_delta inverts it).
            self.eps_tree = eps_from_rho_delta(self.rho_tree, self.delta)
            if n_medians:
                self.eps_median_coord = math.sqrt(rho / (d * n_medians))
                self.eps_median = self.eps_median_coord * d
            else:
                self.eps_median = self.eps_median_coord = None
        keys = self.levels + (["count"] if self.participation else [])
        self.eps_level = {key: self.eps_tree for key in keys}
        self.rho_level = {key: self.rho_tree for key in keys} if self.noise == "gaussian" else None
        self.beta_median = self.beta / (6 * L) if L >= 1 else self.beta   # accuracy only (M-7)
        # Union bounds over coordinates use β/d (accuracy only, M-7).
        beta_m = self.beta_median / d
        beta_c = self.beta / d

        self.G, self.k, self.gamma, self.Delta, self.width, self.element_bound = {}, {}, {}, {}, {}, {}
        for level in self.levels:
            if level <= 1:
                self.width[level] = 1.0
                self.element_bound[level] = 0.5 if self.participation else 1.0
                continue
            s = 1 << (level - 1)
            G = math.ceil(2 ** (level / 2) / 2)
            k = math.ceil((16 / self.eps_median_coord) * math.log(G / beta_m))
            gamma = math.sqrt(math.log(2 * k / beta_m) / 2 ** level) + 1 / (2 * G)
            Delta = math.sqrt(s * math.log(6 * self.n * L / beta_c) / 2) + s * gamma
            self.G[level], self.k[level], self.gamma[level], self.Delta[level] = G, k, gamma, Delta
            self.width[level] = 2 * Delta
            self.element_bound[level] = Delta if self.participation else 2 * Delta

    # -- derived quantities -----------------------------------------------------------

    def tree_epsilon(self, key: Any) -> float:
        """ε given to the tree of level ``key`` (or ``"count"``); for Gaussian noise the
        (ε, δ) whose zCDP calibration is exactly :meth:`tree_rho`."""
        return self.eps_level[key]

    def tree_rho(self, key: Any) -> float:
        """ρ of the tree of level ``key`` (or ``"count"``): ε²/2 for Laplace trees."""
        if self.rho_level is None:
            return rho_from_eps(self.eps_level[key])
        return self.rho_level[key]

    def group_sensitivity(self, j: int) -> float:
        """Sensitivity of value tree j, fed the per-step sum of its levels' elements: ``Σ_{ℓ∈group} sens_ℓ``.

        A user puts at most one element into each level, at any steps; the
        per-step changes add up to at most ``Σ_ℓ sens_ℓ`` in L1 (Laplace) and,
        by the triangle inequality, ``Σ_t ‖x_t − x'_t‖₂ <= Σ_ℓ sens_ℓ`` (Gaussian),
        which is the sensitivity a continual counter is calibrated to."""
        return sum(self.tree_sensitivity(lv) for lv in self.tree_groups[j])

    def values_sensitivity(self) -> float:
        """``Σ_ℓ sens_ℓ`` over all levels: the sensitivity one tree for all levels would need."""
        return sum(self.tree_sensitivity(lv) for lv in self.levels)

    # Sensitivity of one user's whole contribution to a tree: one element per tree (M-3).
    def tree_sensitivity(self, level: int) -> float:
        """Per-user sensitivity of B_ℓ's input sequence: L1 ``d·e_ℓ`` (Laplace), L2 ``√d·e_ℓ`` (Gaussian)."""
        factor = self.dim if self.noise == "laplace" else math.sqrt(self.dim)
        return factor * self.element_bound[level]

    def count_sensitivity(self) -> float:
        """Per-user sensitivity of the count tree: a user adds at most ``v_j`` to coordinate j
        (paper: v = 1 over 2L coordinates, so L1 2L and L2 √(2L))."""
        v = self.count_weights
        return float(v.sum()) if self.noise == "laplace" else float(np.sqrt((v * v).sum()))

    def noise_scale(self, level: Any, levels: Optional[int] = None) -> float:
        """Node noise scale of B_ℓ (or ``"count"``) for a tree of ``levels`` levels (default ``tree_levels``).

        Laplace ``η_ℓ = h·sens_ℓ/ε_ℓ`` (eq. (10)); Gaussian σ for L2 sensitivity
        ``√h·sens_ℓ`` at ρ_ℓ (C-4, C-5).
        """
        levels = self.tree_levels if levels is None else levels
        sens = self.count_sensitivity() if level == "count" else self.group_sensitivity(level)
        if self.noise == "laplace":
            return levels * sens / self.eps_level[level]
        return math.sqrt(levels) * sens / math.sqrt(2 * self.rho_level[level])

    def centre(self, level: int, mu: Any) -> Any:
        """Centre 2^{ℓ−1}·μ̃ of I_ℓ (eq. (8)); ½ for levels 0, 1 (participation centring)."""
        if level <= 1:
            return 0.5
        return element_size(level) * mu

    def grid(self, level: int) -> np.ndarray:
        """The public grid T_ℓ of level ℓ's priors (M-6)."""
        return grid(self.G[level])

    def privacy_cost(self) -> Cost:
        """Total cost of the whole output sequence (M-7, M-8; Lemma 2.2 of arXiv:2212.09980)."""
        trees = list(self.eps_level)
        if self.noise == "laplace":
            eps = sum(self.eps_level[key] for key in trees)
            eps += len(self.median_levels) * (self.eps_median or 0.0)
            return Cost.laplace(eps)
        rho = sum(self.rho_level[key] for key in trees)
        rho += len(self.median_levels) * self.dim * (self.eps_median_coord or 0.0) ** 2 / 2
        return Cost.gaussian(rho, self.delta, epsilon=eps_from_rho_delta(rho, self.delta))

    def activation_threshold(self, level: int) -> int:
        """Samples ``2^{ℓ−1}·k_ℓ`` that activate B_ℓ (line 9 of Algorithm 6; median prior only)."""
        return element_size(level) * self.k[level]
