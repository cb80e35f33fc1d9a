"""Sensitivity of a right factor when one unit takes part in several steps.

For a unit that changes at most k steps, consecutive ones at least b apart,
the noise must cover ``max_P ‖Σ_{s∈P} R[:, s]‖₂``, which the triangle
inequality bounds by k times the largest column norm (``docs/privacy/counting.md``,
C-8); these are the tighter bounds of C-8 for the tree family and the
Toeplitz factorisations (Kalinin & Lampert 2024). They serve
:mod:`~dp_beam.mechanisms.counting.registry` and the mechanisms'
``participation_norm`` methods.
"""

import math
from typing import Optional, Sequence

import numpy as np

__all__ = ["toeplitz_participation_norm", "tree_participation_norm"]


def _max_points(length, sep):
    """Most steps with pairwise gaps >= sep inside ``length`` consecutive steps."""
    return (length - 1) // sep + 1 if length > 0 else 0


def tree_participation_norm(
    horizon: int,
    k: int,
    b: int,
    levels: int,
    leaves_per_level: Optional[Sequence[int]] = None,
    levels_per_leaf: Optional[int] = None,
) -> float:
    """Upper bound on ``max_P ‖Σ_{s∈P} R[:, s]‖₂`` for a 0/1 dyadic-node right factor R.

    P ranges over patterns of at most k steps in ``1..horizon`` with
    consecutive steps at least b apart; R has a row per node, nodes of one
    level cover disjoint runs of steps. ``‖Σ_P R[:, s]‖² = Σ_nodes n²`` with n
    the number of pattern steps in the node, and at level ℓ the n's sum to
    at most k and are each at most ``m_ℓ`` (the most b-separated steps in a
    node), so ``Σ n² <= ⌊k/m⌋m² + (k mod m)²``. The sum over levels is an
    upper bound; it is attained by the full tree when T and b are powers of
    two and ``k·b <= T`` (greedy steps 1, 1+b, … then fill aligned nodes at
    every level at once).
    ``leaves_per_level[ℓ]`` caps the steps a level-ℓ node can hold (the
    smooth binary mechanism leaves gaps); ``levels_per_leaf`` (every column
    has that many ones) adds the triangle-inequality cap ``k·√levels_per_leaf``.
    """
    k = min(k, _max_points(horizon, b))
    total = 0
    for ell in range(levels):
        span = 1 << ell if leaves_per_level is None else leaves_per_level[ell]
        m = min(k, _max_points(span, b))
        if m == 0:
            continue
        total += (k // m) * m * m + (k % m) ** 2
    norm = math.sqrt(total)
    if levels_per_leaf is not None:
        norm = min(norm, k * math.sqrt(levels_per_leaf))
    return norm


def toeplitz_participation_norm(column: Sequence[float], k: int, b: int) -> float:
    """``max_P ‖Σ_{s∈P} C[:, s]‖₂`` for lower-triangular Toeplitz C with first column ``column``.

    If the column is non-negative and non-increasing, the greedy pattern
    (steps 1, 1+b, 1+2b, …, as many as fit, at most k) attains the maximum
    (Kalinin & Lampert 2024, "Banded square root matrix factorization for
    differentially private model training"). Proof: ``‖Σ_P C[:, j]‖² =
    Σ_{j, j' ∈ P} ⟨C[:, j], C[:, j']⟩`` and, for ``j <= j'``, ``⟨C[:, j],
    C[:, j']⟩ = Σ_{r < T−j'} c_r c_{r + j'−j}`` is non-increasing in the gap
    ``j' − j`` and non-decreasing in the length ``T − j'`` (all terms are
    >= 0 and c is non-increasing). The m-th step of any admissible pattern is
    at or after ``m·b`` and the gap between its m-th and m'-th steps is at
    least ``(m'−m)·b``, so every pairwise term of the greedy pattern is at
    least the corresponding term of the other pattern, and using all k steps
    only adds non-negative terms. Tests check it against exhaustive search.
    """
    column = np.asarray(column, dtype=np.float64)
    if np.any(column < 0) or np.any(np.diff(column) > 1e-15 * max(1.0, float(column[0]))):
        raise ValueError("column must be non-negative and non-increasing for the greedy pattern to be optimal")
    horizon = column.size
    k = min(k, _max_points(horizon, b))
    total = np.zeros(horizon)
    for j in range(k):
        start = j * b
        total[start:] += column[: horizon - start]
    return float(np.linalg.norm(total))
