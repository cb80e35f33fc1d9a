"""The binary tree with Honaker's online variance-optimal estimator.

Honaker 2015, "Efficient use of differentially private binary trees"
(TPDP 2015): in a binary tree where every node carries independent noise,
the best linear unbiased estimate of a node combines its own noisy count with
the sum of its children's estimates by inverse variance. The full estimator
also passes information down from ancestors; online that is impossible (an
ancestor is not complete yet), but a node's subtree is complete when the node
is created, so the bottom-up half can be computed at creation and released
at once (the "online Honaker" estimator of Denisov, McMahan, Rush, Smith,
Thakurta 2022 and of the continual-counting comparisons in
Fichtenberger, Henzinger, Upadhyay 2023).

The privacy argument is ``docs/privacy/counting.md``, C-8 and C-10.
"""

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from ..state import StateRecord
from .factorisation import FactorisationMechanism
from .participation import tree_participation_norm

__all__ = ["HonakerCoreState", "HonakerTreeMechanism"]


@dataclasses.dataclass(frozen=True)
class HonakerCoreState(StateRecord):
    """The core of a :class:`HonakerTreeMechanism`'s state: the exact and the estimated node
    sums of the open tree, one row per level (the leaf count is the epoch's step count)."""

    exact: Any
    est: Any


def _trailing_zeros(c):
    return (c & -c).bit_length() - 1


class _Plan:
    def __init__(self, horizon):
        self.horizon = horizon
        self.levels = horizon.bit_length()
        # Unit node variance: v_0 = 1 (a leaf has no children), and a node
        # at level ℓ averages its own count (variance 1) with its children's
        # estimates (variance 2·v_{ℓ−1}) by inverse variance; its weight on
        # its own count is therefore v_ℓ itself.
        v = [1.0]
        for _ in range(1, self.levels):
            v.append(1.0 / (1.0 + 1.0 / (2.0 * v[-1])))
        self.var = v
        self.l1 = float(self.levels)
        self.l2 = math.sqrt(self.levels)


class HonakerTreeMechanism(FactorisationMechanism):
    """Prefix sums from a full binary tree with online inverse-variance estimates.

    Every node of the complete binary tree over the steps (all ``2^ℓ``-aligned
    blocks at levels ``ℓ = 0 … h−1``, ``h = T.bit_length()``) gets independent
    noise when its last step arrives; at step c the nodes at levels
    ``0 … ν2(c)`` complete. A new node's estimate is
    ``ê = w_ℓ (y + z) + (1 − w_ℓ)(ê_left + ê_right)`` with ``w_ℓ = v_ℓ`` and
    unit-scale variance ``v_ℓ = 1 / (1 + 1/(2 v_{ℓ−1}))``, ``v_0 = 1``. The
    release at t sums the estimates of the dyadic nodes tiling ``[1, t]``
    (the set bits of t, as the tree). Their subtrees are disjoint, so the
    noise std is ``scale · √(Σ_{ℓ ∈ bits(t)} v_ℓ)`` (×√2 for Laplace); the
    largest is ``7.99 σ`` at ``T = 2^10`` against the plain tree's 10.49
    (unit L2 sensitivity, σ the Gaussian unit-sensitivity scale).

    Sensitivity: a step lies in exactly one node per level, so the node
    vector moves by ``h·Δ`` in L1 and ``√h·Δ`` in L2, as the tree's
    (``docs/privacy/counting.md``, C-3, C-10); the estimates are
    post-processing. Constructor arguments, Laplace/Gaussian calibration,
    privacy cost and the unbounded construction (epochs of ``2^k`` steps)
    are those of :class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism`.

    State: per level the exact value and the estimate of the pending left
    child, ``2·h·dim`` floats bounded (twice the tree's, because the parent
    needs both its child's exact sum, for its own noisy count, and the
    child's estimate); ``2·(⌊log2 t⌋ + 1)·dim + dim`` unbounded. It holds
    exact partial sums and must be stored like the data.

    Noise draws: ``ν2(c) + 1`` node vectors at step c (two per step on
    average), in one call.

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import HonakerTreeMechanism, BinaryTreeMechanism, ZeroNoise
    >>> m = HonakerTreeMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise())
    >>> [round(m.step(x), 6) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> round(m.noise_std(3), 2), round(BinaryTreeMechanism(epsilon=1.0, horizon=8).noise_std(3), 2)
    (7.3, 8.0)
    """

    name = "honaker"
    STATE_VERSION = 1
    LAPLACE = True

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _plan(horizon):
        return _Plan(horizon)

    @staticmethod
    def _var_factor(plan, t):
        return sum(plan.var[ell] for ell in range(plan.levels) if (t >> ell) & 1)

    @staticmethod
    def _laplace_terms(plan, t):
        """Coefficients of the node noises in the release: the estimate of a
        level-ℓ node puts ``Π_{j<d}(1−w_{ℓ−j}) · w_{ℓ−d}`` on each of the
        ``2^d`` nodes d levels below it."""
        terms = []
        for ell in range(plan.levels):
            if not (t >> ell) & 1:
                continue
            carry = 1.0
            for depth in range(ell + 1):
                w = plan.var[ell - depth]
                terms.append((carry * w, 1 << depth))
                carry *= 1.0 - w
        return terms

    def _core_new(self, plan):
        return {
            "count": 0,
            "exact": np.zeros((plan.levels, self._dim)),
            "est": np.zeros((plan.levels, self._dim)),
        }

    def _core_step(self, plan, core, x, scale):
        count = core["count"] + 1
        top = _trailing_zeros(count)
        noise = self._draw(scale, top + 1)
        exact, est = core["exact"], core["est"]
        right_exact = x
        right_est = self._noised(x, scale, noise[0])
        for ell in range(1, top + 1):
            # Bits 0..top−1 of count−1 are all 1: exact/est there hold the
            # left children of the nodes completing now.
            node_exact = exact[ell - 1] + right_exact
            w = plan.var[ell]
            right_est = w * self._noised(node_exact, scale, noise[ell]) + (1.0 - w) * (est[ell - 1] + right_est)
            right_exact = node_exact
        exact[:top] = 0.0
        est[:top] = 0.0
        exact[top] = right_exact
        est[top] = right_est
        core["count"] = count

    def _core_release(self, plan, core):
        count = core["count"]
        live = ((count >> np.arange(plan.levels)) & 1).astype(bool)
        return core["est"][live].sum(axis=0)

    @staticmethod
    def _core_floats(core):
        return core["exact"].size + core["est"].size

    @staticmethod
    def _core_to_state(core):
        return HonakerCoreState(exact=core["exact"], est=core["est"]).to_state()

    def _core_from_state(self, plan, data, local):
        record = HonakerCoreState.from_state(data)
        shape = (plan.levels, self._dim)
        return {
            "count": local,
            "exact": self._array(record.exact, shape, "exact"),
            "est": self._array(record.est, shape, "est"),
        }

    @classmethod
    def right_factor(cls, horizon: int) -> np.ndarray:
        """The node-incidence matrix R (rows in noise-draw order), for tests."""
        rows = []
        for c in range(1, horizon + 1):
            for ell in range(_trailing_zeros(c) + 1):
                row = np.zeros(horizon)
                row[c - (1 << ell):c] = 1.0
                rows.append(row)
        return np.array(rows)

    @classmethod
    def participation_norm(cls, horizon: int, k: int, b: int) -> float:
        """Upper bound on ``max_P ‖Σ_{s∈P} R[:, s]‖₂`` (attained when T and b are
        powers of two and k·b <= T),
        P = at most k steps, consecutive ones >= b apart (see
        :func:`~dp_beam.mechanisms.counting.participation.tree_participation_norm`)."""
        return tree_participation_norm(horizon, k, b, horizon.bit_length())
