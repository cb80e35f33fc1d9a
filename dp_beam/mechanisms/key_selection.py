"""Private key (partition) selection for continual release.

When the set of keys is not public, a key seen in the data may only be
released (as a key with its own statistic stream) once it is *admitted*: its
noisy running count of distinct privacy units reaches a public threshold.
This module is the engine-free part: :class:`KeySelection` holds the public
parameters (thresholds, cost) and makes one per-key object per candidate key,
by one of two methods:

* ``method="counter"``: each key runs a binary-tree continual counter
  (:class:`KeyCounter`, claims 1–9);
* ``method="sparse_vector"``: each key runs AboveThreshold, the sparse
  vector technique with a single positive answer (:class:`KeySparseVector`,
  claims 10–17). Its threshold does not pay for the tree's depth, and only
  logarithmically for the number of steps: on the flights benchmark
  (``docs/key_selection.md``; ε = 1, δ = 1e-6, m = 1, 365 daily steps) τ
  is 46.1 instead of 184–330.

Both per-key objects answer ``step(new_units) -> bool`` and have ``t``,
``admitted`` and ``to_state()``; :meth:`KeySelection.restore` rebuilds either.

Derivation (the claims the code relies on)
-------------------------------------------
Steps are counted from the public start: ``t = step − start_step + 1``.
Claims 1–9 are the counter method; 10–17 the sparse-vector method, which
reuses claims 1, 3 (the weights ``w_t``), 6–8 (lazy start and δ) and 9.

1. **Counter input and sensitivity.** For a key K, ``x_K(t)`` is the number
   of units whose *first* contribution to K falls in step t, so
   ``c_K(t) = Σ_{s<=t} x_K(s)`` is the number of distinct units seen for K.
   A unit counts at most once per key and contributes to at most
   ``m = max_keys_per_unit`` keys, so adding or removing one unit u changes
   at most m counters, each by a single 1 at one step: per counter, L1 = L2
   sensitivity 1 over the whole stream; the counters of other keys are
   unchanged.

2. **Counters.** Each counter is a
   :class:`~dp_beam.mechanisms.tree.BinaryTreeMechanism` with sensitivity 1
   and the selection's horizon (an int T, or None for an unbounded stream),
   aligned to the public start. Laplace: each counter is (ε/m)-DP, so the m
   counters a unit touches are ε-DP together (basic composition; their
   noises are independent). Gaussian: ``ρ = rho_from_eps_delta(ε, δ/2)``,
   each counter is (ρ/m)-zCDP, the m counters compose to ρ-zCDP and hence
   (ε, δ/2)-DP. The tree is used rather than BLT or Toeplitz factorisations
   because its state after zeros is a handful of independent node noises: a
   key first seen at step s starts in O(log s) draws
   (:meth:`~dp_beam.mechanisms.tree.BinaryTreeMechanism.skip`), where a
   factorisation mechanism's noise is correlated across all past steps.

3. **Threshold.** K is admitted at the first t with noisy ``c_K(t) >= τ_t``,
   ``τ_t = 1 + q_t``, where ``P(Z_t >= q_t) <= δ₁·w_t``, ``Z_t`` is the
   counter's noise at t (independent node noises with scales
   ``noise_scales(t)``) and ``Σ_t w_t <= 1``. Bounded horizon T:
   ``w_t = 1/T``. Unbounded: t in epoch ``j = ⌊log2 t⌋`` (``t ∈ [2^j,
   2^{j+1})``, also the tree's epoch) gets ``w_t = 2^{−(j+1)} / 2^j``, so
   epoch j's share is ``2^{−(j+1)}`` and the shares sum to 1. ``τ_t`` is
   public: it depends on t and the parameters only.

4. **A one-unit key is rarely admitted.** If ``c_K(t) <= 1`` at every t,
   admission at t needs ``Z_t >= τ_t − c_K(t) >= q_t``, so by the union
   bound ``P(ever admitted) <= Σ_t δ₁ w_t <= δ₁``, over the whole unbounded
   run. A key with no data (count 0) is admitted by a counter run from the
   start with probability ``δ₀ := P(∃t: Z_t >= 1 + q_t) <= δ₁``.

5. **Tail of Z_t.** Gaussian: ``Z_t ~ N(0, Σσ_i²)`` exactly, so ``q_t =
   std·Φ⁻¹(1 − δ₁w_t)`` (``scipy.stats.norm.isf``, accurate for tiny
   probabilities). Laplace: ``Z_t = Σ Lap(b_i)``; the Chernoff bound
   ``log P(Z >= q) <= −s·q − Σ log(1 − s²b_i²)`` for ``0 < s < 1/max b_i``
   holds for every such s, and :func:`laplace_tail_quantile` returns the
   smallest q it certifies. With a single node the exact tail
   ``½·exp(−q/b)`` is used instead.

6. **Lazy start.** Only keys with data get a counter, started at the key's
   first data step s by ``skip(s − 1)``: its state then has exactly the
   distribution of a counter run from t = 1 on zeros (the tree's ``skip``).
   Coupling: with that shared state and the same later noises, the lazy
   counter admits K at the same step as the counter run from the start,
   unless the latter crossed ``τ`` before s, on a true count of 0, which has
   probability at most ``δ₀ <= δ₁``. So for every dataset the lazy output
   for K (including "no counter, never admitted" for a key without data) is
   within total variation ``δ₀`` of the from-the-start output ``M*_K``.

7. **Privacy.** Let D, D' differ in one unit u and S be the keys u touches
   (``|S| <= m``). Outputs of different keys are independent, and keys
   outside S see identical data. Hybrid H: the from-the-start counters on S,
   the lazy ones elsewhere. By claim 6, ``TV(M(D), H(D)) <= m·δ₀``, and the
   same for D'. H(D) and H(D') differ only on S, where claim 2 gives ε-DP
   (Laplace) or (ε, δ/2)-DP (Gaussian). For every event E,
   ``P[M(D) ∈ E] <= P[H(D) ∈ E] + mδ₀ <= e^ε P[H(D') ∈ E] (+ δ/2) + mδ₀
   <= e^ε P[M(D') ∈ E] + mδ₀(1 + e^ε) (+ δ/2)``, and symmetrically. The
   whole selection (all keys, all time, the admission steps being all it
   releases) is therefore (ε, δ)-DP with ``δ = m·δ₁·(1 + e^ε)`` (Laplace) or
   ``δ = δ/2 + m·δ₁·(1 + e^ε)`` (Gaussian), using ``δ₀ <= δ₁``. Both are
   conservative: ``δ₀ < δ₁`` (the +1 margin of ``τ``), and for Laplace with
   m > 1 composing per key would give ``1 + e^{ε/m}``; the uniform form is
   kept for both noises.

8. **Parameters.** Given the user's (ε, δ): ``δ₁ = δ / (m(1 + e^ε))``
   (Laplace) and ``δ₁ = (δ/2) / (m(1 + e^ε))`` (Gaussian).

9. **Once.** Admission happens once: the counter stops and drops its state
   (further steps raise). Until then it must consume every step, with 0 new
   units when there are none, because ``M*`` tests at every step; testing
   only at steps with data would make the test times depend on the data.
   The noisy counts themselves are never released (claim 7 covers the
   admission steps only), and a counter's state holds exact counts: store it
   like the data.

Sparse-vector method (``method="sparse_vector"``, Laplace noise only)
-------------------------------------------------------------------------

10. **Monotone queries.** Key K's query at step t is ``c_K(t)`` (claim 1).
    For D' = D plus one unit u: ``c_K(t; D') = c_K(t; D) + 1[t >= t_u]``
    for each of the at most m keys u contributes to (t_u: u's first step
    with K), and nothing changes for other keys. So for every key, either
    ``q_t(D) <= q_t(D')`` for all t or ``q_t(D) >= q_t(D')`` for all t
    (removal), each by at most Δ = 1: the queries are *monotonic* in the
    sense of Lyu, Su & Li (below), and the thresholds ``τ_t`` are public
    (claim 13), chosen before any data is seen.

11. **Mechanism and privacy.** When K's selection opens, draw
    ``ρ ~ Lap(b_ρ)`` once; at every step t draw a fresh ``ν_t ~ Lap(b_ν)``
    and admit K at the first t with ``c_K(t) + ν_t >= τ_t + ρ``; then stop.
    ``b_ρ = Δ/ε₁``, ``b_ν = Δ/ε₂``, ``ε₁ + ε₂ = ε/m``. This is the SVT of
    M. Lyu, D. Su and N. Li, "Understanding the Sparse Vector Technique for
    Differential Privacy", PVLDB 10(6):637–648, 2017 (arXiv:1603.01699), in
    its standard form with a threshold per query and cut-off c = 1 positive
    answer: there ``ρ ~ Lap(Δ/ε₁)``, ``ν_i ~ Lap(2cΔ/ε₂)`` in general and
    ``ν_i ~ Lap(cΔ/ε₂)`` for monotonic queries, (ε₁ + ε₂)-DP. For c = 1
    the proof is short, and given here so that nothing rests on recalling
    the paper. Output k (admitted at k) has probability
    ``∫ f_ρ(r) Π_{i<k} P(ν_i < τ_i + r − q_i) · P(ν_k >= τ_k + r − q_k) dr``
    (and "never" the same integral without the last factor). (a) If
    ``q_i(D) <= q_i(D') <= q_i(D) + 1`` for all i: substitute r → r + 1 on
    the D' side; ``f_ρ(r) <= e^{ε₁} f_ρ(r + 1)``, each
    ``P(ν_i < τ_i + r − q_i(D)) <= P(ν_i < τ_i + r + 1 − q_i(D'))``, and
    ``P(ν_k >= τ_k + r − q_k(D)) <= e^{ε₂} P(ν_k >= τ_k + r + 1 − q_k(D'))``
    (a Laplace tail moves by at most ``e^{1/b_ν}`` per unit shift), so
    ``P_D[k] <= e^{ε₁+ε₂} P_{D'}[k]``. (b) If ``q_i(D') <= q_i(D) <=
    q_i(D') + 1``: no substitution; the "below" factors are larger on D'
    and the last factor grows by at most ``e^{ε₂}``. The converse
    directions are (a) and (b) with D and D' swapped. Per key the selection
    is therefore (ε/m)-DP, and the m keys a unit touches compose to ε
    (their noises are independent; other keys see identical data).

12. **Split.** ``ε₁ = ε₂ = ε/(2m)``: Lyu et al.'s budget allocation for
    monotonic queries is ``ε₁ : ε₂ = 1 : c^{2/3}``, which is 1 : 1 at
    c = 1. It is also close to the split that minimises the threshold
    here: at ε = 1, δ = 1e-6, m = 1, T = 365, τ is 46.1 with the equal
    split and 45.8 at the best one (ε₁ ≈ 0.48 ε); not worth a parameter.

13. **Thresholds.** ``τ_t = τ + g(t)``, g public: ``g ≡ 0`` for a bounded
    horizon T, and ``g(t) = b_ν·ln(w_1/w_t) = 2j·b_ν·ln 2`` for t in epoch
    j when unbounded (the weights of claim 3). A key whose count is at most
    1 at every step can only be admitted if ``∃t: 1 + ν_t >= τ_t + ρ``.
    Given ρ the ν_t are independent, so with ``S(y) = P(Lap(b_ν) >= y)``
    (exact: ``½e^{−y/b}`` for y >= 0, ``1 − ½e^{y/b}`` below)::

        P(one-unit key admitted) <= E_ρ[h(τ − 1 + ρ)],
        h(x) = 1 − Π_t (1 − S(x + g(t)))  <=  min(1, Σ_t S(x + g(t))),

    h being the exact conditional probability (it improves on the union
    bound over t, by little at these tail probabilities). τ is the smallest
    value (to solver precision) whose certified bound (claim 14) is at
    most δ₁; it is public, a function of (ε, δ, m, T) only. With g as
    chosen, ``S(x + g_j) = 4^{−j}·S(x)`` for x >= 0, so epoch j (2^j steps)
    contributes ``2^{−j}·S(x)``: the infinite product converges.

14. **Certified numerics.** h decreases in x, so on a grid
    ``r_0 < … < r_N`` (spacing ``b_ν/200``, containing 0, with
    ``P(ρ < r_0) = P(ρ > r_N) = 10⁻¹⁰·δ₁``)::

        E[h(τ−1+ρ)] <= P(ρ < r_0) + Σ_i h(τ−1+r_i)·P(r_i <= ρ < r_{i+1})
                       + h(τ−1+r_N)·P(ρ >= r_N)

    with exact Laplace cell masses; the same sum with right-hand ends is a
    lower bound, and the two differ by a factor of about ``e^{1/200}``
    (:func:`sparse_vector_admission_bounds` returns both). Unbounded:
    epochs j < 64 enter h exactly and all later ones through the bound
    ``Σ_{j>=64} 2^j S(x + g_j) <= e^{−x/b_ν}·2^{−64}`` (x + g_64 >= 0,
    else 1). Float rounding in these sums is ~1e-13 relative; τ is required
    to satisfy ``bound·(1 + 10⁻⁹) <= δ₁``, which covers it. No other
    margin is added: the grid bound is an upper bound, not an estimate.
    (As for the counter's thresholds, the law used is the continuous
    Laplace; the production sources draw discrete Laplace noise on a grid
    of spacing at most ``b·2^−30``.)

15. **Lazy start.** Only keys with data get a selection, opened at their
    first data step s: ρ is drawn then and the tests run from s on. Couple
    it with the selection run from t = 1 (``M*_K``): same ρ, same ν_t for
    t >= s. Both admit K at the same step unless ``M*_K`` was admitted
    before s, on a count of 0, i.e. ``∃t < s: ν_t >= τ_t + ρ``, whose
    probability is at most ``δ₀ := P(∃t: ν_t >= τ_t + ρ) <= δ₁`` (a count
    of 0 is at most 1, claim 13). A key without data: ``M*_K`` admits it
    with probability <= δ₀, the lazy selection never. This is claim 6 with
    SVT's state (ρ, t, count), which, unlike the tree, has nothing to
    catch up on: opening at s costs one draw.

16. **Privacy and parameters.** Claim 7's hybrid argument, with claim 11
    (ε/m-DP per key, pure) in place of claim 2: the whole selection is
    (ε, δ)-DP with ``δ = m·δ₁·(1 + e^ε)``, so ``δ₁ = δ / (m(1 + e^ε))`` as
    for the Laplace counter (claim 8). zCDP: each key's selection is
    ε/m-DP, hence (ε/m)²/2-zCDP, m of them ``m·(ε/m)²/2``; as for the
    counter this does not cover the thresholding δ. Gaussian noise is not
    offered: AboveThreshold with Gaussian noise has no pure-DP analysis of
    this form, and its known analyses would change claims 11 and 16.

17. **Once; state.** As claim 9: one admission, then the state is dropped
    and further steps raise; until then every step draws its ν_t, with 0
    new units when there are none. The state holds ρ and the exact count,
    both secret: store it like the data. Only admission steps are released.

Example (``ZeroNoise`` switches noise off to show the mechanics; it is not
private, and production code leaves ``rng=None``):

>>> from dp_beam.mechanisms import KeySelection, ZeroNoise
>>> sel = KeySelection(epsilon=1.0, delta=1e-6, horizon=365)
>>> round(sel.threshold(1), 1), round(sel.threshold(255), 1)   # 1 node vs 8 nodes of Lap(9)
(184.0, 329.5)
>>> round(sel.threshold(3), 1), round(sel.threshold(4), 1)     # 2 nodes vs 1
(243.2, 184.0)
>>> c = sel.new_counter(3, rng=ZeroNoise())   # first data at step 3: skips 2 steps
>>> c.t, c.step(200), c.step(0), c.admitted   # admitted at a step without new units
(2, False, True, 4)
>>> svt = KeySelection(epsilon=1.0, delta=1e-6, horizon=365, method="sparse_vector")
>>> round(svt.threshold(1), 1), round(svt.threshold(365), 1)   # one τ for the whole horizon
(46.1, 46.1)
>>> k = svt.new_counter(3, rng=ZeroNoise())
>>> k.t, k.step(40), k.step(7), k.admitted          # 47 >= 46.1
(2, False, True, 4)
"""

import math
import numbers

import numpy as np
from scipy import optimize, stats

from .calibration import eps_from_rho_delta, rho_from_eps_delta
from .noise import ZeroNoise, make_noise
from .tree import NOISE_KINDS, BinaryTreeMechanism

__all__ = ["KeySelection", "KeyCounter", "KeySparseVector", "laplace_tail_quantile",
           "sparse_vector_admission_bounds", "METHODS"]

#: Selection methods: a binary-tree counter per key, or AboveThreshold per key.
METHODS = ("counter", "sparse_vector")


def _chernoff_exponent_gap(u, ratios, log_inv_p):
    # Stationarity of f(u) = (L + G(u))/u with G(u) = −Σ log(1 − u²r²): the
    # minimiser solves u·G'(u) − G(u) = L, and the left side increases from 0.
    total = 0.0
    for r in ratios:
        a = (u * r) ** 2
        total += 2.0 * a / (1.0 - a) + math.log1p(-a)
    return total - log_inv_p


def _chernoff_q(u, ratios, log_inv_p):
    return (log_inv_p - sum(math.log1p(-((u * r) ** 2)) for r in ratios)) / u


def laplace_tail_quantile(scales, probability):
    """A q with ``P(Σ Z_i >= q) <= probability`` for independent ``Z_i ~ Lap(scales[i])``.

    One term: the exact quantile ``b·ln(1/(2p))`` (``−b·ln(2(1−p))`` for
    p > 1/2). Several: the smallest q certified by the Chernoff bound
    ``log P(Z >= q) <= −s·q − Σ log(1 − s²b_i²)``, ``0 < s < 1/max b_i``,
    i.e. ``q = min_s (ln(1/p) − Σ log(1 − s²b_i²))/s``. With ``u = s·max b``
    and ``r_i = b_i / max b`` the objective is ``max b·f(u)`` on ``(0, 1)``;
    ``f`` has a single stationary point, where ``u·G'(u) − G(u) = ln(1/p)``
    (G the log-sum, the left side increasing from 0), which Brent's method
    finds inside a bracket that is widened until it holds the root. The bound
    holds at every u, so an inexact root only loosens q slightly; it is never
    below the true quantile.

    >>> round(laplace_tail_quantile([2.0], 0.05), 6)        # exact: 2·ln 10
    4.60517
    >>> round(laplace_tail_quantile([1.0, 1.0, 1.0], 1e-6), 2)
    20.76
    """
    values = []
    for b in list(scales):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b) or b <= 0:
            raise ValueError(f"scales must be finite numbers > 0, got {b!r}")
        values.append(float(b))
    if not values:
        raise ValueError("scales must not be empty")
    if isinstance(probability, bool) or not isinstance(probability, numbers.Real):
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    p = float(probability)
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    bmax = max(values)
    if len(values) == 1:
        if p <= 0.5:
            return bmax * math.log(1.0 / (2.0 * p))
        return -bmax * math.log(2.0 * (1.0 - p))
    ratios = [b / bmax for b in values]
    log_inv_p = -math.log(p)
    hi = 0.5
    # The gap tends to +∞ as u → 1; halving the distance to 1 reaches any
    # log(1/p) a float can hold within a few dozen widenings.
    for _ in range(60):
        if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
            break
        hi = 1.0 - (1.0 - hi) / 2.0
    if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
        u = optimize.brentq(_chernoff_exponent_gap, 1e-300, hi, args=(ratios, log_inv_p),
                            xtol=1e-15, rtol=1e-13, maxiter=200)
    else:
        u = hi
    return bmax * _chernoff_q(u, ratios, log_inv_p)


#: Grid cells per ``b_ν`` in :func:`sparse_vector_admission_bounds` (claim 14).
SVT_CELLS_PER_SCALE = 200
#: Epochs that enter h exactly when the horizon is unbounded (claim 14).
SVT_EXACT_EPOCHS = 64
#: Relative margin required of the certified bound over δ₁ (float rounding; claim 14).
SVT_ROUNDING_MARGIN = 1e-9
#: Mass of ρ left outside the grid on each side, relative to δ₁ (claim 14).
SVT_TAIL_FRACTION = 1e-10


def _log_below(y, b):
    """``log P(ν < y)`` for ``ν ~ Lap(b)``, elementwise (exact)."""
    y = np.asarray(y, dtype=np.float64)
    upper = np.log1p(-0.5 * np.exp(-np.maximum(y, 0.0) / b))
    lower = np.minimum(y, 0.0) / b - math.log(2.0)
    return np.where(y >= 0.0, upper, lower)


def _svt_cross_probability(x, step_scale, horizon):
    """``h(x) = P(∃t: ν_t >= x + g(t))`` for independent ``ν_t ~ Lap(step_scale)`` (claim 13).

    Exact for a bounded horizon; unbounded, epochs below
    :data:`SVT_EXACT_EPOCHS` exactly and the rest by a bound, so the value
    is an upper bound on h and decreasing in x.
    """
    x = np.asarray(x, dtype=np.float64)
    b = step_scale
    if horizon is not None:
        return -np.expm1(horizon * _log_below(x, b))
    log_none = np.zeros_like(x)
    step = 2.0 * b * math.log(2.0)
    for j in range(SVT_EXACT_EPOCHS):
        log_none += math.ldexp(1.0, j) * _log_below(x + j * step, b)
    last = x + SVT_EXACT_EPOCHS * step
    tail = np.where(last >= 0.0,
                    np.exp(np.minimum(-x / b, 700.0)) * math.ldexp(1.0, -SVT_EXACT_EPOCHS), 1.0)
    return np.minimum(1.0, -np.expm1(log_none) + tail)


def sparse_vector_admission_bounds(excess, offset_scale, step_scale, horizon, tail_mass):
    """Certified ``(lower, upper)`` bounds on ``P(∃t: ν_t >= excess + g(t) + ρ)`` (claims 13, 14).

    ``ρ ~ Lap(offset_scale)``, independent ``ν_t ~ Lap(step_scale)``,
    ``t = 1..horizon`` (an int), or all t >= 1 for ``horizon=None`` with
    ``g(t) = 2⌊log2 t⌋·step_scale·ln 2`` (``g ≡ 0`` when bounded). For a
    key's selection with threshold τ, ``excess = τ − 1`` gives the bounds on
    the admission probability of a key one unit contributed to, and
    ``excess = τ`` those of a key without data (δ₀).

    The expectation over ρ is bracketed on a grid of spacing
    ``step_scale/200`` that contains 0 and leaves ``tail_mass`` of ρ outside
    on each side (counted as 1 in the upper bound, 0 or ``h`` in the lower),
    using that ``h`` decreases: left cell ends give the upper bound, right
    ends the lower.

    >>> lo, hi = sparse_vector_admission_bounds(10.0, 1.0, 1.0, 1, 1e-12)
    >>> exact = (1 + 10 / 2) * math.exp(-10) / 2        # P(Lap(1) − Lap(1) >= 10)
    >>> lo <= exact <= hi, round(hi / lo, 3)
    (True, 1.005)
    """
    for name, value in (("offset_scale", offset_scale), ("step_scale", step_scale)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if isinstance(excess, bool) or not isinstance(excess, numbers.Real) or not math.isfinite(excess):
        raise ValueError(f"excess must be a finite number, got {excess!r}")
    if horizon is not None:
        horizon = _check_int("horizon", horizon, 1)
    if isinstance(tail_mass, bool) or not isinstance(tail_mass, numbers.Real) or not (
            0.0 < tail_mass < 0.5):
        raise ValueError(f"tail_mass must be in (0, 0.5), got {tail_mass!r}")
    br, bn = float(offset_scale), float(step_scale)
    spacing = bn / SVT_CELLS_PER_SCALE
    half_width = br * math.log(0.5 / tail_mass)      # P(ρ < −half_width) = tail_mass
    k = math.ceil(half_width / spacing)
    edges = np.arange(-k, k + 1, dtype=np.float64) * spacing
    left = edges[:-1]
    # Exact Laplace mass of [r_i, r_i + spacing): no cell straddles 0.
    below = 0.5 * np.exp(np.minimum(left, 0.0) / br) * math.expm1(spacing / br)
    above = 0.5 * np.exp(-np.maximum(left, 0.0) / br) * -math.expm1(-spacing / br)
    mass = np.where(left < 0.0, below, above)
    h = _svt_cross_probability(float(excess) + edges, bn, horizon)
    outside_low = 0.5 * math.exp(edges[0] / br)
    outside_high = 0.5 * math.exp(-edges[-1] / br)
    upper = outside_low + float(np.sum(h[:-1] * mass)) + float(h[-1]) * outside_high
    lower = float(h[0]) * outside_low + float(np.sum(h[1:] * mass))
    return lower, min(1.0, upper)


def _svt_excess(offset_scale, step_scale, horizon, target):
    """The smallest excess (to solver precision) whose certified bound, with margin, is <= target."""
    tail = target * SVT_TAIL_FRACTION
    limit = target / (1.0 + SVT_ROUNDING_MARGIN)

    def upper(a):
        return sparse_vector_admission_bounds(a, offset_scale, step_scale, horizon, tail)[1]

    lo = 0.0
    if upper(lo) <= limit:      # only for target >= 1/2; not reached from a KeySelection
        return lo
    hi = (offset_scale + step_scale) * (math.log(1.0 / target) + 1.0)
    while upper(hi) > limit:
        lo, hi = hi, 2.0 * hi
    gap = lambda a: math.log(upper(a)) - math.log(limit)  # noqa: E731
    xtol = 1e-9 * (offset_scale + step_scale)
    a = optimize.brentq(gap, lo, hi, xtol=xtol, rtol=1e-12, maxiter=200)
    # brentq lands within xtol of the crossing, on either side: step up until certified.
    while upper(a) > limit:
        a += xtol
    return a


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class KeySelection:
    """Public parameters of a continual private key selection: thresholds and cost.

    Immutable; validates eagerly and raises ``ValueError`` naming the
    parameter. The module docstring derives the thresholds and the cost.

    Parameters
    ----------
    epsilon:
        ε > 0 of the whole selection (all keys, all steps).
    delta:
        δ in (0, 1) of the whole selection. It bounds, among other things,
        the probability that a key only one unit contributed to is ever
        admitted (claims 4 and 13 with δ₁ <= δ).
    max_keys_per_unit:
        m >= 1, the number of keys one unit may contribute to (the caller
        enforces it); each key's mechanism gets 1/m of the budget.
    noise:
        ``"laplace"`` (default): per-key mechanisms at ε/m each.
        ``"gaussian"`` (counter method only): counters at ρ/m-zCDP each with
        ``ρ = rho_from_eps_delta(ε, δ/2)``.
    horizon:
        Number of steps T (an int >= 1) from the public start, or ``None``
        for an unbounded stream.
    method:
        ``"counter"`` (default here): a binary-tree counter per key (claims
        1–9, :class:`KeyCounter`). ``"sparse_vector"``: AboveThreshold per
        key (claims 10–17, :class:`KeySparseVector`), Laplace only; its
        thresholds are several times lower (module docstring).

    >>> sel = KeySelection(epsilon=1.0, delta=1e-6)            # unbounded, Laplace
    >>> [round(sel.threshold(t), 1) for t in (1, 100, 10_000)]
    [16.1, 243.0, 727.3]
    >>> g = KeySelection(epsilon=1.0, delta=1e-6, noise="gaussian", horizon=365)
    >>> round(g.delta_per_key, 12), round(g.threshold(1), 1)
    (1.34471e-07, 102.2)
    >>> s = KeySelection(epsilon=1.0, delta=1e-6, method="sparse_vector")   # unbounded
    >>> [round(s.threshold(t), 1) for t in (1, 100, 10_000)]
    [35.7, 52.3, 71.7]
    """

    # The parameters a per-key state records, so that only the selection
    # that made it can restore it (the method is told by the state's
    # mechanism name).
    _PARAMS = ("epsilon", "delta", "max_keys_per_unit", "noise", "horizon")

    def __init__(self, epsilon, delta, max_keys_per_unit=1, noise="laplace", horizon=None,
                 method="counter"):
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        self._m = _check_int("max_keys_per_unit", max_keys_per_unit, 1)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        if horizon is not None:
            horizon = _check_int("horizon", horizon, 1)
        if not isinstance(method, str) or method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "sparse_vector" and noise != "laplace":
            raise ValueError(
                f"noise must be 'laplace' with method='sparse_vector' (Gaussian noise is "
                f"available with method='counter'), got {noise!r}")
        self._epsilon = float(epsilon)
        self._delta = float(delta)
        self._noise = noise
        self._horizon = horizon
        self._method = method

        if noise == "laplace":
            self._rho = None
            self._counter_epsilon = self._epsilon / self._m
            self._counter_delta = None
            selection_delta = self._delta
        else:
            # Half of δ pays for the zCDP → (ε, δ) conversion of the counters,
            # the other half for thresholding (claim 7).
            half = self._delta / 2.0
            self._rho = rho_from_eps_delta(self._epsilon, half)
            target = self._rho / self._m
            counter_epsilon = eps_from_rho_delta(target, half)
            # The tree derives its ρ from (ε, δ) again; a last-bit excess over
            # ρ/m would break the composition to ρ, so step down until none.
            while rho_from_eps_delta(counter_epsilon, half) > target:
                counter_epsilon = math.nextafter(counter_epsilon, 0.0)
            self._counter_epsilon = counter_epsilon
            self._counter_delta = half
            selection_delta = half
        # 1/(1 + e^ε) as e^{−ε}/(1 + e^{−ε}): no overflow for large ε.
        self._delta_per_key = selection_delta * math.exp(-self._epsilon) / (
            self._m * (1.0 + math.exp(-self._epsilon)))
        if not self._delta_per_key > 0.0:
            raise ValueError(f"epsilon is too large for the per-key delta to be representable, got {epsilon!r}")
        self._quantiles = {}
        if method == "counter":
            # Noise-free twin of every counter: it answers the public questions
            # (node scales at t) and is never stepped.
            self._probe = BinaryTreeMechanism(rng=ZeroNoise(), **self._counter_args())
        else:
            if self._delta_per_key < 1e-250:
                # The certified bound works in linear probability space.
                raise ValueError(
                    f"epsilon is too large for the sparse-vector threshold computation, got {epsilon!r}")
            self._probe = None
            # Claim 12: ε₁ = ε₂ = ε/(2m), Δ = 1.
            self._offset_scale = 2.0 * self._m / self._epsilon
            self._step_scale = 2.0 * self._m / self._epsilon
            self._base_threshold = None     # τ, computed on first use (claim 13)

    def _counter_args(self):
        return dict(epsilon=self._counter_epsilon, sensitivity=1.0, horizon=self._horizon,
                    noise=self._noise, delta=self._counter_delta)

    # -- public parameters ----------------------------------------------------

    @property
    def epsilon(self):
        return self._epsilon

    @property
    def delta(self):
        return self._delta

    @property
    def max_keys_per_unit(self):
        return self._m

    @property
    def noise(self):
        return self._noise

    @property
    def horizon(self):
        return self._horizon

    @property
    def method(self):
        """``"counter"`` or ``"sparse_vector"``."""
        return self._method

    @property
    def mechanism(self):
        """Name of the per-key mechanism for ledgers and records, e.g. ``"key_selection+tree(laplace)"``."""
        kind = "tree" if self._method == "counter" else "sparse_vector"
        return f"key_selection+{kind}({self._noise})"

    @property
    def delta_per_key(self):
        """δ₁: the bound on a one-unit key's admission probability (claims 4, 8, 13, 16)."""
        return self._delta_per_key

    @property
    def counter_epsilon(self):
        """ε of each key's mechanism: ε/m (Laplace), or the ε that gives ρ/m at δ/2 (Gaussian)."""
        return self._counter_epsilon

    @property
    def offset_scale(self):
        """Sparse vector: ``b_ρ``, the Laplace scale of the threshold offset ρ (claims 11, 12)."""
        self._require("sparse_vector", "offset_scale")
        return self._offset_scale

    @property
    def step_scale(self):
        """Sparse vector: ``b_ν``, the Laplace scale of each step's noise ν_t (claims 11, 12)."""
        self._require("sparse_vector", "step_scale")
        return self._step_scale

    def _require(self, method, what):
        if self._method != method:
            raise ValueError(f"{what} is defined for method={method!r} only; this selection uses "
                             f"method={self._method!r}")

    def _check_t(self, t):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
            raise ValueError(f"t must be an int >= 1, got {t!r}")
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"t must be <= horizon ({self._horizon}), got {t}")
        return int(t)

    def _pattern(self, t):
        """(cache key, w_t): the node-scale multiset at t depends only on the key."""
        if self._horizon is not None:
            return (None, bin(t).count("1")), 1.0 / self._horizon
        j = t.bit_length() - 1
        return (j, bin(t - (1 << j) + 1).count("1")), math.ldexp(1.0, -(2 * j + 1))

    def weight(self, t):
        """``w_t`` (claim 3): ``1/T`` bounded, ``2^{−(2j+1)}`` for t in epoch j unbounded."""
        return self._pattern(self._check_t(t))[1]

    def tail_probability(self, t):
        """Counter: ``δ₁·w_t``, the bound on ``P(Z_t >= q_t)``."""
        self._require("counter", "tail_probability")
        return self._delta_per_key * self.weight(t)

    def noise_scales(self, t):
        """Scales of the independent noises in the admission test at t.

        Counter: the tree's node noises in its release at t. Sparse vector:
        ``(b_ρ, b_ν)``, the offset ρ (drawn once, so shared by all steps)
        and ν_t.
        """
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return [self._offset_scale, self._step_scale]
        return self._probe.noise_scales(t)

    def noise_std(self, t):
        """Standard deviation of the admission test's noise at t (``Z_t``, or ``ν_t − ρ``)."""
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return math.sqrt(2.0 * (self._offset_scale ** 2 + self._step_scale ** 2))
        return self._probe.noise_std(t)

    def threshold(self, t):
        """The public threshold ``τ_t`` at step index t (1-based from the public start).

        Counter: ``τ_t = 1 + q_t`` (claim 3), computed once per pattern of
        node scales (bounded: the popcount of t; unbounded: its epoch and
        the popcount within it) and cached, since most steps share one.
        Sparse vector: ``τ_t = τ + g(t)`` (claim 13), τ computed once.
        """
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return self.base_threshold() + self._svt_shift(t)
        key, w = self._pattern(t)
        q = self._quantiles.get(key)
        if q is None:
            p = self._delta_per_key * w
            if self._noise == "gaussian":
                q = self._probe.noise_std(t) * float(stats.norm.isf(p))
            else:
                q = laplace_tail_quantile(self._probe.noise_scales(t), p)
            self._quantiles[key] = q
        return 1.0 + q

    def _svt_shift(self, t):
        """``g(t)``: 0 bounded, ``b_ν·ln(w_1/w_t) = 2j·b_ν·ln 2`` for t in epoch j unbounded."""
        if self._horizon is not None:
            return 0.0
        return 2.0 * (t.bit_length() - 1) * self._step_scale * math.log(2.0)

    def base_threshold(self):
        """Sparse vector: τ = ``threshold(1)``, the smallest τ certified by claim 14."""
        self._require("sparse_vector", "base_threshold")
        if self._base_threshold is None:
            excess = _svt_excess(self._offset_scale, self._step_scale, self._horizon,
                                 self._delta_per_key)
            self._base_threshold = 1.0 + excess
        return self._base_threshold

    def admission_bounds(self, units=1):
        """Sparse vector: certified bounds on the admission probability of a key with <= ``units`` units.

        ``units=1``: the one-unit key of claim 13, whose upper bound is at
        most δ₁; ``units=0``: a key with no data run from the start (δ₀,
        claim 15). Returns ``(lower, upper)`` from
        :func:`sparse_vector_admission_bounds` (the lower bound is that of
        a key whose count is ``units`` at every step).
        """
        self._require("sparse_vector", "admission_bounds")
        units = _check_int("units", units, 0)
        return sparse_vector_admission_bounds(
            self.base_threshold() - units, self._offset_scale, self._step_scale, self._horizon,
            self._delta_per_key * SVT_TAIL_FRACTION)

    def privacy_cost(self):
        """Cost of the whole selection under add/remove of one unit.

        ``{"epsilon": ε, "delta": δ, "rho": ρ}``: the selection is (ε, δ)-DP
        (claims 7, 16). ``rho`` is the zCDP cost of the m per-key mechanisms
        a unit touches: ``m·(ε/m)²/2`` for Laplace (each is ε/m-DP, counter
        or sparse vector), ρ for Gaussian. It does **not** cover the
        thresholding part of δ (``m·δ₁·(1 + e^ε)``), which no zCDP bound
        does; an accountant composing in zCDP must add that δ separately.
        """
        if self._noise == "laplace":
            rho = self._m * (self._counter_epsilon ** 2 / 2.0 if self._probe is None
                             else self._probe.rho)
        else:
            rho = self._rho
        return {"epsilon": self._epsilon, "delta": self._delta, "rho": rho}

    def counter_cost(self):
        """Privacy cost of one key's mechanism: its tree's (ε/m, or ρ/m-zCDP), or ε/m for sparse vector."""
        if self._probe is None:
            eps = self._counter_epsilon
            return {"epsilon": eps, "delta": 0.0, "rho": eps * eps / 2.0}
        return self._probe.privacy_cost()

    # -- per-key mechanisms ---------------------------------------------------

    def new_counter(self, first_t, rng=None):
        """The per-key mechanism of a key whose first data is at step index ``first_t`` (>= 1).

        A :class:`KeyCounter` (counter method) or :class:`KeySparseVector`.
        It is aligned to the public start: it has consumed ``first_t − 1``
        zero steps without testing them (claims 6, 15), so its next ``step``
        is step ``first_t``. The counter catches up by ``skip``; the sparse
        vector draws its offset ρ here, from ``rng``, and nothing else.
        ``rng``: ``None`` for secure noise; an int seed, a NumPy
        ``Generator`` or a :class:`~dp_beam.mechanisms.noise.NoiseSource`
        for tests. Many keys may share one source.
        """
        first_t = _check_int("first_t", first_t, 1)
        if self._horizon is not None and first_t > self._horizon:
            raise ValueError(f"first_t must be <= horizon ({self._horizon}), got {first_t}")
        if self._method == "sparse_vector":
            source = make_noise(rng)
            offset = float(source.laplace(self._offset_scale, 1)[0])
            return KeySparseVector(self, source, t=first_t - 1, count=0, offset=offset)
        tree = BinaryTreeMechanism(rng=rng, **self._counter_args())
        tree.skip(first_t - 1)
        return KeyCounter(self, tree)

    def restore(self, state, rng=None):
        """Rebuild a per-key mechanism from its ``to_state()`` output.

        The state must come from a selection with the same parameters and
        method. ``rng`` as in :meth:`new_counter`; with a source positioned
        where the original's was, the restored mechanism admits exactly
        where the original would have.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        cls = KeySparseVector if self._method == "sparse_vector" else KeyCounter
        if state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state: mechanism={state.get('mechanism')!r}")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(
                f"unsupported state version {state.get('version')!r}, expected {cls.STATE_VERSION}")
        fields = ("t", "admitted", "count", "offset") if cls is KeySparseVector else ("t", "admitted", "tree")
        try:
            params = {name: state[name] for name in self._PARAMS}
            values = {name: state[name] for name in fields}
        except KeyError as err:
            raise ValueError(f"state is missing field {err.args[0]!r}") from None
        mine = {name: getattr(self, name) for name in self._PARAMS}
        if params != mine:
            raise ValueError(f"state was made by a different selection: {params} != {mine}")
        t = _check_int("state t", values["t"], 0)
        admitted = values["admitted"]
        if admitted is not None:
            # A key's mechanism stops at admission, so its t is the admission step.
            if isinstance(admitted, bool) or not isinstance(admitted, numbers.Integral) or admitted != t or t < 1:
                raise ValueError(f"state admitted must be None or equal to t={t}, got {admitted!r}")
        if cls is KeySparseVector:
            return self._restore_sparse_vector(t, admitted, values["count"], values["offset"], rng)
        tree_state = values["tree"]
        if admitted is not None:
            if tree_state is not None:
                raise ValueError("state of an admitted key must not hold a tree")
            return KeyCounter(self, None, t=t, admitted=int(admitted))
        if not isinstance(tree_state, dict):
            raise ValueError("state tree must be a tree state (dict) before admission")
        expected = self._probe.to_state()
        for name in ("mechanism", "epsilon", "sensitivity", "horizon", "noise", "delta", "dim", "calibration"):
            if tree_state.get(name) != expected[name]:
                raise ValueError(
                    f"state tree {name}={tree_state.get(name)!r} does not match the selection's {expected[name]!r}")
        tree = BinaryTreeMechanism.from_state(tree_state, rng=rng)
        if tree.t != t:
            raise ValueError(f"state t={t} does not match its tree's t={tree.t}")
        return KeyCounter(self, tree)

    def _restore_sparse_vector(self, t, admitted, count, offset, rng):
        if admitted is not None:
            if count is not None or offset is not None:
                raise ValueError("state of an admitted key must not hold its count or offset")
            return KeySparseVector(self, None, t=t, admitted=int(admitted))
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"state t={t} is past the horizon ({self._horizon})")
        count = _check_int("state count", count, 0)
        if isinstance(offset, bool) or not isinstance(offset, numbers.Real) or not math.isfinite(offset):
            raise ValueError(f"state offset must be a finite number before admission, got {offset!r}")
        return KeySparseVector(self, make_noise(rng), t=t, count=count, offset=float(offset))

    def __repr__(self):
        return (f"KeySelection(epsilon={self._epsilon!r}, delta={self._delta!r}, "
                f"max_keys_per_unit={self._m!r}, noise={self._noise!r}, horizon={self._horizon!r}, "
                f"method={self._method!r})")


class _KeyTest:
    """What both per-key methods share: the selection, the step counter, the admission step,
    the checks before a step and the parameter part of the state."""

    @property
    def selection(self):
        return self._selection

    @property
    def t(self):
        """Steps consumed, counted from the public start (those before the key opened included)."""
        return self._t

    @property
    def admitted(self):
        """Step index t at which the key was admitted, or None."""
        return self._admitted

    def _check_step(self, new_units):
        """``new_units`` validated for the next step; raises before anything changes."""
        if self._admitted is not None:
            raise ValueError(f"key already admitted at t={self._admitted}; its test has stopped")
        new_units = _check_int("new_units", new_units, 0)
        horizon = self._selection.horizon
        if horizon is not None and self._t + 1 > horizon:
            raise ValueError(f"horizon exceeded: horizon is {horizon}, step {self._t + 1} requested")
        return new_units

    def _parameters_state(self):
        sel = self._selection
        return {"mechanism": self.name, "version": self.STATE_VERSION,
                "epsilon": sel.epsilon, "delta": sel.delta,
                "max_keys_per_unit": sel.max_keys_per_unit, "noise": sel.noise,
                "horizon": sel.horizon, "t": self._t, "admitted": self._admitted}


class KeyCounter(_KeyTest):
    """One candidate key's counter of distinct units; made by :class:`KeySelection`.

    :meth:`step` consumes one step's number of *new* distinct units and says
    whether the key is admitted at that step. Admission happens once: the
    counter then drops its tree, and any further :meth:`step` raises
    ``ValueError`` (a caller stepping an admitted key has lost track of it;
    failing loudly beats a silent no-op). Before admission the state holds
    exact counts and must be stored like the data; only admissions are
    public.
    """

    name = "key_selection"
    STATE_VERSION = 1

    def __init__(self, selection, tree, t=None, admitted=None):
        self._selection = selection
        self._tree = tree
        self._t = tree.t if tree is not None else t
        self._admitted = admitted

    def step(self, new_units):
        """Consume one step: ``new_units`` (an int >= 0) units contributed to the key for the first time.

        Returns True iff the key is admitted at this step (noisy count >=
        ``threshold(t)``). Raises ``ValueError`` after admission, past the
        horizon, or for a bad count (the state is then unchanged).
        """
        new_units = self._check_step(new_units)
        noisy = self._tree.step(float(new_units))
        self._t = self._tree.t
        if noisy >= self._selection.threshold(self._t):
            self._admitted = self._t
            # Nothing reads the counter again; its exact counts need not be kept.
            self._tree = None
            return True
        return False

    def to_state(self):
        """Plain dict (JSON- and pickle-friendly); restore with :meth:`KeySelection.restore`."""
        return {
            **self._parameters_state(),
            "tree": None if self._tree is None else self._tree.to_state(),
        }

    def __repr__(self):
        return f"KeyCounter(t={self._t}, admitted={self._admitted!r}, selection={self._selection!r})"


class KeySparseVector(_KeyTest):
    """One candidate key's AboveThreshold; made by :class:`KeySelection` (``method="sparse_vector"``).

    Holds the key's threshold offset ρ (drawn when the key's selection
    opened) and its exact count of distinct units. :meth:`step` adds one
    step's new units, draws that step's ν_t and says whether the key is
    admitted there (``count + ν_t >= τ_t + ρ``, claim 11). Admission happens
    once: the object then drops ρ and the count, and any further
    :meth:`step` raises ``ValueError``. Before admission the state is secret
    (claim 17); only admissions are public.
    """

    name = "key_selection_sparse_vector"
    STATE_VERSION = 1

    def __init__(self, selection, source, t, count=None, offset=None, admitted=None):
        self._selection = selection
        self._source = source
        self._t = t
        self._count = count
        self._offset = offset
        self._admitted = admitted

    @property
    def noise_source(self):
        return self._source

    def step(self, new_units):
        """Consume one step: ``new_units`` (an int >= 0) units contributed to the key for the first time.

        Returns True iff the key is admitted at this step. Draws exactly one
        ``Lap(b_ν)`` from the source. Raises ``ValueError`` after admission,
        past the horizon, or for a bad count (the state is then unchanged).
        """
        new_units = self._check_step(new_units)
        sel = self._selection
        nu = float(self._source.laplace(sel.step_scale, 1)[0])
        self._t += 1
        self._count += new_units
        if self._count + nu >= sel.threshold(self._t) + self._offset:
            self._admitted = self._t
            # Nothing reads them again; the exact count and ρ need not be kept.
            self._count = self._offset = None
            return True
        return False

    def to_state(self):
        """Plain dict (JSON- and pickle-friendly); restore with :meth:`KeySelection.restore`."""
        return {
            **self._parameters_state(),
            "count": self._count,
            "offset": self._offset,
        }

    def __repr__(self):
        return f"KeySparseVector(t={self._t}, admitted={self._admitted!r}, selection={self._selection!r})"
