"""Continual mean estimation under user-level privacy (seed 003).

Spec withhold_release_and_composition.md §2 (Algorithms 2, 4, 5, 6, 7), §3
(bounded values, d dimensions) and §6 (the ambiguities and their canonical
resolutions). Engine-free: NumPy and OpenDP only, no Beam.

Pieces, each usable on its own:

* :class:`MeanParams` — every canonical constant of §2.9 (L, ε_B, ε_M, β_M,
  G_ℓ, k_ℓ, γ_ℓ, Δ_ℓ, W_ℓ, noise scales) for both neighbour relations.
* :func:`withhold_release` — the per-user exponential withhold-release
  schedule of §2.5 on an O(1) per-user state.
* :func:`private_median` — Algorithm 7 (§2.8): arrays, quantisation grid and
  the exponential mechanism.
* :class:`ContinualMeanCore` — the central part of Algorithm 6 (§2.9): the
  L+1 binary mechanisms, buffering of inactive levels, activation, medians and
  the estimate, fed one aggregate (:class:`MeanAggregate`) per time step. The
  Beam transform builds the same aggregates in parallel and feeds the same
  core, so the two share every formula.
* :class:`ContinualMean` — the engine-free whole: per-user state plus core.
* Baselines :class:`NaiveMean` (Algorithm 2), :class:`SingleTreeMean`
  (Algorithm 4) and :class:`MultiTreeMean` (Algorithm 5).

Neighbour relations (spec §2.0, §6 A16)
    ``neighbours="values"`` is the paper's model: two streams are neighbours
    when one user's *values* differ, the arrival pattern (who sends a sample
    when) being identical and public. Counts, release times, activation times
    and the diversity flag are then released for free. ``neighbours=
    "participation"`` (the default) protects the presence of a whole user:
    neighbours differ by adding or removing all samples of one user. Counts
    are then private too, so they are released through one more binary
    mechanism (the *count tree*), activation and the denominator of the
    estimate are read from noisy counts, elements are centred before they
    enter a tree and the medians use an array layout in which one user
    touches one array. It costs a little accuracy and is what a deployment
    that cannot make participation public needs.

Time indexing
    The paper feeds a tree B_ℓ one *element* at a time (horizon n). Here, as in
    every dp_beam transform, a tree is stepped once per *time step* with the
    sum of the elements of that step (an empty step feeds zero). Each user
    still puts at most one element into each B_ℓ over the whole stream, so a
    user changes the sequence of tree inputs by at most one element's
    sensitivity and the tree calibration of §1.2 applies with ``c_u = 1``;
    only the depth changes from ``h(n)`` to ``h(horizon in steps)`` (or the
    unbounded U2 construction). Feeding one sample per step reproduces the
    paper's schedule exactly. The parameter tables of §2.10 are reproduced by
    :class:`MeanParams` with ``tree_levels=h(n)``.

Sensitivities (spec §2.9 for values; derived here for participation)
    Values are rescaled to [0, 1] per coordinate (§3.1) and each user's sums
    are d-vectors.

    *values* (replace one user's values): a level-0/1 element is one sample,
    which moves by at most 1 per coordinate; a level-ℓ ≥ 2 element is
    projected onto ``I_ℓ = [c_ℓ − Δ_ℓ, c_ℓ + Δ_ℓ]`` (c_ℓ = 2^{ℓ−1}μ̃_ℓ), so it
    moves by at most the full width ``W_ℓ = 2Δ_ℓ`` (§6 A2). One user, one
    element per tree: tree L1 sensitivity ``d·W_ℓ``, L2 ``√d·W_ℓ``. Medians:
    a user's ≤ 2^{ℓ−1} samples are contiguous, so they touch ≤ 2 arrays and
    the cost ``c(y)`` moves by ≤ 2 (Claim E.1).

    *participation* (add/remove one user): an element is now present or
    absent, so what matters is its magnitude, not its spread. Each element is
    centred before it enters a tree: ``x − ½`` for levels 0 and 1 (|·| ≤ ½ per
    coordinate) and ``Π_{I_ℓ}(S) − c_ℓ`` for ℓ ≥ 2 (|·| ≤ Δ_ℓ, since the
    projection lands within Δ_ℓ of the centre). One user, one element per
    tree: tree sensitivity ``d·e_ℓ`` (L1) or ``√d·e_ℓ`` (L2) with ``e_0 = e_1 =
    ½`` and ``e_ℓ = Δ_ℓ``. The centres are added back with noisy counts from
    the count tree, whose per-step input is the vector of new elements per
    level ``(n_0..n_L)`` and of ``A_ℓ`` increments divided by ``2^{ℓ−1}``
    (ℓ = 2..L). Over the whole stream a user adds at most 1 to each of these
    2L coordinates (one element per level; ``min(M_u, 2^{ℓ−1})/2^{ℓ−1} ≤ 1``),
    so the count tree has L1 sensitivity 2L and L2 sensitivity √(2L) (L+1 and
    √(L+1) when L ≤ 1). The median uses *hashed* arrays: a public hash of the
    user id assigns each user to one of k_ℓ arrays, each array is filled with
    the first samples of its users in first-arrival order and only full arrays
    enter the cost. Adding or removing a user changes, creates or removes at
    most the one array of its bucket, so each of ``#{Ỹ < y}`` and
    ``#{Ỹ > y}`` moves by ≤ 1 and ``c(y)`` by ≤ 1: the cost sensitivity is 1.
    The contiguous layout of the paper would shift every later array (cost
    sensitivity up to k), which is why it is not used here. Everything else
    that reads data (activation, the denominator, the diversity flag, the
    choice of which samples fill the arrays up to the activation time) is a
    function of the data through the count tree's noisy output or of public
    quantities only, and the trees of a step are run after the count tree of
    that step: adaptive sequential composition (§4 R2) gives the total.
    Where a user's presence could still shift *which* of another user's
    samples enter an array (the first-arrival order within a bucket), the
    shift stays inside the user's own bucket, which is the one array already
    counted. The within-bucket argument assumes buckets are chosen by a
    public, data-independent hash (§4 R3).

Budget split (§2.9 "Privacy budget split")
    ε/2 to the binary mechanisms (equal shares over the L+1 value trees, plus
    the count tree under participation) and ε/(2L) to each of the L−1 medians
    (§6 A5 ``per_L``; ``per_L_minus_1`` gives ε/(2(L−1))). With L ≤ 1 there are
    no medians and the trees get all of ε. With d coordinates each median is
    run per coordinate at ``ε_M/d`` (basic composition, §3.3). Gaussian noise
    (``noise="gaussian"``, §3.3 [EXT]) works in zCDP: ρ = ρ(ε, δ) of §1.2 (a),
    ρ/2 to the trees and ρ/2 to the d·(L−1) pure-DP medians
    (``ε_m = √(ρ/(d(L−1)))``, each ``ε_m²/2``-zCDP).
"""

import hashlib
import math
import numbers
import pickle

import numpy as np

from .calibration import eps_from_rho_delta, rho_from_eps, rho_from_eps_delta
from .noise import (SecureNoise, SeededNoise, ZeroNoise, gaussian_halfwidth,
                    laplace_sum_halfwidth, make_noise)
from .registry import get_mechanism
from .tree import BinaryTreeMechanism

__all__ = [
    "NEIGHBOURS",
    "MeanParams",
    "MeanAggregate",
    "UserState",
    "withhold_release",
    "release_level",
    "element_size",
    "represented_count",
    "grid",
    "quantize",
    "median_cost",
    "exponential_mechanism",
    "private_median",
    "ContinualMeanCore",
    "ContinualMean",
    "MeanStep",
    "NaiveMean",
    "SingleTreeMean",
    "MultiTreeMean",
    "user_hash",
]

NEIGHBOURS = ("participation", "values")


def h(n):
    """Tree depth ``⌊log2 n⌋ + 1`` (spec §0.2, §6 A3)."""
    return int(n).bit_length()


def _pos_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _pos_real(name, value, upper=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    value = float(value)
    if value <= 0 or (upper is not None and value >= upper):
        bound = f" and < {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be > 0{bound}, got {value!r}")
    return value


def user_hash(user):
    """A public, stable 63-bit hash of a user id (same on every worker and run)."""
    return int.from_bytes(hashlib.sha256(pickle.dumps(user, protocol=4)).digest()[:8], "big") >> 1


def _bucket(uhash, level, k):
    digest = hashlib.sha256(f"{uhash}:{level}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % k


# -- the withhold-release schedule (spec §2.5) ---------------------------------

def element_size(level):
    """Samples summed in a level-ℓ element: 1 for ℓ ≤ 1, else 2^{ℓ−1} (§2.5)."""
    return 1 if level <= 1 else 1 << (level - 1)


def release_level(count, top):
    """The level released when a user's count reaches ``count``, or None.

    ``count = 2^ℓ`` with ``ℓ <= top`` releases level ℓ (§2.5); other counts
    withhold, and counts past ``2^top`` are never released (WR-6).
    """
    if count >= 1 and count & (count - 1) == 0:
        level = count.bit_length() - 1
        if level <= top:
            return level
    return None


def represented_count(count, top):
    """Samples of a user with ``count`` samples that released elements cover: 2^{⌊log2 M⌋} (§2.5)."""
    if count <= 0:
        return 0
    return 1 << min(count.bit_length() - 1, top)


class UserState:
    """Per-user state of the schedule: count M_u, running segment sum s_u, first step, hash.

    O(d) numbers per user (spec §2.5 "Implementation"). Plain tuple form via
    :meth:`to_tuple` for Beam state cells.
    """

    __slots__ = ("count", "segment", "first_step", "uhash")

    def __init__(self, count=0, segment=None, first_step=None, uhash=0):
        self.count = count
        self.segment = segment
        self.first_step = first_step
        self.uhash = uhash

    def to_tuple(self):
        seg = None if self.segment is None else tuple(float(v) for v in self.segment)
        return (self.count, seg, self.first_step, self.uhash)

    @classmethod
    def from_tuple(cls, t):
        if t is None:
            return cls()
        count, seg, first, uh = t
        return cls(count, None if seg is None else np.asarray(seg, dtype=np.float64), first, uh)


def withhold_release(state, x, top, store_upto, step=0):
    """Consume one sample x (a d-vector in [0,1]^d) of one user (spec §2.5, §2.9 lines 6–8, 14–18).

    Returns a dict with the user's new ``count``, the released ``level`` and
    raw ``element`` (or None), and ``sample`` = x when the sample's index is at
    most ``store_upto`` (= 2^{L−1}, the samples Algorithm 7 may read), else
    None. ``state`` is updated in place. The caller enforces the cap m.
    """
    x = np.asarray(x, dtype=np.float64)
    if state.count == 0:
        state.first_step = step
        state.segment = np.zeros_like(x)
    state.count += 1
    state.segment = state.segment + x
    out = {"count": state.count, "level": None, "element": None,
           "sample": x if state.count <= store_upto else None}
    level = release_level(state.count, top)
    if level is not None:
        out["level"] = level
        out["element"] = state.segment
        state.segment = np.zeros_like(x)
    return out


# -- parameters (spec §2.9, §2.10, §3) -----------------------------------------

class MeanParams:
    """Every constant of Algorithm 6 (spec §2.9), for [0,1]-rescaled values.

    ``max_users`` (n) and ``max_samples_per_user`` (m) are configuration upper
    bounds (§6 A15); ``beta`` only affects Δ_ℓ, k_ℓ and reported bounds, never
    privacy (§6 A6). ``tree_levels`` fixes the tree depth used by
    :meth:`noise_scale` (the paper's ``h(n)``; default ``h(n)``); the actual
    trees take their depth from their horizon.

    >>> p = MeanParams(1000, 16, 1.0, 0.1, neighbours="values")
    >>> p.L, p.eps_tree, p.eps_median, [p.k[l] for l in (2, 3, 4)]
    (4, 0.1, 0.125, [702, 791, 791])
    >>> round(p.noise_scale(4), 1)   # η_4 of §2.10 config A
    3241.6
    """

    def __init__(self, max_users, max_samples_per_user, epsilon, beta=0.1, *, dim=1,
                 neighbours="participation", noise="laplace", delta=None,
                 median_budget="per_L", tree_levels=None, mechanism="tree"):
        self.n = _pos_int("max_users", max_users)
        # Any continual-counting mechanism works per level: each user puts at
        # most one element into each level's tree, so its sensitivity is that
        # of a single participation whatever the factorisation.
        get_mechanism(mechanism)  # raises ValueError naming `mechanism`
        self.mechanism = mechanism
        self.m = _pos_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = _pos_real("epsilon", epsilon)
        self.beta = _pos_real("beta", beta, upper=1.0)
        self.dim = _pos_int("dim", dim)
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
        self.neighbours = neighbours
        if noise not in ("laplace", "gaussian"):
            raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
        self.noise = noise
        if noise == "gaussian":
            self.delta = _pos_real("delta", delta, upper=1.0)
        elif delta not in (None, 0, 0.0):
            raise ValueError(f"delta must be None for Laplace noise (pure epsilon-DP), got {delta!r}")
        else:
            self.delta = None
        if median_budget not in ("per_L", "per_L_minus_1"):
            raise ValueError(f"median_budget must be 'per_L' or 'per_L_minus_1', got {median_budget!r}")
        self.median_budget = median_budget
        self.tree_levels = h(self.n) if tree_levels is None else _pos_int("tree_levels", tree_levels)

        L = self.L = self.m.bit_length() - 1                       # §6 A4
        d = self.dim
        self.levels = list(range(L + 1))
        self.median_levels = list(range(2, L + 1))
        self.participation = neighbours == "participation"
        self.n_trees = L + 1 + (1 if self.participation else 0)
        # Count tree coordinates: new elements per level, then A_ℓ/2^{ℓ−1} for ℓ = 2..L.
        self.count_dim = (L + 1) + len(self.median_levels)

        n_medians = len(self.median_levels)
        if self.noise == "laplace":
            tree_share = self.epsilon / 2 if n_medians else self.epsilon
            self.eps_tree = tree_share / self.n_trees                 # ε/(2(L+1)) (values)
            if n_medians:
                div = L if median_budget == "per_L" else L - 1
                self.eps_median = self.epsilon / (2 * div)            # ε/(2L), §6 A5
            else:
                self.eps_median = None
            self.rho_tree = None
            self.eps_median_coord = None if self.eps_median is None else self.eps_median / d
        else:
            rho = rho_from_eps_delta(self.epsilon, self.delta)
            self.rho_total = rho
            tree_share = rho / 2 if n_medians else rho
            self.rho_tree = tree_share / self.n_trees
            # Tree given as (ε', δ) so that BinaryTreeMechanism's zCDP
            # calibration lands on exactly ρ_tree (eps_from_rho_delta inverts it).
            self.eps_tree = eps_from_rho_delta(self.rho_tree, self.delta)
            if n_medians:
                self.eps_median_coord = math.sqrt(rho / (d * n_medians))
                self.eps_median = self.eps_median_coord * d
            else:
                self.eps_median = self.eps_median_coord = None
        self.beta_median = self.beta / (6 * L) if L >= 1 else self.beta   # §6 A6
        # Union bounds over coordinates use β/d (§3.3, §6 A18).
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

    # Sensitivity of one user's whole contribution to a tree (§1.2 with c_u = 1).
    def tree_sensitivity(self, level):
        """Per-user sensitivity of B_ℓ's input sequence: L1 ``d·e_ℓ`` (Laplace), L2 ``√d·e_ℓ`` (Gaussian)."""
        factor = self.dim if self.noise == "laplace" else math.sqrt(self.dim)
        return factor * self.element_bound[level]

    def count_sensitivity(self):
        """Per-user sensitivity of the count tree: L1 2L (Laplace), L2 √(2L) (Gaussian)."""
        return float(self.count_dim) if self.noise == "laplace" else math.sqrt(self.count_dim)

    def noise_scale(self, level, levels=None):
        """Node noise scale of B_ℓ for a tree of ``levels`` levels (default ``tree_levels``).

        Laplace ``η_ℓ = h·sens_ℓ/ε_B`` (eq. (10)); Gaussian σ for L2 sensitivity
        ``√h·sens_ℓ`` at ρ_tree (§1.2).
        """
        levels = self.tree_levels if levels is None else levels
        sens = self.tree_sensitivity(level) if level != "count" else self.count_sensitivity()
        if self.noise == "laplace":
            return levels * sens / self.eps_tree
        return math.sqrt(levels) * sens / math.sqrt(2 * self.rho_tree)

    def centre(self, level, mu):
        """Centre 2^{ℓ−1}·μ̃ of I_ℓ (eq. (8)); ½ for levels 0, 1 (participation centring)."""
        if level <= 1:
            return 0.5
        return element_size(level) * mu

    def grid(self, level):
        return grid(self.G[level])

    def privacy_cost(self):
        """Total cost of the whole output sequence: ``{"epsilon", "delta", "rho"}`` (§2.9, Lemma 2.2)."""
        n_med = len(self.median_levels)
        if self.noise == "laplace":
            eps = self.n_trees * self.eps_tree + n_med * (self.eps_median or 0.0)
            return {"epsilon": eps, "delta": 0.0, "rho": rho_from_eps(eps)}
        rho = self.n_trees * self.rho_tree + n_med * self.dim * (self.eps_median_coord or 0.0) ** 2 / 2
        return {"epsilon": eps_from_rho_delta(rho, self.delta), "delta": self.delta, "rho": rho}

    def activation_threshold(self, level):
        """Samples ``2^{ℓ−1}·k_ℓ`` that activate B_ℓ (§2.9 "Line 9")."""
        return element_size(level) * self.k[level]


# -- Algorithm 7 (spec §2.8) ---------------------------------------------------

def grid(G):
    """Candidate set ``T_ℓ = {(j+½)/G}`` (§2.8, §6 A7)."""
    return (np.arange(G) + 0.5) / G


def quantize(y, G):
    """``Q_ℓ(y) = (min(⌊yG⌋, G−1) + ½)/G`` (§2.8)."""
    y = np.asarray(y, dtype=np.float64)
    return (np.minimum(np.floor(y * G), G - 1) + 0.5) / G


def median_cost(quantized, candidates):
    """``c(y) = max(#{Ỹ < y}, #{Ỹ > y})`` for each candidate (§2.8 step 7)."""
    q = np.asarray(quantized, dtype=np.float64).reshape(-1, 1)
    y = np.asarray(candidates, dtype=np.float64).reshape(1, -1)
    below = (q < y).sum(axis=0)
    above = (q > y).sum(axis=0)
    return np.maximum(below, above).astype(np.float64)


def exponential_mechanism(cost, epsilon, sensitivity, source):
    """Index of a candidate sampled with ``P(i) ∝ exp(−ε·cost_i/(2·sensitivity))``; ε-DP.

    The sampler follows the noise source (DESIGN "Noise and randomness"):
    :class:`SecureNoise` uses OpenDP's report-noisy-max (``make_noisy_max``
    with ``max_divergence``), which draws from the OS CSPRNG with exact
    arithmetic and whose privacy map is checked here to give at most ε for
    this sensitivity; it samples an ε-DP distribution that concentrates at
    least as much as the softmax. :class:`SeededNoise` (tests) samples the
    softmax pmf exactly with its generator; :class:`ZeroNoise` (tests, not
    private) returns the lowest-cost candidate.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.size == 1:
        return 0
    if isinstance(source, ZeroNoise):
        return int(np.argmin(cost))
    if isinstance(source, SeededNoise):
        logits = -epsilon * cost / (2.0 * sensitivity)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return int(source.generator.choice(cost.size, p=p))
    if isinstance(source, SecureNoise):
        import opendp.prelude as dp

        dp.enable_features("contrib")
        domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=int(cost.size))
        scale = 2.0 * sensitivity / epsilon
        meas = dp.m.make_noisy_max(domain, dp.linf_distance(T=float, monotonic=False),
                                   dp.max_divergence(), scale=scale, negate=True)
        if meas.map(float(sensitivity)) > epsilon * (1 + 1e-9):
            raise RuntimeError("OpenDP noisy max does not certify the median's epsilon")
        return int(meas([float(c) for c in cost]))
    raise ValueError(f"no exponential-mechanism sampler for noise source {type(source).__name__}: "
                     "use SecureNoise, SeededNoise or ZeroNoise")


def _contiguous_arrays(store, s, k):
    """PM-1: k arrays of s samples from each user's first min(M_u, s) samples, users in first-arrival order.

    ``store`` maps ``(first_step, uhash)`` → list of samples in per-user order.
    Returns the list of array means (each a d-vector).
    """
    means, cur, filled = [], None, 0
    for ukey in sorted(store):
        for x in store[ukey][:s]:
            cur = x.copy() if cur is None else cur + x
            filled += 1
            if filled == s:
                means.append(cur / s)
                cur, filled = None, 0
                if len(means) == k:
                    return means
    return means


def _hashed_arrays(store, s, k, level):
    """Participation layout: users hashed to k buckets; the first s samples per bucket; full buckets only."""
    buckets = {}
    for ukey in sorted(store):
        b = _bucket(ukey[1], level, k)
        cur = buckets.setdefault(b, [None, 0])
        if cur[1] >= s:
            continue
        for x in store[ukey][:s]:
            if cur[1] >= s:
                break
            cur[0] = x.copy() if cur[0] is None else cur[0] + x
            cur[1] += 1
    return [acc / s for acc, n in (buckets[b] for b in sorted(buckets)) if n == s]


def private_median(level, store, params, source):
    """Algorithm 7 (§2.8): a private prior μ̃_ℓ ∈ T_ℓ per coordinate; returns the grid indices.

    ``store`` maps each user's public order key ``(first_step, uhash)`` to its
    first samples. Values: contiguous arrays, exactly k_ℓ of them (the
    activation condition guarantees them, PM-6), cost sensitivity 2. Participation:
    hashed arrays, the full ones, cost sensitivity 1. Each coordinate is an
    independent exponential mechanism at ``ε_M/d`` (Laplace) or ``ε_m`` (zCDP).
    """
    s, k, G = element_size(level), params.k[level], params.G[level]
    if params.participation:
        means, sens = _hashed_arrays(store, s, k, level), 1.0
    else:
        means, sens = _contiguous_arrays(store, s, k), 2.0
        if len(means) < k:
            raise RuntimeError(f"level {level}: only {len(means)} of {k} arrays at activation")
    cands = grid(G)
    idx = []
    for j in range(params.dim):
        ys = quantize([mu[j] for mu in means], G) if means else np.zeros(0)
        cost = median_cost(ys, cands)
        idx.append(exponential_mechanism(cost, params.eps_median_coord, sens, source))
    return np.asarray(idx, dtype=np.int64)


# -- the per-step aggregate and the core of Algorithm 6 ------------------------

class MeanAggregate:
    """What one time step contributes to a stream: built per user, combined, fed to the core.

    * ``events``: samples in the step (used, i.e. within the cap m);
    * ``counts[ℓ]``: level-ℓ elements released in the step;
    * ``low[ℓ]`` (ℓ ≤ 1): sum of the (untruncated) level-0/1 elements, a d-vector;
    * ``proj[ℓ]`` (ℓ ≥ 2): ``G_ℓ × d`` array, row j = Σ of the elements projected
      onto ``I_ℓ`` for the candidate prior ``μ̃_ℓ = (j+½)/G_ℓ``. The prior is
      on a public finite grid, so every element can be projected for every
      candidate where it arises, in parallel, and the core picks the row of the
      chosen prior; this keeps the aggregate of fixed size;
    * ``a_inc[ℓ]`` (ℓ ≥ 2): increments of ``A_ℓ = Σ_v min(M_v, 2^{ℓ−1})``;
    * ``samples``: ``(order_key, index, x)`` of samples with index ≤ 2^{L−1} (for medians);
    * ``max_count``: the largest user count seen in the step (values model: public).
    """

    __slots__ = ("events", "counts", "low", "proj", "a_inc", "samples", "max_count")

    def __init__(self, params=None):
        self.events = 0
        self.counts = {}
        self.low = {}
        self.proj = {}
        self.a_inc = {}
        self.samples = []
        self.max_count = 0

    def merge(self, other):
        out = MeanAggregate()
        out.events = self.events + other.events
        for name in ("counts", "low", "proj", "a_inc"):
            a, b = getattr(self, name), getattr(other, name)
            merged = dict(a)
            for key, val in b.items():
                merged[key] = merged[key] + val if key in merged else val
            setattr(out, name, merged)
        out.samples = self.samples + other.samples
        out.max_count = max(self.max_count, other.max_count)
        return out

    def __reduce__(self):
        return (_rebuild_aggregate, ((self.events, self.counts, self.low, self.proj, self.a_inc,
                                      self.samples, self.max_count),))


def _rebuild_aggregate(fields):
    agg = MeanAggregate()
    (agg.events, agg.counts, agg.low, agg.proj, agg.a_inc, agg.samples, agg.max_count) = fields
    return agg


def contribution(params, state, x, step=0):
    """One user's sample x ∈ [0,1]^d → its :class:`MeanAggregate` (per-user, parallel part).

    ``state`` (a :class:`UserState`) is updated in place. This is the only
    place besides Algorithm 7 that reads sample values (A6-15); every projection
    happens here, for every candidate prior.
    """
    store_upto = element_size(params.L) if params.median_levels else 0
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
    level = out["level"]
    if level is not None:
        agg.counts[level] = 1
        if level <= 1:
            agg.low[level] = out["element"].copy()
        else:
            s = element_size(level)
            centres = s * params.grid(level).reshape(-1, 1)              # G × 1
            D = params.Delta[level]
            agg.proj[level] = np.clip(out["element"].reshape(1, -1), centres - D, centres + D)
    return agg


class MeanStep:
    """One release of the core: rescaled estimate and its public metadata."""

    __slots__ = ("t", "estimate", "diverse", "noise_std", "ci95", "denominator", "active",
                 "priors", "events")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        return f"MeanStep(t={self.t}, estimate={self.estimate}, diverse={self.diverse})"


class ContinualMeanCore:
    """The central, single-stream part of Algorithm 6 (spec §2.9), stepped once per time step.

    Per step (§6 A10 order): update counts (count tree under participation) →
    activate levels whose condition holds (median, flush of the buffer) →
    feed every tree this step's level sum → output. Inactive trees are fed
    zero and left out of the estimate (they hold no element). Values are in
    [0,1]^d here; ``lower``/``upper`` rescale the output (§3.1, post-processing).

    ``horizon``: number of steps per tree (None: unbounded, §1.6 U2).
    """

    name = "withhold_release_mean"

    def __init__(self, params, lower=0.0, upper=1.0, horizon=None, rng=None):
        self.p = params
        self.lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), (params.dim,)).copy()
        self.upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), (params.dim,)).copy()
        self.horizon = horizon
        self.source = make_noise(rng)
        self.t = 0
        self.trees = {lv: self._tree(self.p.tree_sensitivity(lv), self.p.dim) for lv in params.levels}
        self.count_tree = (self._tree(self.p.count_sensitivity(), self.p.count_dim)
                           if params.participation else None)
        self.active = {lv: lv <= 1 for lv in params.levels}
        self.prior = {}                      # level → grid indices (d,)
        self.buffer = {}                     # level → G × d projected sums of buffered elements
        self.counts = {lv: 0 for lv in params.levels}
        self.a = {lv: 0 for lv in params.median_levels}
        self.max_count = 0
        self.store = {}                      # order key → list of samples (index order)
        self.noisy_counts = None

    def _tree(self, sensitivity, dim):
        p = self.p
        kw = dict(epsilon=p.eps_tree, sensitivity=sensitivity, horizon=self.horizon, dim=dim,
                  rng=self.source)
        if p.noise == "gaussian":
            kw.update(noise="gaussian", delta=p.delta, calibration="zcdp")
        return get_mechanism(p.mechanism)(**kw)

    # -- serialisation ---------------------------------------------------------

    def to_state(self):
        return {
            "mechanism": self.name, "t": self.t,
            "trees": {lv: tr.to_state() for lv, tr in self.trees.items()},
            "count_tree": None if self.count_tree is None else self.count_tree.to_state(),
            "active": dict(self.active), "prior": {k: v.tolist() for k, v in self.prior.items()},
            "buffer": {k: v.tolist() for k, v in self.buffer.items()},
            "counts": dict(self.counts), "a": dict(self.a), "max_count": self.max_count,
            "store": {k: [(i, x.tolist()) for i, x in v] for k, v in self.store.items()},
            "noisy_counts": None if self.noisy_counts is None else self.noisy_counts.tolist(),
        }

    @classmethod
    def from_state(cls, params, state, lower=0.0, upper=1.0, rng=None):
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError("state is not a continual-mean core state")
        core = cls(params, lower, upper, horizon=state["trees"][0]["horizon"], rng=rng)
        core.t = state["t"]
        core.trees = {lv: get_mechanism(s["mechanism"]).from_state(s, rng=core.source)
                      for lv, s in state["trees"].items()}
        if state["count_tree"] is not None:
            ct = state["count_tree"]
            core.count_tree = get_mechanism(ct["mechanism"]).from_state(ct, rng=core.source)
        core.active = dict(state["active"])
        core.prior = {k: np.asarray(v, dtype=np.int64) for k, v in state["prior"].items()}
        core.buffer = {k: np.asarray(v, dtype=np.float64) for k, v in state["buffer"].items()}
        core.counts = dict(state["counts"])
        core.a = dict(state["a"])
        core.max_count = state["max_count"]
        core.store = {k: [(i, np.asarray(x, dtype=np.float64)) for i, x in v]
                      for k, v in state["store"].items()}
        nc = state["noisy_counts"]
        core.noisy_counts = None if nc is None else np.asarray(nc, dtype=np.float64)
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
        j = (p.L + 1) + (level - 2)
        margin = self.count_tree.ci_halfwidth(self.count_tree.t)
        return self.noisy_counts[j] - margin >= p.k[level]

    def step(self, agg=None):
        """Consume one step's :class:`MeanAggregate` (None = empty step); return a :class:`MeanStep`."""
        p = self.p
        agg = agg if agg is not None else MeanAggregate()
        self.t += 1
        for lv, c in agg.counts.items():
            self.counts[lv] += c
        for lv, c in agg.a_inc.items():
            self.a[lv] += c
        self.max_count = max(self.max_count, agg.max_count)
        if any(not self.active[lv] for lv in p.median_levels):
            for key, idx, x in agg.samples:
                self.store.setdefault(key, []).append((idx, np.asarray(x, dtype=np.float64)))
        if self.count_tree is not None:
            inc = np.zeros(p.count_dim)
            for lv in p.levels:
                inc[lv] = agg.counts.get(lv, 0)
            for i, lv in enumerate(p.median_levels):
                inc[p.L + 1 + i] = agg.a_inc.get(lv, 0) / element_size(lv)
            self.noisy_counts = np.atleast_1d(np.asarray(self.count_tree.step(inc), dtype=np.float64))

        feed, fed_n = {}, {}
        for lv in p.median_levels:
            if lv in agg.proj:
                if self.active[lv]:
                    feed[lv] = self._pick(lv, agg.proj[lv])
                    fed_n[lv] = agg.counts.get(lv, 0)
                else:
                    self.buffer[lv] = self.buffer[lv] + agg.proj[lv] if lv in self.buffer else agg.proj[lv]
        for lv in p.median_levels:
            if not self.active[lv] and self._activation_due(lv):
                store = {k: [x for _, x in sorted(v, key=lambda e: e[0])] for k, v in self.store.items()}
                self.prior[lv] = private_median(lv, store, p, self.source)
                self.active[lv] = True
                if lv in self.buffer:
                    # The buffer holds every level-ℓ element so far, this step's included (A6-4).
                    feed[lv] = self._pick(lv, self.buffer.pop(lv))
                    fed_n[lv] = self.counts[lv]
        if all(self.active.values()):
            self.store = {}

        for lv in p.levels:
            x = np.zeros(p.dim)
            if lv <= 1:
                if lv in agg.low:
                    x = np.asarray(agg.low[lv], dtype=np.float64)
                n_new = agg.counts.get(lv, 0)
            else:
                if lv in feed:
                    x = np.asarray(feed[lv], dtype=np.float64)
                n_new = fed_n.get(lv, 0)
            if p.participation and n_new:
                # Centre before the tree: presence, not spread, is what a user changes.
                x = x - n_new * self._centre(lv)
            self.trees[lv].step(x)
        return self._output(agg)

    def _centre(self, level):
        if level <= 1:
            return 0.5
        return element_size(level) * self._prior_values(level)

    def _output(self, agg):
        p = self.p
        active = [lv for lv in p.levels if self.active[lv]]
        if not p.participation:
            num = sum(self.trees[lv].current() for lv in active)
            den = float(sum(element_size(lv) * self.counts[lv] for lv in active))
            est01 = np.asarray(num, dtype=np.float64) / den if den > 0 else np.full(p.dim, 0.5)
            trees = [self.trees[lv] for lv in active] if self.t else []
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
            diverse = self._diverse_values()
        else:
            nc = self.noisy_counts
            num = np.zeros(p.dim)
            den = 0.0
            for lv in active:
                num = num + np.asarray(self.trees[lv].current()) + self._centre(lv) * nc[lv]
                den += element_size(lv) * nc[lv]
            # Post-processing of noisy counts: the denominator is at least one sample.
            den = max(den, 1.0)
            est01 = num / den
            # First-order (delta-method) std: tree noise plus the count noise
            # weighted by how far each level's centre is from the estimate.
            cstd = self.count_tree.noise_std(self.t)
            var = np.zeros(p.dim)
            for lv in active:
                var = var + self.trees[lv].noise_std(self.t) ** 2
                w = element_size(lv) * (self._centre(lv) / element_size(lv) - est01)
                var = var + (w * cstd) ** 2
            std01 = np.sqrt(var) / den
            ci01 = gaussian_halfwidth(1.0) * std01
            diverse = self._diverse_participation()
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

    def _diverse_values(self):
        """Canonical Div(t) (§2.9, §6 A9): ℓ* = ⌊log2 M_t⌋ ≤ 1 or A_{ℓ*} ≥ 2^{ℓ*−1}k_{ℓ*}. Public."""
        if self.max_count <= 0:
            return False
        top = min(self.max_count.bit_length() - 1, self.p.L)
        return top <= 1 or self.a[top] >= self.p.activation_threshold(top)

    def _diverse_participation(self):
        """Participation: M_t is private, so the flag says every level whose noisy
        element count exceeds its 95 % noise half-width is active (post-processing)."""
        margin = self.count_tree.ci_halfwidth(self.count_tree.t)
        return all(self.active[lv] or self.noisy_counts[lv] <= margin for lv in self.p.levels)


def _rescale_setup(lower, upper, dim):
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (dim,)).copy()
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (dim,)).copy()
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"lower and upper must be finite, got lower={lower!r}, upper={upper!r}")
    if np.any(lo >= hi):
        raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
    return lo, hi


class ContinualMean:
    """Algorithm 6 end to end, engine-free: per-user schedule + :class:`ContinualMeanCore`.

    ``step(samples)`` consumes one time step's ``(user, value)`` pairs (in
    arrival order) and returns a :class:`MeanStep`; feeding one pair per step
    is the paper's sample-by-sample stream. Values are clamped to
    ``[lower, upper]`` (per coordinate for ``dim > 1``) and rescaled to [0,1]
    (§3.1). A user's samples beyond ``max_samples_per_user`` are ignored and
    counted in :attr:`ignored` (§6 A14); samples past 2^L are accepted but never
    released (WR-6). More than ``max_users`` users raises (§6 A15, A6-14)
    because n enters Δ_ℓ.

    Example (``ZeroNoise``: exact, not private):

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> cm = ContinualMean(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values", rng=ZeroNoise())
    >>> [round(cm.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]
    [2.0, 3.0, 3.0]
    """

    def __init__(self, lower, upper, max_samples_per_user, epsilon, *, max_users, beta=0.1, dim=1,
                 neighbours="participation", noise="laplace", delta=None, horizon=None,
                 median_budget="per_L", rng=None):
        self.params = MeanParams(max_users, max_samples_per_user, epsilon, beta, dim=dim,
                                 neighbours=neighbours, noise=noise, delta=delta,
                                 median_budget=median_budget)
        self.lower, self.upper = _rescale_setup(lower, upper, self.params.dim)
        self.core = ContinualMeanCore(self.params, self.lower, self.upper, horizon, rng)
        self.users = {}
        self.ignored = 0

    def rescale(self, value):
        x = np.asarray(value, dtype=np.float64).reshape(-1)
        if x.shape != (self.params.dim,) or not np.all(np.isfinite(x)):
            raise ValueError(f"value must be {self.params.dim} finite numbers, got {value!r}")
        x = np.clip(x, self.lower, self.upper)
        return (x - self.lower) / (self.upper - self.lower)

    def step(self, samples=()):
        p = self.params
        agg = MeanAggregate()
        for user, value in samples:
            state = self.users.get(user)
            if state is None:
                if len(self.users) >= p.n:
                    raise ValueError(f"more than max_users={p.n} distinct users")
                state = self.users[user] = UserState(uhash=user_hash(user))
            if state.count >= p.m:
                self.ignored += 1
                continue
            agg = agg.merge(contribution(p, state, self.rescale(value), step=self.core.t + 1))
        return self.core.step(agg)

    def privacy_cost(self):
        return self.params.privacy_cost()

    @property
    def active(self):
        return dict(self.core.active)

    def tree_counts(self):
        """Elements in each B_ℓ so far (the paper's c_ℓ; buffered ones excluded)."""
        return {lv: (self.core.counts[lv] if self.core.active[lv] else 0) for lv in self.params.levels}


# -- baselines (spec §2.3, §2.6, §2.7): element-indexed, scalar values in [0,1] --

class _Baseline:
    def __init__(self, max_users, max_samples_per_user, epsilon, rng):
        self.n = _pos_int("max_users", max_users)
        self.m = _pos_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = _pos_real("epsilon", epsilon)
        self.L = self.m.bit_length() - 1
        self.source = make_noise(rng)
        self.users = {}
        self.N = 0

    def _user(self, u):
        st = self.users.get(u)
        if st is None:
            st = self.users[u] = UserState()
        return st

    @staticmethod
    def _x(x):
        x = float(x)
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"baseline samples must be in [0, 1], got {x!r}")
        return x


class NaiveMean(_Baseline):
    """Algorithm 2 (§2.3): every sample into one tree, η = m·h(T)/ε; samples past m dropped."""

    def __init__(self, max_users, max_samples_per_user, epsilon, rng=None):
        super().__init__(max_users, max_samples_per_user, epsilon, rng)
        self.T = self.n * self.m
        self.tree = BinaryTreeMechanism(self.epsilon, sensitivity=self.m, horizon=self.T, rng=self.source)
        self.dropped = 0

    @property
    def eta(self):
        return self.tree.noise_scales(1)[0]

    def step(self, x, user):
        st = self._user(user)
        if st.count >= self.m:
            self.dropped += 1
        else:
            st.count += 1
            self.tree.step(self._x(x))
            self.N += 1
        return self.tree.current() / self.N if self.N else float("nan")


class _PriorMean(_Baseline):
    """Shared by Algorithms 4 and 5: the schedule plus Π_ℓ around 2^{ℓ−1}μ̃ (eq. (4))."""

    def __init__(self, max_users, max_samples_per_user, epsilon, prior, beta=0.1, tau=None, rng=None):
        super().__init__(max_users, max_samples_per_user, epsilon, rng)
        self.prior = float(prior)
        self.E = self.L + 1
        lg = math.log(6 * self.n * self.E / _pos_real("beta", beta, upper=1.0))
        self.tau = math.sqrt(lg / (2 * self.m)) if tau is None else float(tau)
        self.Delta = {lv: math.sqrt(element_size(lv) * lg / 2) + element_size(lv) * self.tau
                      for lv in range(1, self.L + 1)}
        self.width = {0: 1.0, **{lv: 2 * d for lv, d in self.Delta.items()}}

    def _element(self, x, user):
        st = self._user(user)
        x = self._x(x)
        out = withhold_release(st, np.array([x]), self.L, 0)
        lv = out["level"]
        if lv is None:
            return None, None
        value = float(out["element"][0])
        if lv >= 1:
            c = element_size(lv) * self.prior
            value = min(max(value, c - self.Delta[lv]), c + self.Delta[lv])
        self.N += element_size(lv)
        return lv, value


class SingleTreeMean(_PriorMean):
    """Algorithm 4 (§2.6): one tree of horizon nE, η = E·h(nE)·W_max/ε (eq. (5))."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tree = BinaryTreeMechanism(self.epsilon, sensitivity=self.E * max(self.width.values()),
                                        horizon=self.n * self.E, rng=self.source)

    @property
    def eta(self):
        return self.tree.noise_scales(1)[0]

    def step(self, x, user):
        lv, value = self._element(x, user)
        if lv is not None:
            self.tree.step(value)
        return self.tree.current() / self.N


class MultiTreeMean(_PriorMean):
    """Algorithm 5 (§2.7): B_0..B_L of horizon n at ε/(L+1) each, η_ℓ = (L+1)h(n)W_ℓ/ε (eq. (7))."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trees = {lv: BinaryTreeMechanism(self.epsilon / self.E, sensitivity=self.width[lv],
                                              horizon=self.n, rng=self.source)
                      for lv in range(self.L + 1)}

    @property
    def eta(self):
        return {lv: tr.noise_scales(1)[0] for lv, tr in self.trees.items()}

    def step(self, x, user):
        lv, value = self._element(x, user)
        if lv is not None:
            self.trees[lv].step(value)
        return sum(tr.current() for tr in self.trees.values()) / self.N
