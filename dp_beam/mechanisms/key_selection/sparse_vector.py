"""The sparse-vector method of key selection: AboveThreshold per key.

Sparse-vector method (``method="sparse_vector"``, Laplace noise only)
-------------------------------------------------------------------------
Claims 1–9 are those of the counter method (:mod:`.counter`).
``docs/privacy/key_selection.md`` restates these: claim 10 is K-2, 11–12
are K-3, 13–14 are K-5, 15 is K-6, 16 is K-7 and 17 is K-8.

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
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..noise import NoiseSource
from .base import KeyState, KeyTest

if TYPE_CHECKING:
    from .selection import KeySelection

__all__ = ["KeySparseVector", "KeySparseVectorState"]


@dataclasses.dataclass(frozen=True)
class KeySparseVectorState(KeyState):
    """The state of a :class:`KeySparseVector`: the key fields, then its exact count and its
    threshold offset ρ (both None once the key is admitted, claim 17)."""

    count: Optional[int]
    offset: Optional[float]


class KeySparseVector(KeyTest):
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
    STATE_RECORD = KeySparseVectorState

    def __init__(self, selection: "KeySelection", source: Optional[NoiseSource], t: int,
                 count: Optional[int] = None, offset: Optional[float] = None,
                 admitted: Optional[int] = None) -> None:
        self._selection = selection
        self._source = source
        self._t = t
        self._count = count
        self._offset = offset
        self._admitted = admitted

    @property
    def noise_source(self) -> Optional[NoiseSource]:
        return self._source

    def step(self, new_units: int) -> bool:
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

    def to_state(self) -> Dict[str, Any]:
        """Plain dict (JSON- and pickle-friendly); restore with :meth:`KeySelection.restore`."""
        return KeySparseVectorState(**self._state_header(), count=self._count,
                                    offset=self._offset).to_state()

    def __repr__(self) -> str:
        return f"KeySparseVector(t={self._t}, admitted={self._admitted!r}, selection={self._selection!r})"
