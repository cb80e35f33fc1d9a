"""The power-of-two grid of the production noise.

Noise of scale b is released as ``Z·2^k`` with ``k = grid_exponent(b) =
floor(log2 b) − GRID_PRECISION`` and Z an exact discrete Laplace (or
Gaussian) integer of scale ``b/2^k`` ∈ [2^30, 2^31) (:func:`grid_laplace`,
:func:`grid_gaussian`). A caller that adds it to :func:`round_to_grid` of its
statistic gets a float that is a function of the integer ``R + Z`` alone, so
the guarantee of the discrete mechanism covers the released float (Mironov
2012's attack has no low-order bits to read). Rounding widens the
sensitivity by at most one grid step per coordinate, which
:func:`grid_padded_scale` pays for: claim C-9 of ``docs/privacy/counting.md``.
"""

import functools
import math
from fractions import Fraction
from typing import Callable, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

from .checks import check_scale
from .exact_samplers import BitStream, discrete_gaussian, discrete_laplace

__all__ = [
    "GRID_PRECISION",
    "grid_exponent",
    "round_on_exponent",
    "grid_float",
    "grid_gaussian",
    "grid_laplace",
    "grid_padded_scale",
    "grid_ratio",
    "integer_ratio",
    "round_to_grid",
]

#: G: the grid of noise of scale b is 2^k with k = floor(log2 b) − G, so its
#: spacing is at most b·2^−G and the integer noise has scale in [2^G, 2^(G+1)).
GRID_PRECISION = 30

# Smallest exponent of a float64 bit: below it Z·2^k would not be exact.
_MIN_EXPONENT = -1074
# Integers of magnitude <= 2^53 are exact in float64.
_EXACT_INT = 1 << 53


def _positive_float(name, value):
    value = check_scale(name, value)
    if value == 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def grid_exponent(scale: float) -> int:
    """The exponent k of the grid 2^k on which noise of this scale lives.

    ``k = floor(log2 scale) − GRID_PRECISION`` (computed exactly from the
    float's exponent), so ``scale/2^k`` ∈ [2^30, 2^31); it is raised to
    −1074, float64's smallest bit, for scales below 2^−1044. The grid is a
    public function of the public scale.

    >>> grid_exponent(1.0), grid_exponent(1.5), grid_exponent(0.75), grid_exponent(1000.0)
    (-30, -30, -31, -21)
    """
    scale = _positive_float("scale", scale)
    # frexp gives scale = m·2^e with m ∈ [0.5, 1), so floor(log2 scale) = e − 1.
    return max(math.frexp(scale)[1] - 1 - GRID_PRECISION, _MIN_EXPONENT)


def round_on_exponent(x: float, k: int) -> float:
    """x rounded (half to even, exactly) to a multiple of 2^k: :func:`round_to_grid` of a
    scalar whose grid exponent ``k = grid_exponent(scale)`` the caller keeps (a mechanism
    rounds every step on the same few grids).

    >>> round_on_exponent(0.1, -30) == round_to_grid(0.1, 1.0), round_on_exponent(5.0, 1)
    (True, 4.0)
    """
    return _round_scalar(x, k)


def _round_scalar(x, k):
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"x must be finite, got {x!r}")
    # Exact: scaling by a power of two is exact unless it overflows or falls
    # below 2^-1022 (then |y| < 1/2, which rounds to 0 either way); round() of
    # a float is exact, half to even. If |x| >= 2^(53+k) (an overflow
    # included), x is already a multiple of 2^k.
    try:
        y = math.ldexp(x, -k)
    except OverflowError:
        return x
    r = round(y)
    if abs(r) > _EXACT_INT:
        return x
    return math.ldexp(float(r), k)


def round_to_grid(x: Union[float, ArrayLike], scale: float) -> Union[float, np.ndarray]:
    """x rounded (half to even, exactly) to the grid 2^k of noise of this scale.

    Returns a float for a scalar x and a float64 array of x's shape
    otherwise. Add noise of the same scale from :func:`grid_laplace`,
    :func:`grid_gaussian` or :class:`KeyedNoise`: both are multiples of 2^k,
    so ``round_to_grid(x, b) + noise`` is exact whenever
    ``|round_to_grid(x, b) + noise| <= 2^(53+k)`` (at least ``2^22·b`` for
    G = 30: e.g. statistics up to ~4·10^6 at b = 1). Beyond it IEEE-754
    addition rounds the exact sum ``(R + Z)·2^k`` correctly, which is still a
    function of ``R + Z`` alone, so the released float stays post-processing
    of the discrete mechanism; only low-order bits are lost.

    >>> round_to_grid(0.1, 1.0) == 107374182 / 2**30
    True
    >>> round_to_grid(2.0**-31, 1.0), round_to_grid(3 * 2.0**-31, 1.0) == 2.0**-29   # ties to even
    (0.0, True)
    >>> round_to_grid([1e9, -0.5], 1.0).tolist()
    [1000000000.0, -0.5]
    """
    k = grid_exponent(scale)
    if np.ndim(x) == 0:
        return _round_scalar(x, k)
    if type(x) is np.ndarray and x.shape == (1,):
        # A scalar mechanism's node: the same rounding without the array round trip.
        return np.array([_round_scalar(x[0], k)])
    values = np.asarray(x, dtype=np.float64)
    return _round_array(values, k)


def _round_array(values, k):
    """:func:`_round_scalar` of every entry, in array operations that are each exact (a scaling
    by a power of two, IEEE round-half-to-even), so the bits are those of the scalar path:
    a few µs for an ERM model's 11 entries against ≈ 40 µs a value at a time."""
    finite = np.isfinite(values)
    if not finite.all():
        raise ValueError(f"x must be finite, got {float(values[~finite].ravel()[0])!r}")
    # From 2^(53+k) on, x is already a multiple of 2^k and is kept (the scalar path's
    # |r| > 2^53 and overflow exits); below it the scaling cannot overflow.
    small = np.abs(values) < (math.ldexp(1.0, 53 + k) if 53 + k <= 1023 else math.inf)
    r = np.rint(np.ldexp(np.where(small, values, 0.0), -k))
    # + 0.0 turns the −0.0 of a small negative value into the 0.0 that round() gives.
    return np.where(small, np.ldexp(r, k) + 0.0, values)


def grid_float(z: int, k: int) -> float:
    # |Z| <= 2^53 and k >= −1074 make Z·2^k exact; the integer scale is below
    # 2^31, so |Z| > 2^53 has probability below exp(−2^22) (Laplace) or
    # exp(−2^43) (Gaussian). The check is on the noise alone, independent of
    # the data, so refusing it reveals nothing (resampling would truncate
    # the law instead).
    if abs(z) > _EXACT_INT:
        raise OverflowError(f"noise integer {z} exceeds 2^53 on grid 2^{k}; not exact in float64")
    # ldexp raises OverflowError if Z·2^k exceeds float64's range (scales
    # near 1e300 only).
    return math.ldexp(float(z), k)


@functools.lru_cache(maxsize=4096)
def grid_ratio(scale: float, power: int) -> Tuple[int, int, int]:
    """``(k, p, q)`` with ``p/q = (scale/2^k)^power`` exactly, k = :func:`grid_exponent`.

    A mechanism draws many values of one public scale: the exact ratio is
    computed once per scale (the Fractions cost more than a draw's hashing).
    """
    scale = _positive_float("scale" if power == 1 else "sigma", scale)
    k = grid_exponent(scale)
    return (k,) + integer_ratio(scale, k, power)


@functools.lru_cache(maxsize=4096)
def integer_ratio(scale: float, exponent: int, power: int) -> Tuple[int, int]:
    """``(p, q)`` with ``p/q = (scale/2^exponent)^power`` exactly (one public scale per
    mechanism: computed once, not at every draw)."""
    ratio = (Fraction(scale) / Fraction(2) ** exponent) ** power
    return ratio.numerator, ratio.denominator


def grid_laplace(stream: BitStream, scale: float) -> float:
    """One Laplace-like noise of float scale b > 0: ``Z·2^k`` with Z ~ DLap(b/2^k).

    ``k = grid_exponent(b)``; the integer scale ``b/2^k`` (exact Fraction) is
    in [2^30, 2^31), so the law is the discrete Laplace with
    ``P(Z·2^k = z·2^k) ∝ exp(−|z|·2^k/b)``, whose variance differs from
    ``2b²`` by less than ``2^−60·b²``.

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "glap")
    >>> v = grid_laplace(s, 2.5)
    >>> (Fraction(v) / Fraction(2) ** grid_exponent(2.5)).denominator
    1
    """
    k, num, den = grid_ratio(scale, 1)
    return grid_float(discrete_laplace(stream, num, den), k)


def grid_gaussian(stream: BitStream, sigma: float) -> float:
    """One Gaussian-like noise of float σ > 0: ``Z·2^k`` with Z a discrete Gaussian of σ/2^k.

    ``k = grid_exponent(σ)``; Z has ``P(Z = z) ∝ exp(−z²/(2(σ/2^k)²))`` with
    ``σ/2^k`` ∈ [2^30, 2^31) exact, so the variance equals σ² up to a relative
    ``e^(−2^60)``.

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "ggauss")
    >>> v = grid_gaussian(s, 2.5)
    >>> (Fraction(v) / Fraction(2) ** grid_exponent(2.5)).denominator
    1
    """
    k, num, den = grid_ratio(sigma, 2)
    return grid_float(discrete_gaussian(stream, num, den), k)


def grid_padded_scale(sensitivity: float, scale_of: Callable[[float], float],
                      spread: float = 1.0) -> float:
    """The noise scale for values rounded to the grid of that same scale first.

    ``scale_of(s)`` is the scale a mechanism calibrates for a per-value
    sensitivity s (e.g. ``lambda s: laplace_scale(levels * s, eps)``).
    Rounding a value and its neighbour to the grid ``2^k`` of the noise moves
    their difference by at most ``2^k`` (half a step each), so the rounded
    values have sensitivity ``s + 2^k``: the returned scale is
    ``scale_of(s + pad)`` for a pad of at least the grid step of the result.
    One pass gives ``pad = 2^(k0+1)`` with k0 the grid of ``scale_of(s)``; it
    is kept when the grid of the padded scale is at most ``pad`` (always,
    unless the scale is over 2^29 times the sensitivity), else doubled.
    ``spread`` is the norm of the rounding errors in units of the step when
    several coordinates share one sensitivity (√p for p coordinates under an
    L2 sensitivity): the scale is then ``scale_of(s + spread·pad)``.

    >>> grid_padded_scale(1.0, lambda s: 4.0 * s) == 4.0 * (1.0 + 2.0 ** -27)
    True
    """
    base = scale_of(sensitivity)
    if base == 0.0:
        return base
    pad = math.ldexp(1.0, grid_exponent(base) + 1)
    while True:
        scale = scale_of(sensitivity + spread * pad)
        if math.ldexp(1.0, grid_exponent(scale)) <= pad:
            return scale
        pad *= 2.0
