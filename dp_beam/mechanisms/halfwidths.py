"""Exact half-widths of the central intervals of sums of independent noises.

A release record carries ``ci95``: the half-width x with ``P(|noise| <= x) =
0.95`` of the noise in its value, a public function of the mechanism's
parameters and the step (``docs/privacy/counting.md`` C-7). For Gaussian
noise that is a normal quantile; for the Laplace mechanisms the noise is a
sum of independent Laplace variables (one per live tree node), whose law
is inverted here: in closed form when that is well conditioned, else by
numerical integration (Gil-Pelaez), the reference the closed form is
tested against.
"""

import decimal
import functools
import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import integrate, optimize, stats

from .checks import check_scale

__all__ = ["laplace_sum_halfwidth", "gaussian_halfwidth"]


def _check_level(level):
    try:
        level = float(level)
    except (TypeError, ValueError):
        raise ValueError(f"level must be in (0, 1), got {level!r}") from None
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return level


def _sum_cdf_abs(x, scales):
    """P(|Σ Z_i| <= x) for Z_i ~ Lap(scales[i]) independent, max scale 1.

    Gil-Pelaez for a symmetric law: P(|S| <= x) = (2/π) ∫_0^∞ sin(ux) φ(u)/u du
    with φ(u) = Π 1/(1 + b_i² u²). The integrand is smooth at 0 (→ x φ(0)) but
    oscillates with only algebraic decay, so the tail [A, ∞) is handed to
    QUADPACK's Fourier-integral routine (QAWF), which is built for exactly
    that; A = 1 is past the point where the slowest factor 1/(1+u²) has started
    to decay, since the largest scale is normalised to 1.
    """
    if x <= 0.0:
        return 0.0
    b2 = np.asarray(scales, dtype=np.float64) ** 2

    def phi_over_u(u):
        return 1.0 / (u * np.prod(1.0 + b2 * u * u))

    def head(u):
        if u == 0.0:
            return x
        return math.sin(u * x) / u / np.prod(1.0 + b2 * u * u)

    a = 1.0
    head_val, _ = integrate.quad(head, 0.0, a, limit=200, epsabs=1e-13, epsrel=1e-12)
    tail_val, _ = integrate.quad(
        phi_over_u, a, np.inf, weight="sin", wvar=x, limlst=100, epsabs=1e-13
    )
    value = (2.0 / math.pi) * (head_val + tail_val)
    return min(max(value, 0.0), 1.0)


#: Most terms the closed form takes. Its tail polynomial has degree n-1 and
#: coefficients down to 1/(2^{n-1}(n-1)!), which stays a normal float up to
#: n ≈ 150; past that (the many-node combinations of ``counting.intervals``)
#: the numerical routine is used.
_CLOSED_FORM_MAX_TERMS = 128

#: Largest accepted bound on the relative error of a closed-form tail
#: probability. The half-width moves by (tail/(x·density))·δ relative, at most
#: ~1.5δ for levels >= 0.5, so this keeps it within ~1.5e-11: far below the
#: numerical routine's own integration accuracy (epsrel 1e-12 on P(|S|<=x),
#: i.e. up to 1e-10 relative on a 1 % tail).
_CLOSED_FORM_TAIL_RTOL = 1e-11

#: Most decimal digits the closed form may use when float cancellation is too
#: large (distinct scales: the partial-fraction terms alternate in sign). A
#: Decimal evaluation costs ~10 µs per exp at this size; cancellation beyond
#: ~40 digits (scales closer than ~1e-3 with multiplicities, or ~1e-6 for
#: single terms) goes to the numerical routine.
_CLOSED_FORM_MAX_DIGITS = 60


@functools.lru_cache(maxsize=_CLOSED_FORM_MAX_TERMS)
def _gamma_difference_tail(n):
    """Exact ``(numerator, denominator)`` ints of d_i, with ``P(|Σ_{j<n} Z_j| > y) = e^{-y} Σ_{i<n} d_i y^i``.

    Z_j ~ Lap(1) i.i.d. A Lap(1) is the difference of two Exp(1), so the sum
    is G - G' with G, G' i.i.d. Gamma(n, 1), whose density is the finite series
    ``f(s) = e^{-|s|} Σ_{j<n} (2n-2-j)! 2^j |s|^j / (2^{2n-1} (n-1)! j! (n-1-j)!)``;
    ``∫_y^∞ s^j e^{-s} ds = j! e^{-y} Σ_{i<=j} y^i/i!`` then gives
    ``d_i = Σ_{j=i}^{n-1} (2n-2-j)! 2^j / (n-1-j)! / (4^{n-1} (n-1)! i!)`` (d_0 = 1).
    All d_i are positive, so for equal scales the tail has no cancellation.
    """
    f = math.factorial
    terms = [f(2 * n - 2 - j) * 2 ** j // f(n - 1 - j) for j in range(n)]
    denominator = 4 ** (n - 1) * f(n - 1)
    out, suffix = [None] * n, 0
    for i in range(n - 1, -1, -1):
        suffix += terms[i]
        out[i] = (suffix, denominator * f(i))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _tail_row(k, digits):
    """The d_i of :func:`_gamma_difference_tail` (k) as floats, or Decimals of ``digits`` digits."""
    # Python's int/int division and Decimal division both round the exact
    # rational once, so each entry is correctly rounded.
    if digits is None:
        return np.array([a / b for a, b in _gamma_difference_tail(k)])
    with decimal.localcontext(decimal.Context(prec=digits)):
        return np.array([decimal.Decimal(a) / b for a, b in _gamma_difference_tail(k)], dtype=object)


def _gather(coeffs, digits):
    """Coefficients of ``Σ_k coeffs[k-1] Σ_i d_{k,i} y^i``, one polynomial in y."""
    out = np.zeros(len(coeffs), dtype=np.float64 if digits is None else object)
    for k, c in enumerate(coeffs, start=1):
        if c:  # equal scales have a single nonzero term, k = m
            out[:k] += c * _tail_row(k, digits)
    return out.tolist()


def _partial_fractions(terms):
    """Partial fractions of ``Π_j (1 + β_j t)^{-m_j}`` in t, with β_j = b_j², distinct b_j.

    Works on floats or Decimals. Returns ``[(b_j, c_j, bound_j)]`` with
    ``c_j[k-1]`` the coefficient of ``(1 + β_j t)^{-k}``, k = 1..m_j, and
    ``bound_j >= |c_j|`` elementwise, or None when a float coefficient
    overflows. Near the pole of j, with w = 1 + β_j t, the other factors are
    ``(1 + β_l t) = (β_j - β_l)/β_j · (1 + r_l w)``, r_l = β_l/(β_j - β_l), so
    ``c_j[m_j-1-p] = Π_l (β_j/(β_j-β_l))^{m_l} · [w^p] Π_l (1 + r_l w)^{-m_l}``.
    Each factor ``(1 + r w)^{-m}`` is the binomial series
    ``Σ_p C(m+p-1, p) (-r)^p w^p``, multiplied in by convolution; the bound
    uses |r| (all terms positive), so it dominates the coefficients and the
    rounding errors made on the way.
    β_j - β_l is formed as (b_j - b_l)(b_j + b_l): the difference of close
    floats is exact (Sterbenz), so it keeps its relative precision.
    """
    dtype = object if isinstance(terms[0][0], decimal.Decimal) else np.float64
    out = []
    for j, (bj, mj) in enumerate(terms):
        series, bound, factor = np.ones(1, dtype=dtype), np.ones(1, dtype=dtype), 1
        for l, (bl, ml) in enumerate(terms):
            if l == j:
                continue
            gap = (bj - bl) * (bj + bl)
            factor *= (bj * bj / gap) ** ml
            if mj > 1:  # a simple pole (m_j = 1) needs the factor only
                r = bl * bl / gap
                series = np.convolve(series, _binomial_series(-r, ml, mj, dtype))[:mj]
                bound = np.convolve(bound, _binomial_series(abs(r), ml, mj, dtype))[:mj]
        series = np.concatenate([series, np.zeros(mj - len(series), dtype=dtype)])
        bound = np.concatenate([bound, np.zeros(mj - len(bound), dtype=dtype)])
        if not all(math.isfinite(v) for v in bound.tolist() + [factor]):
            return None
        out.append((bj, (factor * series[::-1]).tolist(), (abs(factor) * bound[::-1]).tolist()))
    return out


def _binomial_series(x, m, length, dtype):
    """The first ``length`` coefficients of ``(1 - x w)^{-m} = Σ_p C(m+p-1, p) x^p w^p``."""
    out = np.empty(length, dtype=dtype)
    out[0] = 1
    for p in range(1, length):
        out[p] = out[p - 1] * x * (m + p - 1) / p
    return out


@functools.lru_cache(maxsize=4096)
def _mixture_tail(terms, digits=None):
    """``(context, [(1/b_j, e_j, E_j)])`` with ``P(|S| > x) = Σ_j e^{-y_j} e_j(y_j)``, y_j = x/b_j.

    ``terms`` are ``(b_j, m_j)`` with distinct b_j > 0: S is the sum of m_j
    i.i.d. Lap(b_j) for each j. Its characteristic function
    ``Π_j (1 + b_j² u²)^{-m_j}`` is, by partial fractions in t = u², the
    signed combination ``Σ_{j,k} c_jk (1 + b_j² u²)^{-k}`` of characteristic
    functions of sums of k i.i.d. Lap(b_j). The law of S is therefore that
    signed mixture (a characteristic function determines its law), and so is
    its tail, ``Σ_{j,k} c_jk e^{-y_j} Σ_i d_{k,i} y_j^i`` with the exact d of
    :func:`_gamma_difference_tail`, gathered into one polynomial e_j per scale.
    E_j is the same with the bounds on |c_jk|: :func:`_closed_form_error_bound`
    uses it to measure what cancellation can amplify rounding errors into.
    Floats when ``digits`` is None, else Decimals with that many digits
    (the float scales convert exactly). None when the form does not apply.
    """
    if sum(m for _, m in terms) > _CLOSED_FORM_MAX_TERMS:
        return None
    context = None if digits is None else decimal.Context(prec=digits)
    exact = None if context is None else decimal.Decimal
    with decimal.localcontext(context or decimal.getcontext()):
        try:
            fractions = _partial_fractions(terms if exact is None else [(exact(b), m) for b, m in terms])
        except OverflowError:  # float ** int raises where * gives inf: scales nearly equal
            return None
        if fractions is None:
            return None
        parts = [(1 / bj, _gather(coeffs, digits), _gather(bounds, digits)) for bj, coeffs, bounds in fractions]
    return context, parts


def _horner(coefficients, y):
    value = 0
    for c in reversed(coefficients):
        value = value * y + c
    return value


def _closed_form_tail(x, mixture):
    """P(|S| > x) from a :func:`_mixture_tail` expansion, as a float."""
    context, parts = mixture
    if context is None:
        return sum(math.exp(-x * inv) * _horner(poly, x * inv) for inv, poly, _ in parts)
    with decimal.localcontext(context):
        x = decimal.Decimal(x)
        return float(sum((-x * inv).exp() * _horner(poly, x * inv) for inv, poly, _ in parts))


def _closed_form_error_bound(x, mixture):
    """Bound on the absolute rounding error of :func:`_closed_form_tail` at x.

    ``ulp · (16 n + 64 + 2 y_j)`` times the term magnitudes
    ``e^{-y_j} E_j(y_j)``, summed: n = Σ m_j covers the ~4n roundings along
    any path through the partial fractions (powers, series recurrences, the
    product with d, Horner) with a factor ~4 to spare, and 2 y_j the rounding
    of y_j itself, which e^{-y} amplifies. For equal scales E_j = e_j and the
    bound is a few hundred ulps of the tail; cancellation scales it up.
    """
    context, parts = mixture
    n = sum(len(poly) for _, poly, _ in parts)
    if context is None:
        ulp = float(np.finfo(np.float64).eps)
        return ulp * sum((16 * n + 64 + 2 * x * inv) * math.exp(-x * inv) * _horner(bound, x * inv)
                         for inv, _, bound in parts)
    with decimal.localcontext(context):
        x, ulp = decimal.Decimal(x), decimal.Decimal(10) ** (1 - context.prec)
        return float(ulp * sum((16 * n + 64 + 2 * x * inv) * (-x * inv).exp() * _horner(bound, x * inv)
                               for inv, _, bound in parts))


def _closed_form_root(terms, digits, level, brackets):
    """``(root, error ratio)`` of the closed form at ``digits``, or None if it does not apply.

    Brent's method solves ``P(|S| > x) = 1 - level`` on the first of
    ``brackets`` that holds a sign change; the error bound is then checked at
    the root, where it matters: when the computed tail there is within
    ``_CLOSED_FORM_TAIL_RTOL`` of the true one (ratio <= 1), the root is the
    true one to ~1.5 times that, whatever happened elsewhere.
    """
    mixture = _mixture_tail(terms, digits)
    if mixture is None:
        return None
    target = 1.0 - level
    for lo, hi in brackets:
        try:
            root = optimize.brentq(lambda x: _closed_form_tail(x, mixture) - target, lo, hi,
                                   xtol=1e-15, rtol=4e-15, maxiter=200)
        except (ValueError, RuntimeError):  # no sign change (narrow bracket, or noise)
            continue
        return root, _closed_form_error_bound(root, mixture) / (_CLOSED_FORM_TAIL_RTOL * target)
    return math.nan, math.inf


def _closed_form_halfwidth(scales, level):
    """Exact half-width from the closed-form tail, or None when it is too ill-conditioned.

    ``scales`` is a sorted tuple with maximum 1 (a :func:`laplace_sum_halfwidth`
    key). Floats first; when the error bound fails (cancellation between
    distinct scales), again in Decimal with the digits the float attempt
    showed to be missing, up to ``_CLOSED_FORM_MAX_DIGITS``, searching first
    near the float root: its relative error is below ~1.5 × ratio × RTOL.
    """
    counts = {}
    for s in scales:
        if s > 0.0:  # Lap(0) = 0; rounding the key can make a tiny scale 0
            counts[s] = counts.get(s, 0) + 1
    terms = tuple(sorted(counts.items()))
    # The union bound of _numerical_halfwidth: the root lies below it.
    full = (0.0, sum(scales) * math.log(len(scales) / (1.0 - level)) * 1.01 + 1e-9)
    brackets, digits = [full], None
    for _ in range(3):
        found = _closed_form_root(terms, digits, level, brackets)
        if found is None:
            return None
        root, ratio = found
        if ratio <= 1.0:
            return root
        have = 16 if digits is None else digits
        # No usable ratio (no root found, or an overflow made it nan): try quad-like precision.
        digits = have + 18 if not math.isfinite(ratio) else have + math.ceil(math.log10(ratio)) + 4
        digits = -(-digits // 8) * 8  # few distinct precisions, so _tail_row's cache is reused
        if digits > _CLOSED_FORM_MAX_DIGITS:
            return None
        if math.isfinite(ratio):
            delta = min(0.5, 4.0 * ratio * _CLOSED_FORM_TAIL_RTOL + 1e-13)
            brackets = [(root * (1.0 - delta), root * (1.0 + delta)), full]
    return None


def _numerical_halfwidth(scales, level):
    """Half-width by Gil-Pelaez integration (:func:`_sum_cdf_abs`): the reference and fallback."""
    # Union bound: P(|S| > x) <= Σ P(|Z_i| > x b_i / Σb) = K e^{-x/Σb}, so the
    # root lies below Σb · ln(K/(1-level)) and the bracket is always valid.
    upper = sum(scales) * math.log(len(scales) / (1.0 - level)) * 1.01 + 1e-9
    return optimize.brentq(
        lambda x: _sum_cdf_abs(x, scales) - level, 0.0, upper, xtol=1e-13, rtol=1e-12, maxiter=200
    )


@functools.lru_cache(maxsize=4096)
def _normalised_halfwidth(scales, level):
    # The closed form is exact and ~100x faster; the numerical routine takes
    # the patterns where its cancellation would cost accuracy.
    width = _closed_form_halfwidth(scales, level)
    return _numerical_halfwidth(scales, level) if width is None else width


def laplace_sum_halfwidth(scales: ArrayLike, level: float = 0.95) -> float:
    """Exact half-width of the central ``level`` interval of a sum of Laplaces.

    Returns the x with ``P(|Σ Z_i| <= x) = level`` for independent
    ``Z_i ~ Lap(scales[i])``, the noise of a binary-mechanism release
    (``docs/privacy/counting.md`` C-7). Unlike the tail bound of CSS10
    (Chan, Shi and Song 2010) this is exact, so the interval has the stated coverage and no more.

    The tail ``P(|Σ Z_i| > x)`` is a finite closed form (``_mixture_tail``):
    n i.i.d. Lap(b) sum to a difference of two Gamma(n, b), whose tail is
    ``e^{-x/b}`` times a polynomial with positive coefficients, and distinct
    scales combine by partial fractions of the characteristic function. It is
    inverted with Brent's method in ~0.05–0.2 ms (floats), or ~0.5–2 ms (a
    few distinct scales; ~5 ms for 25) when distinct scales cancel and
    Decimal arithmetic is needed; a rounding-error bound checked at the root
    guarantees the tail to 1e-11 relative. Patterns where that fails (scales nearly equal but distinct, more than 128 terms)
    use numerical integration of the characteristic function
    (``_sum_cdf_abs``, ~20–60 ms), the former sole method. Scales are
    normalised by their maximum and cached, so the many releases that share
    a noise pattern cost one inversion.
    A single term gives ``b·ln(1/(1-level))`` (``b·ln 20`` at 95 %).

    >>> round(laplace_sum_halfwidth([1.0, 1.0]), 11)  # (2 + x) e^{-x} / 2 = 0.05
    4.11300328072
    """
    level = _check_level(level)
    values = []
    for s in np.atleast_1d(np.asarray(scales, dtype=np.float64)).ravel():
        if not math.isfinite(s) or s < 0:
            raise ValueError(f"scales must be finite and >= 0, got {s!r}")
        if s > 0:
            values.append(float(s))
    if not values:
        return 0.0
    bmax = max(values)
    if len(values) == 1:
        return bmax * math.log(1.0 / (1.0 - level))
    # Rounding the normalised scales keeps cache keys stable against
    # last-bit differences in how callers computed them; 1e-12 relative is far
    # below the accuracy of the numerical fallback.
    key = tuple(sorted(round(v / bmax, 12) for v in values))
    return bmax * _normalised_halfwidth(key, level)


def gaussian_halfwidth(std: float, level: float = 0.95) -> float:
    """Half-width ``std·Φ⁻¹((1+level)/2)`` of the central ``level`` interval of N(0, std²).

    The noise of a Gaussian binary-mechanism release is Gaussian (a sum of
    independent normals), so this is exact (``docs/privacy/counting.md`` C-7).
    """
    level = _check_level(level)
    std = check_scale("std", std)
    return std * _normal_quantile(level)


@functools.lru_cache(maxsize=64)
def _normal_quantile(level):
    """Φ⁻¹((1+level)/2); SciPy's ppf costs ~0.3 ms, and releases ask for one level."""
    return float(stats.norm.ppf((1.0 + level) / 2.0))
