"""The smooth binary mechanism: equal error at every step.

Andersson & Pagh 2023, "A smooth binary mechanism for efficient private
continual observation" (NeurIPS 2023; arXiv:2306.09666). Steps are mapped to the leaves of
a binary tree of height h whose labels have exactly k one-bits, in increasing
order; the release at step t is the tree's dyadic decomposition of the prefix
of leaves *before* the next used leaf ``l_{t+1}``, which has exactly k nodes
(the set bits of ``l_{t+1}``), so every release has the same variance.

The privacy argument is ``docs/privacy/counting.md``, C-8 and C-11.
"""

import dataclasses
import functools
import math
from typing import Any, List, Optional, Tuple

import numpy as np

from ..state import StateRecord, state_field
from .factorisation import FactorisationMechanism
from .participation import tree_participation_norm

__all__ = ["SmoothBinaryCoreState", "SmoothBinaryMechanism", "smooth_binary_shape"]


@dataclasses.dataclass(frozen=True)
class SmoothBinaryCoreState(StateRecord):
    """The core of a :class:`SmoothBinaryMechanism`'s state: the open node sums and the label of
    the next leaf (None in states written before it was stored: then it is recomputed)."""

    nodes: Any
    leaf: Optional[int] = state_field(default=None)


def _next_same_popcount(v):
    """Smallest integer > v with the same number of one-bits (Gosper's hack)."""
    low = v & -v
    ripple = v + low
    return ripple | (((v ^ ripple) >> 2) // low)


@functools.lru_cache(maxsize=256)
def smooth_binary_shape(horizon: int) -> Tuple[int, int]:
    """``(h, k)``: tree height and one-bits per used leaf for a horizon T.

    The release variance is ``k·σ²`` with σ calibrated for L2 sensitivity
    ``√(h−k)`` (see :class:`SmoothBinaryMechanism`), i.e. ``k(h−k)`` in units
    of the unit-sensitivity σ². We take the (h, k) with ``C(h, k) >= T + 1``
    (T used leaves and the leaf ``l_{T+1}`` that ends the last prefix) that
    minimises ``k(h−k)``, then h. Andersson & Pagh fix ``k = h/2`` with h
    even, which gives max std 7 / 10 / 12 at ``T = 2^10 / 2^16 / 2^20``; their
    analysis holds for any k, and the minimiser gives √40 = 6.32, √88 = 9.38
    and √130 = 11.40.
    """
    best = None
    h = 1
    while True:
        h += 1
        if best is not None and h - 1 > best[0]:
            # k(h−k) >= h−1 for 1 <= k < h, so larger trees cannot win.
            break
        for k in range(1, h):
            if math.comb(h, k) >= horizon + 1:
                cand = (k * (h - k), h, k)
                if best is None or cand < best:
                    best = cand
    return best[1], best[2]


class _Plan:
    def __init__(self, horizon):
        self.horizon = horizon
        self.height, self.ones = smooth_binary_shape(horizon)
        # A step's leaf is in the node of level i released for some later
        # step only if bit i of the leaf is 0 and a one-bit lies below it, so
        # at most h−k nodes carry any given step.
        self.per_leaf = self.height - self.ones
        self.l1 = float(self.per_leaf)
        self.l2 = math.sqrt(self.per_leaf)
        self.first = (1 << self.ones) - 1


class SmoothBinaryMechanism(FactorisationMechanism):
    """Prefix sums with the same noise at every step (Andersson & Pagh 2023).

    Step t adds its value to leaf ``l_t`` (the t-th h-bit label with k ones)
    and releases the sum of the k noisy nodes that tile the leaves before
    ``l_{t+1}``; the unused leaves in between hold 0. Nodes get noise when
    first released and keep it. Every release is the sum of exactly k
    independent node noises: std ``√k·scale`` (``√(2k)·scale`` for Laplace)
    at every step, with node scale calibrated for L1 sensitivity ``(h−k)·Δ``
    or L2 sensitivity ``√(h−k)·Δ`` (a step is in at most h−k released nodes).
    (h, k) come from :func:`smooth_binary_shape`; in unit-sensitivity σ the
    std is ``√(k(h−k))``: 6.32 at ``T = 2^10`` (binary tree: 10.49 at its worst
    step).

    State: the tree's h-vector form (:class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism`,
    "State"): per level either a noisy node
    (bit of the current leaf counter set) or the exact partial sum of the
    open node, ``h·dim`` floats with ``h ≈ log2 T + ½ log2 log2 T``
    (h = 13 at 2^10, 19 at 2^16). Moving from ``l_t`` to ``l_{t+1}`` skips
    unused leaves in O(h) time: with P the highest bit where they differ,
    the level-P node closes with the partial sum plus x, every node below P
    covers only unused leaves (exact value 0), and open nodes above P gain x.

    Constructor, privacy cost and the unbounded construction (epochs of
    ``2^k`` steps, each a smooth mechanism for its own horizon) are those of
    :class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism`.

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import SmoothBinaryMechanism, BinaryTreeMechanism, ZeroNoise
    >>> m = SmoothBinaryMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise())
    >>> [round(m.step(x), 6) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> round(m.noise_std(3), 2), round(BinaryTreeMechanism(epsilon=1.0, horizon=8).noise_std(3), 2)
    (6.0, 8.0)
    """

    name = "smooth_binary"
    STATE_VERSION = 1
    LAPLACE = True

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _plan(horizon):
        return _Plan(horizon)

    @staticmethod
    def _var_factor(plan, t):
        return float(plan.ones)

    @staticmethod
    def _laplace_terms(plan, t):
        return [(1.0, plan.ones)]

    def _core_new(self, plan):
        return {"leaf": plan.first, "nodes": np.zeros((plan.height, self._dim))}

    def _core_step(self, plan, core, x, scale):
        cur = core["leaf"]
        nxt = _next_same_popcount(cur)
        nodes = core["nodes"]
        top = (cur ^ nxt).bit_length() - 1
        above = np.arange(top + 1, plan.height)
        if above.size:
            open_levels = above[((cur >> above) & 1) == 0]
            nodes[open_levels] += x
        closing = nodes[top] + x
        nodes[:top] = 0.0
        nodes[top] = closing
        new = [i for i in range(top, -1, -1) if (nxt >> i) & 1]
        nodes[new] = self._noised(nodes[new], scale, self._draw(scale, len(new)))
        core["leaf"] = nxt

    def _core_release(self, plan, core):
        leaf = core["leaf"]
        live = ((leaf >> np.arange(plan.height)) & 1).astype(bool)
        return core["nodes"][live].sum(axis=0)

    @staticmethod
    def _core_floats(core):
        return core["nodes"].size

    @staticmethod
    def _core_to_state(core):
        # The leaf label is stored: recomputing it walks `local` leaves, which
        # made a restore per step (replay-stable noise) quadratic in the steps.
        return SmoothBinaryCoreState(nodes=core["nodes"], leaf=int(core["leaf"])).to_state()

    def _core_from_state(self, plan, data, local):
        record = SmoothBinaryCoreState.from_state(data)
        leaf = record.leaf
        if leaf is None:
            leaf = plan.first
            for _ in range(local):
                leaf = _next_same_popcount(leaf)
        elif (isinstance(leaf, bool) or not isinstance(leaf, int) or leaf < plan.first
              or bin(leaf).count("1") != bin(plan.first).count("1")):
            raise ValueError(f"state leaf {leaf!r} is not a leaf of this plan")
        return {"leaf": leaf, "nodes": self._array(record.nodes, (plan.height, self._dim), "nodes")}

    @classmethod
    def leaves(cls, horizon: int) -> List[int]:
        """Labels ``l_1 … l_{T+1}`` of the used leaves (public)."""
        plan = cls._plan(horizon)
        out = [plan.first]
        for _ in range(horizon):
            out.append(_next_same_popcount(out[-1]))
        return out

    @classmethod
    def right_factor(cls, horizon: int) -> np.ndarray:
        """Rows: the released nodes in noise-draw order; columns: steps. For tests."""
        leaves = cls.leaves(horizon)
        position = {leaf: s for s, leaf in enumerate(leaves[:-1])}
        rows = []
        for t in range(1, horizon + 1):
            cur, nxt = leaves[t - 1], leaves[t]
            top = (cur ^ nxt).bit_length() - 1
            for i in range(top, -1, -1):
                if (nxt >> i) & 1:
                    end = (nxt >> i) << i
                    row = np.zeros(horizon)
                    for leaf in range(end - (1 << i), end):
                        if leaf in position:
                            row[position[leaf]] = 1.0
                    rows.append(row)
        return np.array(rows)

    @classmethod
    def participation_norm(cls, horizon: int, k: int, b: int) -> float:
        """Upper bound on ``max_P ‖Σ_{s∈P} R[:, s]‖₂`` (P: <= k steps, gaps >= b).

        A level-ℓ node holds at most ``max_j C(ℓ, j)`` (j <= k) used leaves,
        which are consecutive steps, and every column has at most h−k ones;
        see :func:`~dp_beam.mechanisms.counting.participation.tree_participation_norm`.
        """
        plan = cls._plan(horizon)
        per_level = [max(math.comb(ell, j) for j in range(min(plan.ones, ell) + 1)) for ell in range(plan.height)]
        return tree_participation_norm(
            horizon, k, b, plan.height, leaves_per_level=per_level, levels_per_leaf=plan.per_leaf
        )
