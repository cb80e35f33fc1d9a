"""Algorithm 7 of seed 003: the private median that gives a truncated level its prior.

docs/privacy/mean.md M-6: arrays of a level's first
samples (contiguous under ``"values"``, hashed per user under
``"participation"``, see the package docstring), the quantisation grid T_ℓ
and the exponential mechanism (:mod:`dp_beam.mechanisms.exponential`) on the
median cost. Only ``preset="paper"`` runs it; the grid serves both presets.
"""

import hashlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Tuple

import numpy as np

from ..exponential import exponential_mechanism
from .schedule import element_size

if TYPE_CHECKING:   # params imports this module
    from .params import MeanParams

__all__ = [
    "grid",
    "quantize",
    "median_cost",
    "private_median",
]


def _bucket(uhash, level, k):
    digest = hashlib.sha256(f"{uhash}:{level}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % k


def grid(G: int) -> np.ndarray:
    """Candidate set ``T_ℓ = {(j+½)/G}`` (M-6)."""
    return (np.arange(G) + 0.5) / G


def quantize(y: Any, G: int) -> np.ndarray:
    """``Q_ℓ(y) = (min(⌊yG⌋, G−1) + ½)/G`` (M-6)."""
    y = np.asarray(y, dtype=np.float64)
    return (np.minimum(np.floor(y * G), G - 1) + 0.5) / G


def median_cost(quantized: Any, candidates: Any) -> np.ndarray:
    """``c(y) = max(#{Ỹ < y}, #{Ỹ > y})`` for each candidate (M-6; Algorithm 7 step 7)."""
    q = np.asarray(quantized, dtype=np.float64).reshape(-1, 1)
    y = np.asarray(candidates, dtype=np.float64).reshape(1, -1)
    below = (q < y).sum(axis=0)
    above = (q > y).sum(axis=0)
    return np.maximum(below, above).astype(np.float64)


def _contiguous_arrays(store, s, k):
    """k arrays of s samples from each user's first min(M_u, s) samples, users in first-arrival order (M-6).

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


def private_median(level: int, store: Mapping[Tuple[int, int], Sequence[np.ndarray]],
                   params: "MeanParams", source: Any) -> np.ndarray:
    """Algorithm 7 (M-6): a private prior μ̃_ℓ ∈ T_ℓ per coordinate; returns the grid indices.

    ``store`` maps each user's public order key ``(first_step, uhash)`` to its
    first samples. Values: contiguous arrays, exactly k_ℓ of them (the
    activation condition guarantees them, M-6), cost sensitivity 2. Participation:
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
