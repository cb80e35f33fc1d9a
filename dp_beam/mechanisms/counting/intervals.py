"""Exact confidence intervals for fixed weighted sums of Laplace noises.

A Laplace release of a counter carries a fixed linear combination of node
noises, so its central interval is an exact quantile of that sum, not a tail
bound (``docs/privacy/counting.md``, C-7). :func:`laplace_release_halfwidth`
serves the tree (one entry per noise); :func:`laplace_combination_halfwidth`
takes multiplicities, for estimators that weight a whole subtree level alike.
"""

import functools
import math
from typing import Sequence, Tuple

import numpy as np
from scipy import integrate, optimize

from ..halfwidths import laplace_sum_halfwidth

__all__ = ["laplace_combination_halfwidth", "laplace_release_halfwidth"]


@functools.lru_cache(maxsize=4096)
def laplace_release_halfwidth(scales: Tuple[float, ...], level: float) -> float:
    """Exact half-width of the central ``level`` interval of ``Σ_j Lap(scales[j])``, cached.

    A release's node scales repeat across steps and keys (they depend on
    popcount(t) and the epoch only), so each pattern is inverted once.
    """
    return laplace_sum_halfwidth(scales, level)


def _combination_cdf_abs(x, scales, counts):
    """P(|S| <= x) for S a sum of ``counts[i]`` i.i.d. Lap(scales[i]) each; max scale 1.

    Gil-Pelaez as in :mod:`~dp_beam.mechanisms.noise` (whose private routine
    takes one entry per term), with multiplicities as exponents so that a
    term repeated 2^16 times costs one factor.
    """
    if x <= 0.0:
        return 0.0
    b2 = np.asarray(scales, dtype=np.float64) ** 2
    m = np.asarray(counts, dtype=np.float64)

    def log_phi(u):
        return -np.sum(m * np.log1p(b2 * u * u))

    def head(u):
        if u == 0.0:
            return x
        return math.sin(u * x) / u * math.exp(log_phi(u))

    def tail(u):
        return math.exp(log_phi(u)) / u

    head_val, _ = integrate.quad(head, 0.0, 1.0, limit=200, epsabs=1e-13, epsrel=1e-12)
    tail_val, _ = integrate.quad(tail, 1.0, np.inf, weight="sin", wvar=x, limlst=100, epsabs=1e-13)
    return min(max((2.0 / math.pi) * (head_val + tail_val), 0.0), 1.0)


@functools.lru_cache(maxsize=4096)
def _normalised_combination_halfwidth(terms, level):
    scales = [s for s, _ in terms]
    counts = [c for _, c in terms]
    std = math.sqrt(sum(2.0 * s * s * c for s, c in terms))
    # Chebyshev: P(|S| > x) <= std²/x², so the root is below std/√(1−level).
    upper = std / math.sqrt(1.0 - level) * 1.01 + 1e-9
    return optimize.brentq(
        lambda x: _combination_cdf_abs(x, scales, counts) - level, 0.0, upper, xtol=1e-12, rtol=1e-11, maxiter=200
    )


def laplace_combination_halfwidth(scales: Sequence[float], counts: Sequence[int], level: float = 0.95) -> float:
    """Exact half-width of the central ``level`` interval of ``Σ_i Σ_{counts[i]} Lap(scales[i])``.

    The multiplicity-aware form of
    :func:`~dp_beam.mechanisms.halfwidths.laplace_sum_halfwidth`, for releases
    that are fixed linear combinations of many equally weighted Laplace
    noises (the Honaker estimator weights a whole subtree level alike).
    """
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    merged = {}
    for s, c in zip(scales, counts):
        s = abs(float(s))
        if s > 0 and c > 0:
            merged[s] = merged.get(s, 0) + int(c)
    if not merged:
        return 0.0
    if sum(merged.values()) <= 64:
        return laplace_sum_halfwidth([s for s, c in merged.items() for _ in range(c)], level)
    bmax = max(merged)
    key = tuple(sorted((round(s / bmax, 12), c) for s, c in merged.items()))
    return bmax * _normalised_combination_halfwidth(key, float(level))
