"""Which dyadic nodes a binary-tree release sums, bounded or over an unbounded stream.

Public arithmetic on step indices only (no data, no noise): the nodes that
tile ``[1, t]`` and the epochs of the doubling construction for streams
without a horizon (``docs/privacy/counting.md``, C-3, C-6, C-7).

Unbounded streams (doubling with complete trees, C-6)
    Epoch k covers steps ``2^k … 2^{k+1}−1`` (exactly ``2^k`` steps) with its
    own tree of horizon ``2^k`` and ``h_k = k+1`` levels. The release at step
    t in epoch k is the sum of the noisy roots of epochs ``0..k−1`` plus the
    current epoch tree's release. Every epoch is calibrated for the whole
    sensitivity Δ of a unit and no budget is split: epochs see disjoint
    steps, and a unit that changes epoch k by ``D_k`` with ``Σ_k D_k <= Δ``
    costs ``Σ_k (D_k/Δ)·ε <= ε`` under Laplace noise and
    ``Σ_k (D_k/Δ)²·ρ <= ρ`` under zCDP. For the analytic Gaussian, epoch k is
    a Gaussian mechanism with ``μ_k = (D_k/Δ)·μ``; Gaussian mechanisms
    compose to ``√(Σ μ_k²) <= μ``, and the (ε, δ) curve is monotone in μ.
    This beats a hybrid construction with a separate counter of epochs
    because it needs no ε/2 split.

>>> epoch_of(6), epoch_steps(2)
((2, 3), (4, 7))
>>> release_intervals(6, None)
[(1, 1, 0), (2, 3, 1), (4, 5, 1), (6, 6, 0)]
>>> release_levels(6, 8), release_levels(6, None)
([4, 4], [1, 2, 3, 3])
"""

from typing import List, Optional, Tuple

__all__ = ["epoch_of", "epoch_steps", "release_intervals", "release_levels"]


def epoch_of(t: int) -> Tuple[int, int]:
    """``(k, count)``: step t >= 1 of an unbounded stream is step ``count`` of epoch k."""
    k = t.bit_length() - 1
    return k, t - (1 << k) + 1


def epoch_steps(k: int) -> Tuple[int, int]:
    """``(first, last)``: the steps of epoch k, ``2^k … 2^{k+1}−1``."""
    return 1 << k, (1 << (k + 1)) - 1


def release_intervals(t: int, horizon: Optional[int]) -> List[Tuple[int, int, int]]:
    """Nodes summed in the release at step t, as ``(first, last, level)`` step intervals.

    Bounded: the ``popcount(t)`` nodes ``(i, ⌊t/2^i⌋)`` for the set bits i of
    t, highest level first (C-3, C-7). Unbounded: the roots of the completed
    epochs, then the nodes of the current epoch's tree (C-6). A node is
    created, and its noise drawn, at step ``last``.
    """
    if horizon is not None:
        offset, count, roots = 0, t, []
    else:
        k, count = epoch_of(t)
        offset = (1 << k) - 1
        roots = [(*epoch_steps(j), j) for j in range(k)]
    nodes = []
    for i in range(count.bit_length() - 1, -1, -1):
        if (count >> i) & 1:
            last = (count >> i) << i
            nodes.append((offset + last - (1 << i) + 1, offset + last, i))
    return roots + nodes


def release_levels(t: int, horizon: Optional[int]) -> List[int]:
    """Depth of the tree each node of :func:`release_intervals` belongs to, in the same order.

    A node's noise scale depends on its tree's depth only: ``horizon.bit_length()``
    for a bounded tree, ``k + 1`` for the tree of epoch k.
    """
    if horizon is not None:
        return [horizon.bit_length()] * bin(t).count("1")
    k, count = epoch_of(t)
    return [j + 1 for j in range(k)] + [k + 1] * bin(count).count("1")
