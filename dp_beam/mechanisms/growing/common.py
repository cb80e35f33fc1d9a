"""Shared pieces of the growing-database mechanisms: validation, exact epoch arithmetic, noise.

``docs/privacy/growing.md`` (seed 000, Cummings, Krehbiel, Lai and
Tantipongpipat, "Differential Privacy for Growing Databases"), G-1, G-2, G-4:

* :func:`rho_star`: the exact inverse ρ*(ε, δ) = (√(L+ε) − √L)² of the zCDP
  conversion (Theorem 4), used by every (ε, δ) schedule;
* :func:`exact_gamma` and :class:`EpochTimes`: the epoch boundaries
  t_i = ⌈n(1+γ)^i⌉ in exact arithmetic (``ceil(1000·1.1²)`` is 1210, not the
  1211 that a floating-point power gives);
* :func:`harmonic_tail`: Σ_{τ=n+1}^{t} 1/τ, the public quantity of PMWG's
  hard-query cap (Corollary 16);
* :func:`grid_laplace_exact`: a Laplace draw on a caller-chosen power-of-two
  grid, returned as an exact :class:`~fractions.Fraction`, so that the sparse
  vector tests compare exact rationals (with the production
  :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` the draw is an exact
  discrete Laplace).

Everything here is public arithmetic; nothing touches private data.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from typing import List, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..calibration import rho_from_eps, rho_from_eps_delta
from ..checks import check_int, check_real
from ..noise import NoiseSource

__all__ = [
    "rho_star",
    "exact_gamma",
    "EpochTimes",
    "epoch_times",
    "harmonic_tail",
    "grid_laplace_exact",
    "fine_grid_exponent",
    "round_exact",
    "as_query",
    "GRID_BITS",
    "growing_cost",
]

#: A statistic of sensitivity Δ is rounded to the grid 2^(⌊log2 Δ⌋ − GRID_BITS) before it
#: is noised, so the rounded statistic has sensitivity at most Δ·(1 + 2^−GRID_BITS).
GRID_BITS = 40


def rho_star(epsilon: float, delta: float) -> float:
    """ρ*(ε, δ) = (√(L+ε) − √L)², L = log(1/δ): the largest ρ with ρ + 2√(ρL) <= ε
    (growing.md G-1, G-2, G-4).

    >>> round(rho_star(1.0, 1e-6), 10)
    0.0174689048
    """
    return rho_from_eps_delta(epsilon, delta)


def growing_cost(epsilon: float, delta: float, square_sum: Optional[float] = None) -> Cost:
    """The cost of a whole unbounded growing-database run (growing.md G-4, G-5, G-8).

    (ε, δ)-DP with ρ*(ε, δ)-zCDP when δ > 0 (the schedules are calibrated to ρ*,
    so ε is the caller's); otherwise pure ε-DP with ρ = Σε_i²/2 over the runs'
    budgets ε_i, ``square_sum`` (default ε², one budget, whose ρ is then
    :func:`~dp_beam.mechanisms.calibration.rho_from_eps`, the ε → ρ conversion
    every pure-ε cost uses).

    >>> growing_cost(1.0, 0.0)
    Cost(epsilon=1.0, delta=0.0, rho=0.5)
    >>> growing_cost(1.0, 1e-6) == Cost.gaussian(rho_star(1.0, 1e-6), 1e-6, epsilon=1.0)
    True
    """
    if delta > 0:
        return Cost.gaussian(rho_star(epsilon, delta), delta, epsilon=epsilon)
    if square_sum is None:
        return Cost(epsilon, 0.0, rho_from_eps(epsilon))
    # Σ rho_from_eps(ε_i) = Σε_i²/2: the scheduler sums the squares in closed form.
    return Cost(epsilon, 0.0, 0.5 * square_sum)


def exact_gamma(gamma: float) -> Fraction:
    """γ rounded *down* to at most 12 significant digits, as an exact Fraction (growing.md G-4).

    The rounding is data-independent and the analysis holds for every γ in
    (0, 1], so the exact epoch arithmetic can use a short rational.

    >>> exact_gamma(0.1), exact_gamma(0.0819179155123456)
    (Fraction(1, 10), Fraction(819179155123, 10000000000000))
    """
    gamma = check_real("gamma", gamma, positive=True, at_most=1.0)
    ctx = Context(prec=12, rounding=ROUND_FLOOR)
    value = Fraction(ctx.plus(Decimal(repr(gamma))))
    if value <= 0:
        raise ValueError(f"gamma must be >= 1e-300, got {gamma!r}")
    return value


class EpochTimes:
    """t_i = ⌈n·(1+γ)^i⌉ for an exact rational γ, computed without floating-point error.

    Small i use exact Fraction powers. For large i (where exact powers grow to
    thousands of digits) the power is computed in 80-digit decimal arithmetic,
    and only when the result is within 10^−40 (relative) of an integer is the
    exact power computed to decide the ceiling. Memoised; public arithmetic.

    >>> EpochTimes(1000, Fraction(1, 10)).first(8)
    [1000, 1100, 1210, 1331, 1465, 1611, 1772, 1949]
    >>> EpochTimes(100, Fraction(1, 4)).first(8)
    [100, 125, 157, 196, 245, 306, 382, 477]
    """

    _EXACT_UP_TO = 64

    def __init__(self, n: int, gamma: Fraction) -> None:
        self.n = check_int("n", n, 1)
        if not isinstance(gamma, Fraction) or not 0 < gamma <= 1:
            raise ValueError(f"gamma must be a Fraction in (0, 1], got {gamma!r}")
        self.gamma = gamma
        self._base = 1 + gamma
        self._cache: dict = {}

    def __call__(self, i: int) -> int:
        i = check_int("i", i, 0)
        hit = self._cache.get(i)
        if hit is not None:
            return hit
        if i <= self._EXACT_UP_TO:
            value = self._exact(i)
        else:
            ctx = Context(prec=80)
            base = ctx.divide(Decimal(self._base.numerator), Decimal(self._base.denominator))
            power = ctx.multiply(Decimal(self.n), ctx.power(base, i))
            nearest = power.to_integral_value()
            if abs(power - nearest) <= abs(power) * Decimal(10) ** -40:
                value = self._exact(i)
            else:
                value = int(power.to_integral_value(rounding="ROUND_CEILING"))
        if len(self._cache) < 100_000:
            self._cache[i] = value
        return value

    def _exact(self, i: int) -> int:
        v = self.n * self._base ** i
        return -((-v.numerator) // v.denominator)

    def first(self, count: int) -> List[int]:
        return [self(i) for i in range(count)]

    def epoch_of(self, t: int) -> int:
        """The largest i with t_i <= t (t >= n), by doubling and bisection on the monotone t_i."""
        if t < self.n:
            raise ValueError(f"t must be >= n = {self.n}, got {t}")
        hi = 1
        while self(hi) <= t:
            hi *= 2
        lo = hi // 2 if hi > 1 else 0
        while lo < hi - 1:
            mid = (lo + hi) // 2
            if self(mid) <= t:
                lo = mid
            else:
                hi = mid
        return lo if self(lo) <= t else 0


def epoch_times(n: int, gamma: Union[float, Fraction], count: int) -> List[int]:
    """The first ``count`` epoch times ⌈n(1+γ)^i⌉ (γ a Fraction, or a float rounded by
    :func:`exact_gamma`).

    >>> epoch_times(1000, 0.1, 3)
    [1000, 1100, 1210]
    """
    if not isinstance(gamma, Fraction):
        gamma = exact_gamma(gamma)
    return EpochTimes(n, gamma).first(count)


def harmonic_tail(n: int, t: int) -> float:
    """Σ_{τ=n+1}^{t} 1/τ (0 for t <= n): an exact-rounded sum for short ranges, the digamma
    difference ψ(t+1) − ψ(n+1) beyond 10^4 terms. A function of (n, t) only, so batched and
    entry-by-entry processing get the same public value.

    >>> round(harmonic_tail(1000, 2000), 12) == round(sum(1 / k for k in range(1001, 2001)), 12)
    True
    """
    if t <= n:
        return 0.0
    if t - n <= 10_000:
        return math.fsum(1.0 / k for k in range(n + 1, t + 1))
    from scipy.special import digamma

    return float(digamma(t + 1.0) - digamma(n + 1.0))


def fine_grid_exponent(sensitivity: float) -> int:
    """e with 2^e <= sensitivity·2^−GRID_BITS: the grid a statistic of that sensitivity is
    rounded to before noise, so rounding adds at most a 2^−GRID_BITS fraction to it."""
    return math.frexp(sensitivity)[1] - 1 - GRID_BITS


def round_exact(x: float, exponent: int) -> Fraction:
    """x rounded half-to-even to a multiple of 2^exponent, exactly."""
    unit = Fraction(2) ** exponent
    return round(Fraction(float(x)) / unit) * unit


def grid_laplace_exact(source: NoiseSource, scale: float, exponent: int) -> Fraction:
    """One Lap(scale) draw as a multiple of 2^exponent, as an exact Fraction.

    ``source.integer_noise("laplace", scale, exponent, 1)``: an exact discrete
    Laplace with :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` (one call,
    one keyed stream), float noise rounded to the grid with the test sources,
    and 0 with :class:`~dp_beam.mechanisms.noise.ZeroNoise`.
    """
    z = source.integer_noise("laplace", float(scale), int(exponent), 1)[0]
    return Fraction(int(z)) * Fraction(2) ** int(exponent)


def as_query(query: ArrayLike, universe_size: int) -> np.ndarray:
    """A linear query as a float64 vector in [0, 1]^N: a vector, or a predicate on cell indices.

    ``ValueError`` (naming ``query``) for a wrong length, values outside [0, 1]
    or non-finite values.

    >>> as_query(lambda i: i % 2 == 0, 4).tolist()
    [1.0, 0.0, 1.0, 0.0]
    """
    if callable(query):
        query = [float(query(i)) for i in range(universe_size)]
    try:
        f = np.asarray(query, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"query must be a vector of N = {universe_size} numbers in [0, 1] "
                         f"or a predicate on cell indices, got {type(query).__name__}") from None
    if f.shape != (universe_size,):
        raise ValueError(f"query must have N = {universe_size} entries, got shape {f.shape}")
    if not np.all(np.isfinite(f)) or f.min(initial=0.0) < 0.0 or f.max(initial=0.0) > 1.0:
        raise ValueError("query entries must be finite and in [0, 1]")
    return f
