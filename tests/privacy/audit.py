"""Statistical privacy audits: Clopper–Pearson lower bounds on ε, and how to pick the event.

A mechanism M is (ε, δ)-DP when ``P[M(D) ∈ S] <= e^ε P[M(D') ∈ S] + δ`` for
every event S and neighbours D, D'. Running M on D and on D' many times with
independent noise estimates ``p = P[M(D) ∈ S]`` and ``p' = P[M(D') ∈ S]``;
with a one-sided Clopper–Pearson lower bound ``p_lo`` on p and upper bound
``p'_hi`` on p', each at confidence ``1 − alpha``,

    ε_lb = ln((p_lo − δ) / p'_hi)

is a lower bound on the ε of M with confidence at least ``1 − 2·alpha``
(union bound over the two intervals). A correct mechanism therefore gives
``ε_lb > ε`` with probability at most ``2·alpha`` per event and direction.

The event S must not depend on the samples the bound is computed from. The
helpers below choose S on a separate *pilot* sample (a family of threshold
or orthant events, the one with the largest pilot bound) and the caller
then evaluates it on fresh samples; the family itself is fixed in advance
from the noise distribution and the two inputs.

Everything here is plain NumPy/SciPy; nothing depends on the code under audit.
"""

import math

import numpy as np
from scipy import stats

__all__ = [
    "ALPHA",
    "clopper_pearson",
    "epsilon_lower_bound",
    "threshold_event",
    "orthant_event",
    "gaussian_delta",
]

#: Default one-sided error probability of each Clopper–Pearson bound.
ALPHA = 1e-3


def clopper_pearson(k, n, alpha=ALPHA):
    """One-sided Clopper–Pearson bounds ``(lower, upper)`` on a binomial p from k of n.

    Each bound holds with probability at least ``1 − alpha`` (exact, not
    asymptotic): ``lower = Beta(alpha; k, n − k + 1)`` (0 when k = 0) and
    ``upper = Beta(1 − alpha; k + 1, n − k)`` (1 when k = n).

    >>> lo, hi = clopper_pearson(0, 1000)
    >>> lo, round(hi, 5)             # 1 − alpha^(1/n)
    (0.0, 0.00688)
    """
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    lower = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))
    return lower, upper


def epsilon_lower_bound(k, n, k_other, n_other, delta=0.0, alpha=ALPHA):
    """``ln((p_lo − δ)/p'_hi)``: an event seen k of n times under D, k_other of n_other under D'.

    ``-inf`` when ``p_lo <= δ`` (the event says nothing at this δ).
    """
    p_lo, _ = clopper_pearson(k, n, alpha)
    _, q_hi = clopper_pearson(k_other, n_other, alpha)
    if p_lo <= delta:
        return -math.inf
    return math.log((p_lo - delta) / q_hi)


def threshold_event(first, second, thresholds, delta=0.0, alpha=ALPHA):
    """The threshold ``c`` of the event ``{s >= c}`` with the largest ε_lb on a pilot sample.

    ``first`` and ``second`` are pilot values of a scalar statistic s under
    the input the event should favour and the other one. Returns
    ``(c, pilot ε_lb)``.
    """
    first = np.sort(np.asarray(first, dtype=np.float64))
    second = np.sort(np.asarray(second, dtype=np.float64))
    best = (None, -math.inf)
    for c in thresholds:
        k = first.size - np.searchsorted(first, c, side="left")
        k_other = second.size - np.searchsorted(second, c, side="left")
        bound = epsilon_lower_bound(k, first.size, k_other, second.size, delta, alpha)
        if bound > best[1]:
            best = (float(c), bound)
    return best


def orthant_event(first, second, grid, delta=0.0, alpha=ALPHA, rounds=3):
    """Per-coordinate thresholds ``c`` of the event ``{u_j >= c_j for every j}``, chosen on a pilot.

    ``first`` and ``second`` are ``(n, k)`` pilot samples of k coordinates
    (oriented so that the favoured input makes them larger). Coordinate
    ascent over ``grid`` (each coordinate in turn takes the grid value that
    maximises the pilot ε_lb given the others), from the smallest value for
    every coordinate, ``rounds`` passes. Returns ``(c, pilot ε_lb)``.
    """
    first = np.asarray(first, dtype=np.float64)
    second = np.asarray(second, dtype=np.float64)
    k = first.shape[1]
    grid = list(grid)
    c = [grid[0]] * k

    def bound(cs):
        a = np.all(first >= np.asarray(cs), axis=1).sum()
        b = np.all(second >= np.asarray(cs), axis=1).sum()
        return epsilon_lower_bound(a, first.shape[0], b, second.shape[0], delta, alpha)

    best = bound(c)
    for _ in range(rounds):
        improved = False
        for j in range(k):
            for value in grid:
                trial = list(c)
                trial[j] = value
                b = bound(trial)
                if b > best:
                    best, c, improved = b, trial, True
        if not improved:
            break
    return np.asarray(c, dtype=np.float64), best


def gaussian_delta(mu, epsilon):
    """The exact δ(ε) of a Gaussian pair at distance μ (Balle & Wang 2018, Thm. 8):
    ``Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)``; a mechanism whose neighbours are at most μ
    apart (in its noise's Mahalanobis norm) is (ε, δ)-DP exactly for δ >= this."""
    if mu <= 0:
        return 0.0
    return float(stats.norm.cdf(mu / 2 - epsilon / mu)
                 - math.exp(epsilon) * stats.norm.cdf(-mu / 2 - epsilon / mu))
