"""Exact integer arithmetic in units of a power of two, for the integer right factor.

The factorisation mechanisms whose noised vector ``R x + z`` is computed in
integers (``EXACT = "right_factor"`` in
:class:`~dp_beam.mechanisms.counting.factorisation.FactorisationMechanism`)
round their inputs to integer units of ``2^e``, take the float coefficients
of R as exact dyadic rationals and round each product once, so the discrete
Gaussian the accountant charges is exactly what runs
(``docs/privacy/counting.md``, C-8, C-9).
"""

from typing import Any, Iterable, List, Sequence, Tuple

import numpy as np

__all__ = ["dyadic", "from_units", "round_div_pow2", "to_units"]


def round_div_pow2(numerator: int, bits: int) -> int:
    """``numerator / 2^bits`` rounded to the nearest int, ties to even; exact for any ints.

    >>> [round_div_pow2(n, 1) for n in (1, 3, -1, 5, 4)]
    [0, 2, 0, 2, 2]
    """
    if bits <= 0:
        return numerator << -bits
    quotient, remainder = divmod(numerator, 1 << bits)
    half = 1 << (bits - 1)
    if remainder > half or (remainder == half and quotient & 1):
        quotient += 1
    return quotient


def dyadic(values: Iterable[float]) -> Tuple[List[int], int]:
    """``(numerators, bits)``: ints with ``values[i] == numerators[i] / 2^bits`` exactly.

    Floats are dyadic rationals; one common power of two lets an integer
    recurrence use them without rounding.

    >>> dyadic([0.5, 0.75, 3.0])
    ([2, 3, 12], 2)
    """
    ratios = [float(v).as_integer_ratio() for v in values]
    bits = max((den.bit_length() - 1 for _, den in ratios), default=0)
    return [num << (bits - (den.bit_length() - 1)) for num, den in ratios], bits


def to_units(x: Any, exponent: int) -> List[int]:
    """The floats of x rounded to integer units of ``2^exponent`` (ties to even), exactly."""
    out = []
    for v in np.asarray(x, dtype=np.float64).ravel():
        num, den = float(v).as_integer_ratio()
        out.append(round_div_pow2(num, den.bit_length() - 1 + exponent))
    return out


def from_units(values: Sequence[int], exponent: int) -> np.ndarray:
    """Floats ``v·2^exponent`` of ints (correctly rounded; post-processing only)."""
    if exponent >= 0:
        return np.array([float(v << exponent) for v in values], dtype=np.float64)
    den = 1 << -exponent
    return np.array([v / den for v in values], dtype=np.float64)
