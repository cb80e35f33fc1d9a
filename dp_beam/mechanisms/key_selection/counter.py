"""The counter method of key selection: a binary-tree continual counter per key.

Derivation (the claims the code relies on)
-------------------------------------------
Steps are counted from the public start: ``t = step − start_step + 1``.
Claims 1–9 are the counter method; 10–17 the sparse-vector method
(:mod:`.sparse_vector`), which reuses claims 1, 3 (the weights ``w_t``), 6–8
(lazy start and δ) and 9. ``docs/privacy/key_selection.md`` restates them:
claim 1 is K-1 and K-2, 2 is K-4, 3–5 are K-5, 6 is K-6, 7–8 are K-7 and 9
is K-8.

1. **Counter input and sensitivity.** For a key K, ``x_K(t)`` is the number
   of units whose *first* contribution to K falls in step t, so
   ``c_K(t) = Σ_{s<=t} x_K(s)`` is the number of distinct units seen for K.
   A unit counts at most once per key and contributes to at most
   ``m = max_keys_per_unit`` keys, so adding or removing one unit u changes
   at most m counters, each by a single 1 at one step: per counter, L1 = L2
   sensitivity 1 over the whole stream; the counters of other keys are
   unchanged.

2. **Counters.** Each counter is a
   :class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism` with sensitivity 1
   and the selection's horizon (an int T, or None for an unbounded stream),
   aligned to the public start. Laplace: each counter is (ε/m)-DP, so the m
   counters a unit touches are ε-DP together (basic composition; their
   noises are independent). Gaussian: ``ρ = rho_from_eps_delta(ε, δ/2)``,
   each counter is (ρ/m)-zCDP, the m counters compose to ρ-zCDP and hence
   (ε, δ/2)-DP. The tree is used rather than BLT or Toeplitz factorisations
   because its state after zeros is a handful of independent node noises: a
   key first seen at step s starts in O(log s) draws
   (:meth:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism.skip`), where a
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
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..counting.tree import BinaryTreeMechanism
from .base import KeyState, KeyTest

if TYPE_CHECKING:
    from .selection import KeySelection

__all__ = ["KeyCounter", "KeyCounterState"]


@dataclasses.dataclass(frozen=True)
class KeyCounterState(KeyState):
    """The state of a :class:`KeyCounter`: the key fields, then its tree's state (None once
    the key is admitted: the counter drops it, claim 9)."""

    tree: Optional[Dict[str, Any]]


class KeyCounter(KeyTest):
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
    STATE_RECORD = KeyCounterState

    def __init__(self, selection: "KeySelection", tree: Optional[BinaryTreeMechanism],
                 t: Optional[int] = None, admitted: Optional[int] = None) -> None:
        self._selection = selection
        self._tree = tree
        self._t = tree.t if tree is not None else t
        self._admitted = admitted

    def step(self, new_units: int) -> bool:
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

    def to_state(self) -> Dict[str, Any]:
        """Plain dict (JSON- and pickle-friendly); restore with :meth:`KeySelection.restore`."""
        tree = None if self._tree is None else self._tree.to_state()
        return KeyCounterState(**self._state_header(), tree=tree).to_state()

    def __repr__(self) -> str:
        return f"KeyCounter(t={self._t}, admitted={self._admitted!r}, selection={self._selection!r})"

