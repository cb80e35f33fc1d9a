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
  (Algorithm 4) and :class:`MultiTreeMean` (Algorithm 5), element-indexed as
  in the paper, and their per-time-step forms :class:`StepNaiveMean` and
  :class:`StepPriorMean` for comparisons with the same cap, noise family and
  neighbour relation.

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

Presets
    ``preset="paper"`` is the spec's Algorithm 6 with its canonical
    constants (everything below under "Budget split" and the sensitivities
    above). ``preset="tuned"`` (the default) is the same algorithm with
    data-independent, privacy-preserving engineering that makes it beat
    Algorithm 2 at realistic sizes: tight ranges, trivially wide levels left
    untruncated, the prior of a level taken from the already released
    estimate instead of a private median, one value tree for all levels, a
    small weighted count tree and budgets by use. :class:`MeanParams` lists
    each change with its privacy argument; docs/user_mean_accuracy.md has
    the measurements.

Budget split (§2.9 "Privacy budget split"; ``preset="paper"``)
    ε/2 to the binary mechanisms (equal shares over the L+1 value trees, plus
    the count tree under participation) and ε/(2L) to each of the L−1 medians
    (§6 A5 ``per_L``; ``per_L_minus_1`` gives ε/(2(L−1))). With L ≤ 1 there are
    no medians and the trees get all of ε. With d coordinates each median is
    run per coordinate at ``ε_M/d`` (basic composition, §3.3). Gaussian noise
    (``noise="gaussian"``, §3.3 [EXT]) works in zCDP: ρ = ρ(ε, δ) of §1.2 (a),
    ρ/2 to the trees and ρ/2 to the d·(L−1) pure-DP medians
    (``ε_m = √(ρ/(d(L−1)))``, each ``ε_m²/2``-zCDP).
"""

import functools
import hashlib
import math
import numbers
import pickle
from fractions import Fraction

import numpy as np

from .calibration import eps_from_rho_delta, rho_from_eps, rho_from_eps_delta
from .noise import (SecureNoise, SeededNoise, ZeroNoise, gaussian_halfwidth,
                    laplace_sum_halfwidth, make_noise)
from .registry import default_mechanism, get_mechanism
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
    "StepNaiveMean",
    "StepPriorMean",
    "prior_truncation",
    "PRESETS",
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

    __slots__ = ("count", "segment", "first_step", "uhash", "covered")

    def __init__(self, count=0, segment=None, first_step=None, uhash=0, covered=None):
        self.count = count
        self.segment = segment
        self.first_step = first_step
        self.uhash = uhash
        # Tuned preset with a prior query: sum of the user's released samples
        # (its first 2^{⌊log2 M_u⌋}), whose mean the query reads.
        self.covered = covered

    def to_tuple(self):
        seg = None if self.segment is None else tuple(float(v) for v in self.segment)
        cov = None if self.covered is None else tuple(float(v) for v in self.covered)
        return (self.count, seg, self.first_step, self.uhash, cov)

    @classmethod
    def from_tuple(cls, t):
        if t is None:
            return cls()
        count, seg, first, uh, cov = t
        return cls(count, None if seg is None else np.asarray(seg, dtype=np.float64), first, uh,
                   None if cov is None else np.asarray(cov, dtype=np.float64))


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

#: Parameter presets of :class:`MeanParams` (see its docstring).
PRESETS = ("tuned", "paper")

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


def prior_error_bound(std, den):
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


class MeanParams:
    """Every constant of Algorithm 6 (spec §2.9), for [0,1]-rescaled values.

    ``max_users`` (n) and ``max_samples_per_user`` (m) are configuration upper
    bounds (§6 A15); ``beta`` only affects Δ_ℓ, k_ℓ, the prior accuracy
    targets and reported bounds, never privacy (§6 A6). ``tree_levels`` fixes
    the tree depth used by :meth:`noise_scale` (the paper's ``h(n)``; default
    ``h(n)``); the actual trees take their depth from their horizon.

    ``noise=None`` means ``"gaussian"`` when ``delta`` is given, else
    ``"laplace"`` (pure ε stays the default without δ, so that a pipeline
    can compose it with pure-ε transforms under an ε-only budget).
    ``mechanism=None`` means the spec's binary tree for ``preset="paper"`` and
    ``default_mechanism(noise, horizon)`` (the most accurate continual
    counter for the noise family) for ``preset="tuned"``.

    Presets
    -------
    ``preset="paper"`` is §2.9 with the canonical constants: equal shares of
    ε/2 (ρ/2) over the L+1 value trees (and the count tree), ε/(2L) per
    median (Algorithm 7), W_ℓ = 2Δ_ℓ. It reproduces the §2.10 tables
    (``tree_levels=h(n)``) and is what the tests of the spec use.

    ``preset="tuned"`` (default) keeps the algorithm (withhold-release,
    truncation of each level around a per-level prior, buffering until a
    level activates, the ratio estimate) and changes only data-independent
    constants, how the levels share noise, and where the prior comes from.
    Each change and its privacy argument:

    * *tight range* (§2.10 "Practical remark", §3.1). A level-ℓ sum lies in
      ``[0, s]^d`` (s = 2^{ℓ−1}), so clipping it to ``I_ℓ`` lands in
      ``J_ℓ = I_ℓ ∩ [0, s]``, whose width is ``<= min(2Δ_ℓ, s)``: that is the
      per-coordinate element width under ``"values"``. Under
      ``"participation"`` the element is centred at the midpoint of ``J_ℓ``
      (a function of the prior only), so its magnitude is ``<= min(Δ_ℓ, s/2)``
      per coordinate (half the width of J_ℓ).
    * *skip trivial levels* (§2.10). When ``2Δ_ℓ >= s`` truncation cannot
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
      sequential composition (§4 R2) that the count tree's activation
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
      clipped), and ``preset="paper"`` withholds every level (§2.5).
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
    :attr:`rho_tree` are the paper's single per-tree values
    (``preset="paper"``) or the same dicts (``preset="tuned"``).

    >>> p = MeanParams(1000, 16, 1.0, 0.1, neighbours="values", preset="paper")
    >>> p.L, p.eps_tree, p.eps_median, [p.k[l] for l in (2, 3, 4)]
    (4, 0.1, 0.125, [702, 791, 791])
    >>> round(p.noise_scale(4), 1)   # η_4 of §2.10 config A
    3241.6
    >>> t = MeanParams(10_000, 512, 1.0, delta=1e-6, horizon=365)
    >>> t.noise, t.mechanism, t.prior_levels, t.median_levels
    ('gaussian', 'blt', [6, 7, 8, 9], [])
    >>> round(t.privacy_cost()["epsilon"], 12)
    1.0
    """

    def __init__(self, max_users, max_samples_per_user, epsilon, beta=0.1, *, dim=1,
                 neighbours="participation", noise=None, delta=None,
                 median_budget=None, tree_levels=None, mechanism=None, horizon=None,
                 preset="tuned", prior_ratio=None, prior_query=None, user_spread=0.0):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
        self.preset = preset
        self.n = _pos_int("max_users", max_users)
        self.m = _pos_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = _pos_real("epsilon", epsilon)
        self.beta = _pos_real("beta", beta, upper=1.0)
        self.dim = _pos_int("dim", dim)
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
        self.neighbours = neighbours
        if noise is None:
            noise = "laplace" if delta in (None, 0, 0.0) else "gaussian"
        if noise not in ("laplace", "gaussian"):
            raise ValueError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
        self.noise = noise
        if noise == "gaussian":
            self.delta = _pos_real("delta", delta, upper=1.0)
        elif delta not in (None, 0, 0.0):
            raise ValueError(f"delta must be None for Laplace noise (pure epsilon-DP), got {delta!r}")
        else:
            self.delta = None
        if horizon is not None:
            horizon = _pos_int("horizon", horizon)
        self.horizon = horizon
        if prior_ratio is not None:
            if preset != "tuned":
                raise ValueError("prior_ratio applies to preset='tuned' only")
            if not (isinstance(prior_ratio, numbers.Real) and prior_ratio == math.inf):
                prior_ratio = _pos_real("prior_ratio", prior_ratio)    # math.inf: no prior
        self.prior_ratio = prior_ratio
        if prior_query is not None:
            if preset != "tuned":
                raise ValueError("prior_query applies to preset='tuned' only")
            if not isinstance(prior_query, bool):
                raise ValueError(f"prior_query must be None, True or False, got {prior_query!r}")
            if prior_query and neighbours != "values":
                raise ValueError("prior_query=True needs neighbours='values' (user counts must be public)")
        self.prior_query = prior_query
        if (isinstance(user_spread, bool) or not isinstance(user_spread, numbers.Real)
                or not 0.0 <= user_spread < 1.0):
            raise ValueError(f"user_spread must be a number in [0, 1), got {user_spread!r}")
        if user_spread and preset != "tuned":
            raise ValueError("user_spread applies to preset='tuned' only")
        self.user_spread = float(user_spread)
        if mechanism is None:
            mechanism = "tree" if preset == "paper" else default_mechanism(noise, horizon)
        # Any continual-counting mechanism works per level: the trees are
        # calibrated to a bound on the sum over steps of a user's changes (see
        # group_sensitivity), which a linear counter turns into its noise scale
        # through its largest column norm, whatever the factorisation.
        get_mechanism(mechanism)  # raises ValueError naming `mechanism`
        self.mechanism = mechanism
        if median_budget is None:
            median_budget = "per_L"
        if median_budget not in ("per_L", "per_L_minus_1"):
            raise ValueError(f"median_budget must be 'per_L', 'per_L_minus_1' or None, got {median_budget!r}")
        self.median_budget = median_budget
        self.tree_levels = h(self.n) if tree_levels is None else _pos_int("tree_levels", tree_levels)
        self.L = self.m.bit_length() - 1                            # §6 A4
        self.levels = list(range(self.L + 1))
        self.participation = neighbours == "participation"
        if preset == "paper":
            self._init_paper()
        else:
            self._init_tuned()
        self.prior_set = frozenset(self.prior_levels)
        # Tuned: untruncated levels take each sample as it arrives (see "plain levels
        # fed at once" in the class docstring); the paper withholds every level.
        self.immediate = (frozenset(lv for lv in self.levels if lv not in self.prior_set)
                          if preset == "tuned" else frozenset())
        self.n_trees = len([key for key in self.eps_level if key != "query"])
        self.count_dim = len(self.count_weights)

    # -- preset "paper": §2.9 canonical constants ---------------------------------

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
                self.eps_median = self.epsilon / (2 * div)            # ε/(2L), §6 A5
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

    # -- preset "tuned" ---------------------------------------------------------

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
        self.query_target = None
        if self.query:
            # The query fires once its public bound is below the target of the most
            # demanding level it can serve at n·min(PLAN_USER_FRACTIONS) users (the
            # hedge of the plan); with no such level it fires for the widest one.
            fewest = self.n * min(PLAN_USER_FRACTIONS)
            floor = self.query_bound(fewest, fewest / (1 << self.L))
            usable = [self.gamma[lv] for lv in self.prior_levels if self.gamma[lv] >= floor]
            self.query_target = (min(usable) if usable else
                                 max((self.gamma[lv] for lv in self.prior_levels), default=0.0))
        self.eps_tree = dict(self.eps_level)
        self.rho_tree = None if self.rho_level is None else dict(self.rho_level)

    def planned_error(self, users=None):
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

    def query_noise_scale(self):
        """Tuned preset, prior query: the per-coordinate noise of the query's sum of user means
        (sensitivity 1 per coordinate, L1 d, L2 √d): Laplace scale d/ε_q, or Gaussian σ = √(d/(2ρ_q))."""
        if self.noise == "laplace":
            return self.dim / self.eps_level["query"]
        return math.sqrt(self.dim / (2 * self.rho_level["query"]))

    def query_noise_halfwidth(self):
        """Tuned preset, prior query: the ``PRIOR_CONFIDENCE`` half-width of that noise (Laplace:
        the exact quantile ``scale·ln(1/(1−c))``)."""
        if self.noise == "laplace":
            return self.query_noise_scale() * math.log(1 / (1 - PRIOR_CONFIDENCE))
        return gaussian_halfwidth(self.query_noise_scale(), PRIOR_CONFIDENCE)

    def query_bound(self, users, inv_count):
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

    # -- derived quantities -----------------------------------------------------------

    def tree_epsilon(self, key):
        """ε given to the tree of level ``key`` (or ``"count"``); for Gaussian noise the
        (ε, δ) whose zCDP calibration is exactly :meth:`tree_rho`."""
        return self.eps_level[key]

    def tree_rho(self, key):
        """ρ of the tree of level ``key`` (or ``"count"``): ε²/2 for Laplace trees."""
        if self.rho_level is None:
            return rho_from_eps(self.eps_level[key])
        return self.rho_level[key]

    def group_sensitivity(self, j):
        """Sensitivity of value tree j, fed the per-step sum of its levels' elements: ``Σ_{ℓ∈group} sens_ℓ``.

        A user puts at most one element into each level, at any steps; the
        per-step changes add up to at most ``Σ_ℓ sens_ℓ`` in L1 (Laplace) and,
        by the triangle inequality, ``Σ_t ‖x_t − x'_t‖₂ <= Σ_ℓ sens_ℓ`` (Gaussian),
        which is the sensitivity a continual counter is calibrated to."""
        return sum(self.tree_sensitivity(lv) for lv in self.tree_groups[j])

    def values_sensitivity(self):
        """``Σ_ℓ sens_ℓ`` over all levels: the sensitivity one tree for all levels would need."""
        return sum(self.tree_sensitivity(lv) for lv in self.levels)

    # Sensitivity of one user's whole contribution to a tree (§1.2 with c_u = 1).
    def tree_sensitivity(self, level):
        """Per-user sensitivity of B_ℓ's input sequence: L1 ``d·e_ℓ`` (Laplace), L2 ``√d·e_ℓ`` (Gaussian)."""
        factor = self.dim if self.noise == "laplace" else math.sqrt(self.dim)
        return factor * self.element_bound[level]

    def count_sensitivity(self):
        """Per-user sensitivity of the count tree: a user adds at most ``v_j`` to coordinate j
        (paper: v = 1 over 2L coordinates, so L1 2L and L2 √(2L))."""
        v = self.count_weights
        return float(v.sum()) if self.noise == "laplace" else float(np.sqrt((v * v).sum()))

    def noise_scale(self, level, levels=None):
        """Node noise scale of B_ℓ (or ``"count"``) for a tree of ``levels`` levels (default ``tree_levels``).

        Laplace ``η_ℓ = h·sens_ℓ/ε_ℓ`` (eq. (10)); Gaussian σ for L2 sensitivity
        ``√h·sens_ℓ`` at ρ_ℓ (§1.2).
        """
        levels = self.tree_levels if levels is None else levels
        sens = self.count_sensitivity() if level == "count" else self.group_sensitivity(level)
        if self.noise == "laplace":
            return levels * sens / self.eps_level[level]
        return math.sqrt(levels) * sens / math.sqrt(2 * self.rho_level[level])

    def centre(self, level, mu):
        """Centre 2^{ℓ−1}·μ̃ of I_ℓ (eq. (8)); ½ for levels 0, 1 (participation centring)."""
        if level <= 1:
            return 0.5
        return element_size(level) * mu

    def grid(self, level):
        return grid(self.G[level])

    def privacy_cost(self):
        """Total cost of the whole output sequence: ``{"epsilon", "delta", "rho"}`` (§2.9, Lemma 2.2)."""
        trees = list(self.eps_level)
        if self.noise == "laplace":
            eps = sum(self.eps_level[key] for key in trees)
            eps += len(self.median_levels) * (self.eps_median or 0.0)
            return {"epsilon": eps, "delta": 0.0, "rho": rho_from_eps(eps)}
        rho = sum(self.rho_level[key] for key in trees)
        rho += len(self.median_levels) * self.dim * (self.eps_median_coord or 0.0) ** 2 / 2
        return {"epsilon": eps_from_rho_delta(rho, self.delta), "delta": self.delta, "rho": rho}

    def activation_threshold(self, level):
        """Samples ``2^{ℓ−1}·k_ℓ`` that activate B_ℓ (§2.9 "Line 9"; median prior only)."""
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
    :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` (the transforms'
    production source) samples the softmax pmf exactly with keyed coins
    (:meth:`~dp_beam.mechanisms.noise_key.KeyedNoise.exponential_choice`);
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
    if getattr(source, "exact_grid", False):
        # Keyed production noise (KeyedNoise): the softmax pmf sampled with
        # exact coins, γ_i = ε·cost_i/(2Δ) in rational arithmetic.
        factor = Fraction(epsilon) / (2 * Fraction(sensitivity))
        return int(source.exponential_choice([factor * Fraction(float(c)) for c in cost]))
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

    def __init__(self, params=None):
        self.events = 0
        self.counts = {}
        self.low = {}
        self.n_low = {}
        self.prefix = {}
        self.proj = {}
        self.a_inc = {}
        self.samples = []
        self.max_count = 0

    def merge(self, other):
        out = MeanAggregate()
        out.events = self.events + other.events
        for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc"):
            a, b = getattr(self, name), getattr(other, name)
            merged = dict(a)
            for key, val in b.items():
                merged[key] = merged[key] + val if key in merged else val
            setattr(out, name, merged)
        out.samples = self.samples + other.samples
        out.max_count = max(self.max_count, other.max_count)
        return out

    def __reduce__(self):
        return (_rebuild_aggregate, ((self.events, self.counts, self.low, self.n_low, self.prefix,
                                      self.proj, self.a_inc, self.samples, self.max_count),))


def _rebuild_aggregate(fields):
    agg = MeanAggregate()
    (agg.events, agg.counts, agg.low, agg.n_low, agg.prefix, agg.proj, agg.a_inc, agg.samples,
     agg.max_count) = fields
    return agg


def contribution(params, state, x, step=0):
    """One user's sample x ∈ [0,1]^d → its :class:`MeanAggregate` (per-user, parallel part).

    ``state`` (a :class:`UserState`) is updated in place. This is the only
    place besides Algorithm 7 that reads sample values (A6-15); every projection
    happens here, for every candidate prior.
    """
    store_upto = element_size(max(params.median_levels)) if params.median_levels else 0
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

    def _tree(self, key, sensitivity, dim):
        p = self.p
        kw = dict(epsilon=p.tree_epsilon(key), sensitivity=sensitivity, horizon=self.horizon, dim=dim,
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
            "counts": dict(self.counts), "samples_in": dict(self.samples_in), "a": dict(self.a),
            "max_count": self.max_count,
            "store": {k: [(i, x.tolist()) for i, x in v] for k, v in self.store.items()},
            "noisy_counts": None if self.noisy_counts is None else self.noisy_counts.tolist(),
            "last_est01": None if self.last_est01 is None else self.last_est01.tolist(),
            "last_bound": self.last_bound,
            "prefix_mean": self.prefix_mean.tolist(), "prefix_inv": self.prefix_inv,
            "query": None if self.query is None else (self.query[0].tolist(), self.query[1], self.query[2]),
        }

    @classmethod
    def from_state(cls, params, state, lower=0.0, upper=1.0, rng=None):
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError("state is not a continual-mean core state")
        core = cls(params, lower, upper, horizon=next(iter(state["trees"].values()))["horizon"], rng=rng)
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
        core.samples_in = dict(state["samples_in"])
        core.a = dict(state["a"])
        core.max_count = state["max_count"]
        core.store = {k: [(i, np.asarray(x, dtype=np.float64)) for i, x in v]
                      for k, v in state["store"].items()}
        nc = state["noisy_counts"]
        core.noisy_counts = None if nc is None else np.asarray(nc, dtype=np.float64)
        est = state.get("last_est01")
        core.last_est01 = None if est is None else np.asarray(est, dtype=np.float64)
        core.last_bound = float(state.get("last_bound", math.inf))
        core.prefix_mean = np.asarray(state["prefix_mean"], dtype=np.float64)
        core.prefix_inv = float(state["prefix_inv"])
        q = state["query"]
        core.query = None if q is None else (np.asarray(q[0], dtype=np.float64), float(q[1]), int(q[2]))
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
        est, bound = self.last_est01, self.last_bound
        if self.query is not None and self.query[1] < bound:
            est, bound = self.query[0], self.query[1]
        if est is None or bound > self.p.gamma[level]:
            return None
        G = self.p.G[level]
        y = np.clip(est, 0.0, 1.0)
        return np.minimum(np.floor(y * G), G - 1).astype(np.int64)

    def step(self, agg=None):
        """Consume one step's :class:`MeanAggregate` (None = empty step); return a :class:`MeanStep`."""
        p = self.p
        agg = agg if agg is not None else MeanAggregate()
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
        if any(not self.active[lv] for lv in p.median_levels):
            for key, idx, x in agg.samples:
                self.store.setdefault(key, []).append((idx, np.asarray(x, dtype=np.float64)))
        if self.count_tree is not None:
            inc = np.zeros(p.count_dim)
            for j, (group, unit) in enumerate(zip(p.count_groups, p.count_unit)):
                inc[j] = sum(self._new_samples(lv, agg) for lv in group) / unit
            for i, lv in enumerate(p.median_levels):
                inc[len(p.count_groups) + i] = agg.a_inc.get(lv, 0) / element_size(lv)
            # Coordinate j carries v_j times its count (public weights); divided back here.
            noisy = self.count_tree.step(inc * p.count_weights)
            self.noisy_counts = np.atleast_1d(np.asarray(noisy, dtype=np.float64)) / p.count_weights
            if p.preset == "tuned":
                # Post-processing: every count coordinate is a number of users (or of
                # elements, one per user) in [0, n]. With centred elements a level whose
                # count clamps to 0 drops out of numerator and denominator alike.
                self.noisy_counts = np.clip(self.noisy_counts, 0.0, float(p.n))

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
            if lv in self.buffer:
                # The buffer holds every level-ℓ element so far, this step's included (A6-4).
                feed[lv] = self._pick(lv, self.buffer.pop(lv))
                fed_n[lv] = self.counts[lv]
        if all(self.active.values()):
            self.store = {}

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
        for j, group in enumerate(p.tree_groups):
            self.trees[j].step(sum(totals[lv] for lv in group))
        return self._output(agg)

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
        c = s * self._prior_values(level)
        if self.p.preset == "paper":
            return c
        # Tuned: midpoint of J_ℓ = I_ℓ ∩ [0, s], so |Π(S) − centre| <= min(Δ_ℓ, s/2).
        D = self.p.Delta[level]
        return (np.maximum(c - D, 0.0) + np.minimum(c + D, s)) / 2

    def _output(self, agg):
        p = self.p
        active = [lv for lv in p.levels if self.active[lv]]
        tree_keys = [j for j, group in enumerate(p.tree_groups) if any(self.active[lv] for lv in group)]
        if not p.participation:
            num = sum(self.trees[key].current() for key in tree_keys)
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
            diverse = self._diverse_values()
        else:
            nc = self.noisy_counts
            num = sum(np.asarray(self.trees[key].current(), dtype=np.float64) for key in tree_keys)
            num = num + np.zeros(p.dim)
            den = 0.0
            groups = [j for j, group in enumerate(p.count_groups) if all(self.active[lv] for lv in group)]
            # Per count coordinate: samples per unit and centre per sample (levels of a
            # merged coordinate are untruncated and share the centre ½).
            units = {j: p.count_unit[j] for j in groups}
            centres = {j: self._centre(p.count_groups[j][0]) / element_size(p.count_groups[j][0])
                       for j in groups}
            for j in groups:
                num = num + centres[j] * units[j] * nc[j]
                den += units[j] * nc[j]
            den_raw = den
            # First-order (delta-method) std: tree noise plus the count noise
            # weighted by how far each coordinate's centre is from the estimate
            # (coordinate j of the count tree carries v_j times its count: noise cstd/v_j).
            cstd = self.count_tree.noise_std(self.t)
            tvar = sum(self.trees[key].noise_std(self.t) ** 2 for key in tree_keys)
            eta = {j: cstd / p.count_weights[j] for j in groups}
            sd_den = math.sqrt(sum((units[j] * eta[j]) ** 2 for j in groups))
            # Post-processing of noisy counts: the denominator is at least one sample
            # and, tuned, at least its noise's 95 % half-width (public). Below that a
            # ratio estimate divides by noise (heavy Laplace tails made single runs
            # of the routes stream miss by the whole range); the missing mass is
            # filled with samples at the public centre ½, shrinking toward it.
            if p.preset == "paper":
                den = max(den, 1.0)
            else:
                floor = max(1.0, gaussian_halfwidth(sd_den))
                if den < floor:
                    num = num + 0.5 * (floor - den)
                    den = floor
            est01 = num / den

            var = tvar + sum((units[j] * (centres[j] - est01) * eta[j]) ** 2 for j in groups)
            std01 = np.sqrt(var) / den
            ci01 = gaussian_halfwidth(1.0) * std01
            # For the activation bound: the error is exactly (a − r·b)/den̂, with a, b the
            # numerator and denominator noises and r the exact mean. The std sd(r) of
            # a − r·b satisfies sd(r) <= sd(est) + |r − est|·sd(b) (triangle inequality),
            # so |error| <= z·sd(r)/den̂ implies |error| <= z·sd(est)/(den̂ − z·sd(b)).
            z = gaussian_halfwidth(1.0, PRIOR_CONFIDENCE)
            slack = den_raw - z * sd_den
            bound_std = std01 * den / slack if slack > 0 else np.full(p.dim, math.inf)
            diverse = self._diverse_participation()
        if p.prior == "release":
            self._update_bound(est01, std01 if not p.participation else bound_std, den)
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
        self.last_est01 = np.asarray(est01, dtype=np.float64).copy()
        std = float(np.max(std01))
        if den <= 0 or not math.isfinite(std):
            self.last_bound = math.inf
            return
        self.last_bound = prior_error_bound(std, den)

    def _diverse_values(self):
        """Canonical Div(t) (§2.9, §6 A9): ℓ* = ⌊log2 M_t⌋ ≤ 1 or A_{ℓ*} ≥ 2^{ℓ*−1}k_{ℓ*}. Public.

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
        margin = self.count_tree.ci_halfwidth(self.count_tree.t)
        return all(all(self.active[lv] for lv in group) or self.noisy_counts[j] <= margin / self.p.count_weights[j]
                   for j, group in enumerate(self.p.count_groups))


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
    released (WR-6).

    More than ``max_users`` users: a step that brings the user count above n
    raises ``ValueError`` before it consumes anything (the stream is left as it
    was), because n enters Δ_ℓ and the accuracy guarantee assumes at most n
    users (§6 A15, A6-14). That is for this engine-free class only, called
    directly. The Beam transform (:class:`dp_beam.transforms.mean.ContinualMean`)
    feeds :class:`ContinualMeanCore` and never raises on data: it does not
    count users, and every width and sensitivity it uses comes from the
    declared ``max_users`` (public constants), so extra users keep the privacy
    guarantee and only void the accuracy one.

    Example (``ZeroNoise``: exact, not private):

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> cm = ContinualMean(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values", rng=ZeroNoise())
    >>> [round(cm.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]
    [2.0, 3.0, 4.0]
    >>> paper = ContinualMean(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values",
    ...                       preset="paper", rng=ZeroNoise())
    >>> [round(paper.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]   # withholds sample 3
    [2.0, 3.0, 3.0]
    """

    def __init__(self, lower, upper, max_samples_per_user, epsilon, *, max_users, beta=0.1, dim=1,
                 neighbours="participation", noise=None, delta=None, horizon=None,
                 median_budget=None, mechanism=None, preset="tuned", prior_ratio=None,
                 prior_query=None, user_spread=0.0, rng=None):
        self.params = MeanParams(max_users, max_samples_per_user, epsilon, beta, dim=dim,
                                 neighbours=neighbours, noise=noise, delta=delta,
                                 median_budget=median_budget, mechanism=mechanism,
                                 horizon=horizon, preset=preset, prior_ratio=prior_ratio,
                                 prior_query=prior_query, user_spread=user_spread)
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
        samples = list(samples)
        new_users = {user for user, _ in samples if user not in self.users}
        if len(self.users) + len(new_users) > p.n:
            raise ValueError(f"more than max_users={p.n} distinct users "
                             "(the step was not consumed)")
        agg = MeanAggregate()
        for user, value in samples:
            state = self.users.get(user)
            if state is None:
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
        self.E, self.tau, self.Delta, self.width = prior_truncation(self.n, self.m, beta, tau)

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


# -- per-time-step baselines: same cap m, noise family and neighbour relation as Algorithm 6 --

def _resolve_noise(noise, delta, horizon, mechanism):
    if noise is None:
        noise = "laplace" if delta in (None, 0, 0.0) else "gaussian"
    if noise not in ("laplace", "gaussian"):
        raise ValueError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
    if noise == "gaussian":
        delta = _pos_real("delta", delta, upper=1.0)
    elif delta not in (None, 0, 0.0):
        raise ValueError(f"delta must be None for Laplace noise (pure epsilon-DP), got {delta!r}")
    else:
        delta = None
    if mechanism is None:
        mechanism = default_mechanism(noise, horizon)
    return noise, delta, get_mechanism(mechanism), mechanism


def _counter(cls, noise, delta, epsilon_or_rho, sensitivity, horizon, source):
    """A continual counter at ε (Laplace) or exactly ρ (Gaussian, zCDP calibration)."""
    if noise == "laplace":
        return cls(epsilon=epsilon_or_rho, sensitivity=sensitivity, horizon=horizon, rng=source)
    return cls(epsilon=eps_from_rho_delta(epsilon_or_rho, delta), sensitivity=sensitivity,
               horizon=horizon, noise="gaussian", delta=delta, rng=source, calibration="zcdp")


class StepNaiveMean:
    """Algorithm 2 (spec §2.3) stepped once per time step, for like-for-like comparisons.

    A continual counter over the steps takes each step's sum of the new
    samples (rescaled to [0, 1]; a user's samples past the cap m are dropped).
    A user's at most m samples each move the sum by at most 1, at any steps,
    so its per-step changes add up to ``Σ_t |δ_t| <= m``: the counter's
    sensitivity under ``"values"`` for Laplace (L1) and Gaussian (the
    counters' ``Σ_t ‖δ_t‖₂`` form) alike. The denominator N is public under
    ``"values"``. Under ``"participation"`` the samples are centred (x − ½,
    sensitivity m/2) and N is released by a second counter (sensitivity m);
    each gets ε/2 (Laplace) or ρ/2 (Gaussian, zCDP), and the estimate is
    ``½ + S̃/max(Ñ, 1)``. Same default mechanism rule as :class:`MeanParams`.

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> b = StepNaiveMean(0.0, 10.0, 4, 1.0, neighbours="values", horizon=3, rng=ZeroNoise())
    >>> [round(b.step([("a", 2.0), ("b", 4.0)]), 3), round(b.step([("a", 9.0)]), 3)]
    [3.0, 5.0]
    >>> b.privacy_cost()["epsilon"]
    1.0
    """

    def __init__(self, lower, upper, max_samples_per_user, epsilon, *, neighbours="participation",
                 noise=None, delta=None, horizon=None, mechanism=None, rng=None):
        self.lower, self.upper = _rescale_setup(lower, upper, 1)
        self.m = _pos_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = _pos_real("epsilon", epsilon)
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
        self.neighbours = neighbours
        self.noise, self.delta, cls, self.mechanism = _resolve_noise(noise, delta, horizon, mechanism)
        self.source = make_noise(rng)
        budget = self.epsilon if self.noise == "laplace" else rho_from_eps_delta(self.epsilon, self.delta)
        if neighbours == "values":
            self.sum_tree = _counter(cls, self.noise, self.delta, budget, self.m, horizon, self.source)
            self.count_tree = None
        else:
            half = budget / 2
            self.sum_tree = _counter(cls, self.noise, self.delta, half, self.m / 2, horizon, self.source)
            self.count_tree = _counter(cls, self.noise, self.delta, half, self.m, horizon, self.source)
        self.counts = {}
        self.N = 0
        self.dropped = 0

    def step(self, samples=()):
        """Consume one step's ``(user, value)`` pairs; return the estimate in ``[lower, upper]`` units."""
        return self.release(*self.prepare(samples))

    def prepare(self, samples):
        """The noise-free part of a step: cap, clamp, rescale; returns ``(sum in [0,1] units, count)``.

        Depends on the data only, so a benchmark can prepare a stream once and
        :meth:`release` it on fresh instances for each noise draw.
        """
        total, n = 0.0, 0
        R = float(self.upper[0] - self.lower[0])
        for user, value in samples:
            c = self.counts.get(user, 0)
            if c >= self.m:
                self.dropped += 1
                continue
            self.counts[user] = c + 1
            total += (min(max(float(value), self.lower[0]), self.upper[0]) - self.lower[0]) / R
            n += 1
        return total, n

    def release(self, total, n):
        """Feed one step's prepared ``(sum, count)`` to the counters; return the estimate."""
        R = float(self.upper[0] - self.lower[0])
        self.N += n
        if self.count_tree is None:
            s = float(np.ravel(self.sum_tree.step(total))[0])
            est01 = s / self.N if self.N else 0.5
        else:
            s = float(np.ravel(self.sum_tree.step(total - n / 2))[0])
            den = float(np.ravel(self.count_tree.step(float(n)))[0])
            est01 = 0.5 + s / max(den, 1.0)
        return float(self.lower[0] + R * est01)

    def privacy_cost(self):
        trees = [self.sum_tree] + ([self.count_tree] if self.count_tree is not None else [])
        if self.noise == "laplace":
            eps = sum(t.epsilon for t in trees)
            return {"epsilon": eps, "delta": 0.0, "rho": rho_from_eps(eps)}
        rho = sum(t.rho for t in trees)
        return {"epsilon": eps_from_rho_delta(rho, self.delta), "delta": self.delta, "rho": rho}


def prior_truncation(max_users, max_samples_per_user, beta=0.1, tau=None):
    """Eq. (4) of Algorithms 4 and 5 (§2.6): ``(E, τ, {ℓ: Δ_ℓ}, {ℓ: W_ℓ})`` for ℓ >= 1 (W_0 = 1).

    >>> E, tau, D, W = prior_truncation(1000, 16)
    >>> E, round(tau, 6), round(D[4], 4)
    (5, 0.627782, 12.1248)
    """
    n = _pos_int("max_users", max_users)
    m = _pos_int("max_samples_per_user", max_samples_per_user)
    L = m.bit_length() - 1
    E = L + 1
    lg = math.log(6 * n * E / _pos_real("beta", beta, upper=1.0))
    tau = math.sqrt(lg / (2 * m)) if tau is None else float(tau)
    Delta = {lv: math.sqrt(element_size(lv) * lg / 2) + element_size(lv) * tau for lv in range(1, L + 1)}
    width = {0: 1.0, **{lv: 2 * d for lv, d in Delta.items()}}
    return E, tau, Delta, width


class StepPriorMean:
    """Algorithms 4 (``trees="single"``, §2.6) and 5 (``trees="multi"``, §2.7) with a given
    prior μ̃, stepped once per time step.

    The withhold-release schedule and the truncation Π_ℓ around 2^{ℓ−1}μ̃ of
    eq. (4) are the paper's. The element-indexed trees become continual
    counters over the time steps fed each step's sum of released
    (truncated) elements: a user still has at most E = L+1 elements, one per
    level. Algorithm 4: one counter, sensitivity ``E·W_max`` (eq. (5));
    Algorithm 5: one counter per level at ε/(L+1) (ρ/(L+1) with Gaussian
    noise), sensitivity ``W_ℓ`` (eq. (7)). The paper's neighbour relation
    (``"values"``): N is public. The prior is an input; its own privacy cost
    (the paper charges it separately) is not included in :meth:`privacy_cost`.

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> b = StepPriorMean(0.0, 1.0, 4, 1.0, prior=0.5, max_users=10, horizon=2, rng=ZeroNoise())
    >>> [round(b.step([("a", 0.2), ("a", 0.4)]), 3), round(b.step([("a", 0.6), ("a", 0.8)]), 3)]
    [0.3, 0.5]
    """

    def __init__(self, lower, upper, max_samples_per_user, epsilon, *, prior, max_users, trees="multi",
                 beta=0.1, tau=None, noise=None, delta=None, horizon=None, mechanism=None, rng=None):
        if trees not in ("single", "multi"):
            raise ValueError(f"trees must be 'single' or 'multi', got {trees!r}")
        self.trees_kind = trees
        self.lower, self.upper = _rescale_setup(lower, upper, 1)
        self.m = _pos_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = _pos_real("epsilon", epsilon)
        self.L = self.m.bit_length() - 1
        R = float(self.upper[0] - self.lower[0])
        self.prior = min(max((float(prior) - self.lower[0]) / R, 0.0), 1.0)
        self.E, self.tau, self.Delta, self.width = prior_truncation(max_users, self.m, beta, tau)
        self.noise, self.delta, cls, self.mechanism = _resolve_noise(noise, delta, horizon, mechanism)
        self.source = make_noise(rng)
        budget = self.epsilon if self.noise == "laplace" else rho_from_eps_delta(self.epsilon, self.delta)
        if trees == "single":
            sens = self.E * max(self.width.values())
            self.trees = {"all": _counter(cls, self.noise, self.delta, budget, sens, horizon, self.source)}
        else:
            self.trees = {lv: _counter(cls, self.noise, self.delta, budget / self.E, self.width[lv],
                                       horizon, self.source) for lv in range(self.L + 1)}
        self.users = {}
        self.N = 0

    def step(self, samples=()):
        """Consume one step's ``(user, value)`` pairs; return the estimate in ``[lower, upper]`` units."""
        return self.release(*self.prepare(samples))

    def prepare(self, samples):
        """The noise-free part of a step (schedule, truncation): ``(per-tree sums, samples represented)``."""
        R = float(self.upper[0] - self.lower[0])
        sums = {key: 0.0 for key in self.trees}
        represented = 0
        for user, value in samples:
            st = self.users.setdefault(user, UserState())
            if st.count >= self.m:
                continue
            x = (min(max(float(value), self.lower[0]), self.upper[0]) - self.lower[0]) / R
            out = withhold_release(st, np.array([x]), self.L, 0)
            lv = out["level"]
            if lv is None:
                continue
            e = float(out["element"][0])
            if lv >= 1:
                c = element_size(lv) * self.prior
                e = min(max(e, c - self.Delta[lv]), c + self.Delta[lv])
            sums["all" if self.trees_kind == "single" else lv] += e
            represented += element_size(lv)
        return sums, represented

    def release(self, sums, represented):
        """Feed one step's prepared sums to the counters; return the estimate."""
        R = float(self.upper[0] - self.lower[0])
        self.N += represented
        total = sum(float(np.ravel(self.trees[key].step(v))[0]) for key, v in sums.items())
        est01 = total / self.N if self.N else self.prior
        return float(self.lower[0] + R * est01)

    def privacy_cost(self):
        trees = list(self.trees.values())
        if self.noise == "laplace":
            eps = sum(t.epsilon for t in trees)
            return {"epsilon": eps, "delta": 0.0, "rho": rho_from_eps(eps)}
        rho = sum(t.rho for t in trees)
        return {"epsilon": eps_from_rho_delta(rho, self.delta), "delta": self.delta, "rho": rho}
