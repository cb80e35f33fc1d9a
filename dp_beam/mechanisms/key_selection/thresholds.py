"""Public thresholds of key selection: tail quantiles and certified sparse-vector bounds.

The counter method's threshold is ``1 + q_t`` with ``q_t`` a tail quantile of
the counter's noise (claims 3 and 5 of :mod:`.counter`; K-5 in
``docs/privacy/key_selection.md``): :func:`laplace_tail_quantile` for Laplace
node noises. The sparse-vector method's threshold is the smallest excess
whose certified bound on a one-unit key's admission probability is at most
δ₁ (claims 13 and 14 of :mod:`.sparse_vector`; K-5):
:func:`sparse_vector_admission_bounds` and :func:`sparse_vector_excess`.
"""

import math
import numbers
from typing import Iterable, Optional, Tuple

import numpy as np
from scipy import optimize

from ..checks import check_int

__all__ = ["laplace_tail_quantile", "sparse_vector_admission_bounds", "sparse_vector_excess",
           "SVT_CELLS_PER_SCALE", "SVT_EXACT_EPOCHS", "SVT_ROUNDING_MARGIN", "SVT_TAIL_FRACTION"]


def _chernoff_exponent_gap(u, ratios, log_inv_p):
    # Stationarity of f(u) = (L + G(u))/u with G(u) = −Σ log(1 − u²r²): the
    # minimiser solves u·G'(u) − G(u) = L, and the left side increases from 0.
    total = 0.0
    for r in ratios:
        a = (u * r) ** 2
        total += 2.0 * a / (1.0 - a) + math.log1p(-a)
    return total - log_inv_p


def _chernoff_q(u, ratios, log_inv_p):
    return (log_inv_p - sum(math.log1p(-((u * r) ** 2)) for r in ratios)) / u


def laplace_tail_quantile(scales: Iterable[float], probability: float) -> float:
    """A q with ``P(Σ Z_i >= q) <= probability`` for independent ``Z_i ~ Lap(scales[i])``.

    One term: the exact quantile ``b·ln(1/(2p))`` (``−b·ln(2(1−p))`` for
    p > 1/2). Several: the smallest q certified by the Chernoff bound
    ``log P(Z >= q) <= −s·q − Σ log(1 − s²b_i²)``, ``0 < s < 1/max b_i``,
    i.e. ``q = min_s (ln(1/p) − Σ log(1 − s²b_i²))/s``. With ``u = s·max b``
    and ``r_i = b_i / max b`` the objective is ``max b·f(u)`` on ``(0, 1)``;
    ``f`` has a single stationary point, where ``u·G'(u) − G(u) = ln(1/p)``
    (G the log-sum, the left side increasing from 0), which Brent's method
    finds inside a bracket that is widened until it holds the root. The bound
    holds at every u, so an inexact root only loosens q slightly; it is never
    below the true quantile.

    >>> round(laplace_tail_quantile([2.0], 0.05), 6)        # exact: 2·ln 10
    4.60517
    >>> round(laplace_tail_quantile([1.0, 1.0, 1.0], 1e-6), 2)
    20.76
    """
    values = []
    for b in list(scales):
        if isinstance(b, bool) or not isinstance(b, numbers.Real) or not math.isfinite(b) or b <= 0:
            raise ValueError(f"scales must be finite numbers > 0, got {b!r}")
        values.append(float(b))
    if not values:
        raise ValueError("scales must not be empty")
    if isinstance(probability, bool) or not isinstance(probability, numbers.Real):
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    p = float(probability)
    if not 0.0 < p < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    bmax = max(values)
    if len(values) == 1:
        if p <= 0.5:
            return bmax * math.log(1.0 / (2.0 * p))
        return -bmax * math.log(2.0 * (1.0 - p))
    ratios = [b / bmax for b in values]
    log_inv_p = -math.log(p)
    hi = 0.5
    # The gap tends to +∞ as u → 1; halving the distance to 1 reaches any
    # log(1/p) a float can hold within a few dozen widenings.
    for _ in range(60):
        if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
            break
        hi = 1.0 - (1.0 - hi) / 2.0
    if _chernoff_exponent_gap(hi, ratios, log_inv_p) > 0.0:
        u = optimize.brentq(_chernoff_exponent_gap, 1e-300, hi, args=(ratios, log_inv_p),
                            xtol=1e-15, rtol=1e-13, maxiter=200)
    else:
        u = hi
    return bmax * _chernoff_q(u, ratios, log_inv_p)


#: Grid cells per ``b_ν`` in :func:`sparse_vector_admission_bounds` (claim 14).
SVT_CELLS_PER_SCALE = 200
#: Epochs that enter h exactly when the horizon is unbounded (claim 14).
SVT_EXACT_EPOCHS = 64
#: Relative margin required of the certified bound over δ₁ (float rounding; claim 14).
SVT_ROUNDING_MARGIN = 1e-9
#: Mass of ρ left outside the grid on each side, relative to δ₁ (claim 14).
SVT_TAIL_FRACTION = 1e-10


def _log_below(y, b):
    """``log P(ν < y)`` for ``ν ~ Lap(b)``, elementwise (exact)."""
    y = np.asarray(y, dtype=np.float64)
    upper = np.log1p(-0.5 * np.exp(-np.maximum(y, 0.0) / b))
    lower = np.minimum(y, 0.0) / b - math.log(2.0)
    return np.where(y >= 0.0, upper, lower)


def _svt_cross_probability(x, step_scale, horizon):
    """``h(x) = P(∃t: ν_t >= x + g(t))`` for independent ``ν_t ~ Lap(step_scale)`` (claim 13).

    Exact for a bounded horizon; unbounded, epochs below
    :data:`SVT_EXACT_EPOCHS` exactly and the rest by a bound, so the value
    is an upper bound on h and decreasing in x.
    """
    x = np.asarray(x, dtype=np.float64)
    b = step_scale
    if horizon is not None:
        return -np.expm1(horizon * _log_below(x, b))
    log_none = np.zeros_like(x)
    step = 2.0 * b * math.log(2.0)
    for j in range(SVT_EXACT_EPOCHS):
        log_none += math.ldexp(1.0, j) * _log_below(x + j * step, b)
    last = x + SVT_EXACT_EPOCHS * step
    tail = np.where(last >= 0.0,
                    np.exp(np.minimum(-x / b, 700.0)) * math.ldexp(1.0, -SVT_EXACT_EPOCHS), 1.0)
    return np.minimum(1.0, -np.expm1(log_none) + tail)


def sparse_vector_admission_bounds(excess: float, offset_scale: float, step_scale: float,
                                   horizon: Optional[int],
                                   tail_mass: float) -> Tuple[float, float]:
    """Certified ``(lower, upper)`` bounds on ``P(∃t: ν_t >= excess + g(t) + ρ)`` (claims 13, 14).

    ``ρ ~ Lap(offset_scale)``, independent ``ν_t ~ Lap(step_scale)``,
    ``t = 1..horizon`` (an int), or all t >= 1 for ``horizon=None`` with
    ``g(t) = 2⌊log2 t⌋·step_scale·ln 2`` (``g ≡ 0`` when bounded). For a
    key's selection with threshold τ, ``excess = τ − 1`` gives the bounds on
    the admission probability of a key one unit contributed to, and
    ``excess = τ`` those of a key without data (δ₀).

    The expectation over ρ is bracketed on a grid of spacing
    ``step_scale/200`` that contains 0 and leaves ``tail_mass`` of ρ outside
    on each side (counted as 1 in the upper bound, 0 or ``h`` in the lower),
    using that ``h`` decreases: left cell ends give the upper bound, right
    ends the lower.

    >>> lo, hi = sparse_vector_admission_bounds(10.0, 1.0, 1.0, 1, 1e-12)
    >>> exact = (1 + 10 / 2) * math.exp(-10) / 2        # P(Lap(1) − Lap(1) >= 10)
    >>> lo <= exact <= hi, round(hi / lo, 3)
    (True, 1.005)
    """
    for name, value in (("offset_scale", offset_scale), ("step_scale", step_scale)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if isinstance(excess, bool) or not isinstance(excess, numbers.Real) or not math.isfinite(excess):
        raise ValueError(f"excess must be a finite number, got {excess!r}")
    if horizon is not None:
        horizon = check_int("horizon", horizon, 1)
    if isinstance(tail_mass, bool) or not isinstance(tail_mass, numbers.Real) or not (
            0.0 < tail_mass < 0.5):
        raise ValueError(f"tail_mass must be in (0, 0.5), got {tail_mass!r}")
    br, bn = float(offset_scale), float(step_scale)
    spacing = bn / SVT_CELLS_PER_SCALE
    half_width = br * math.log(0.5 / tail_mass)      # P(ρ < −half_width) = tail_mass
    k = math.ceil(half_width / spacing)
    edges = np.arange(-k, k + 1, dtype=np.float64) * spacing
    left = edges[:-1]
    # Exact Laplace mass of [r_i, r_i + spacing): no cell straddles 0.
    below = 0.5 * np.exp(np.minimum(left, 0.0) / br) * math.expm1(spacing / br)
    above = 0.5 * np.exp(-np.maximum(left, 0.0) / br) * -math.expm1(-spacing / br)
    mass = np.where(left < 0.0, below, above)
    h = _svt_cross_probability(float(excess) + edges, bn, horizon)
    outside_low = 0.5 * math.exp(edges[0] / br)
    outside_high = 0.5 * math.exp(-edges[-1] / br)
    upper = outside_low + float(np.sum(h[:-1] * mass)) + float(h[-1]) * outside_high
    lower = float(h[0]) * outside_low + float(np.sum(h[1:] * mass))
    return lower, min(1.0, upper)


def sparse_vector_excess(offset_scale: float, step_scale: float, horizon: Optional[int],
                         target: float) -> float:
    """The smallest excess (to solver precision) whose certified bound, with margin, is <= target."""
    tail = target * SVT_TAIL_FRACTION
    limit = target / (1.0 + SVT_ROUNDING_MARGIN)

    def upper(a):
        return sparse_vector_admission_bounds(a, offset_scale, step_scale, horizon, tail)[1]

    lo = 0.0
    if upper(lo) <= limit:      # only for target >= 1/2; not reached from a KeySelection
        return lo
    hi = (offset_scale + step_scale) * (math.log(1.0 / target) + 1.0)
    while upper(hi) > limit:
        lo, hi = hi, 2.0 * hi
    gap = lambda a: math.log(upper(a)) - math.log(limit)  # noqa: E731
    xtol = 1e-9 * (offset_scale + step_scale)
    a = optimize.brentq(gap, lo, hi, xtol=xtol, rtol=1e-12, maxiter=200)
    # brentq lands within xtol of the crossing, on either side: step up until certified.
    while upper(a) > limit:
        a += xtol
    return a

