"""Exact integer arithmetic in units of a power of two, for the integer right factor.

The factorisation mechanisms whose noised vector ``R x + z`` is computed in
integers (``EXACT = "right_factor"`` in
:class:`~dp_beam.mechanisms.counting.factorisation.FactorisationMechanism`)
round their inputs to integer units of ``2^e``, take the float coefficients
of R as exact dyadic rationals and round each product once, so the discrete
Gaussian the accountant charges is exactly what runs
(``docs/privacy/counting.md``, C-8, C-9). :class:`Lanes` packs a vector of
such ints into one, so that a recurrence over the vector costs a few big-int
operations per step.
"""

import math
from typing import Any, Iterable, List, Sequence, Tuple

import numpy as np

__all__ = ["Lanes", "dyadic", "from_unit", "from_units", "round_div_pow2", "to_unit", "to_units"]


def round_div_pow2(numerator: int, bits: int) -> int:
    """``numerator / 2^bits`` rounded to the nearest int, ties to even; exact for any ints.

    >>> [round_div_pow2(n, 1) for n in (1, 3, -1, 5, 4)]
    [0, 2, 0, 2, 2]
    """
    if bits <= 0:
        return numerator << -bits
    # floor((n + half − 1 + q₀)/2^bits) with q₀ the parity of floor(n/2^bits):
    # rounds up past the half, and at the half exactly when the floor is odd.
    return (numerator + (1 << (bits - 1)) - 1 + ((numerator >> bits) & 1)) >> bits


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
    """The floats of x rounded to integer units of ``2^exponent`` (ties to even), exactly.

    >>> to_units([0.75, -1.25, 2.5], -1), to_units([3.0, 5.0], 1)
    ([2, -2, 5], [2, 2])
    """
    arr = np.asarray(x, dtype=np.float64).ravel()
    # Scaling by a power of two is exact while the result is finite and normal,
    # and rint rounds half to even; a result below the normal range is below
    # 1/2, so it rounds to 0 whatever its last bits. (Checking the peak first
    # is cheaper than silencing numpy's overflow warning.)
    peak = float(np.max(np.abs(arr))) if arr.size else 0.0
    if math.isfinite(peak) and math.frexp(peak)[1] - exponent <= 1024:
        return list(map(int, np.rint(np.ldexp(arr, -exponent)).tolist()))
    out = []
    for v in arr.tolist():
        num, den = v.as_integer_ratio()
        out.append(round_div_pow2(num, den.bit_length() - 1 + exponent))
    return out


def from_units(values: Sequence[int], exponent: int) -> np.ndarray:
    """Floats ``v·2^exponent`` of ints (correctly rounded; post-processing only).

    >>> from_units([3, -1, 2**60 + 1], -2).tolist()
    [0.75, -0.25, 2.8823037615171174e+17]
    """
    if exponent >= 0:
        return np.array([float(v << exponent) for v in values], dtype=np.float64)
    if exponent >= -1022:
        # float(v) rounds correctly (ties to even) and the scaling is exact, since
        # |v·2^e| >= 2^-1022 for v != 0: the same bits as the division below
        # (which alone handles |v| >= 2^1024).
        try:
            return np.ldexp(np.array([float(v) for v in values], dtype=np.float64), exponent)
        except OverflowError:
            pass
    den = 1 << -exponent
    return np.array([v / den for v in values], dtype=np.float64)


def to_unit(x: float, exponent: int) -> int:
    """:func:`to_units` of one float: the same rounding without the arrays (a scalar stream
    converts one value per step, where NumPy's call overhead outweighs the arithmetic).

    Scaling by a power of two is exact while finite and normal, and ``round`` of a
    float is exact and ties to even like NumPy's ``rint``.

    >>> to_unit(0.75, -1), to_unit(-1.25, -1), to_unit(5.0, 1)
    (2, -2, 2)
    """
    if math.frexp(x)[1] - exponent <= 1024:
        return round(math.ldexp(x, -exponent))
    num, den = x.as_integer_ratio()
    return round_div_pow2(num, den.bit_length() - 1 + exponent)


def from_unit(value: int, exponent: int) -> float:
    """:func:`from_units` of one int: the same correctly rounded float.

    >>> from_unit(3, -2), from_unit(2**60 + 1, -2) == float(from_units([2**60 + 1], -2)[0])
    (0.75, True)
    """
    if exponent >= 0:
        return float(value << exponent)
    if exponent >= -1022:
        try:
            return math.ldexp(float(value), exponent)
        except OverflowError:  # |value| >= 2^1024: the division below rounds it correctly
            pass
    return value / (1 << -exponent)


class Lanes:
    """Vectors of ``count`` ints packed into one int, ``width`` bits per lane (lane j at bit ``width·j``).

    "SIMD within a register": adding packed ints adds the lanes, and
    multiplying one by a nonnegative int multiplies every lane, exactly, as
    long as every lane stays in ``[0, 2^width)``. An integer recurrence over a
    vector then costs a few big-int operations per step instead of a few
    Python operations per coordinate (the BLT right factor: 77 coordinates
    times 5 buffers per regression step). ``width`` is a multiple of 8 (lanes
    are whole bytes); keeping the lanes in range is the caller's job.

    >>> lanes = Lanes(3, 16)
    >>> p = lanes.pack_signed([5, -3, 7]) + lanes.rep(100)      # offset to nonnegative lanes
    >>> lanes.unpack(3 * p)
    [315, 291, 321]
    >>> lanes.unpack(lanes.round_shift(p + lanes.rep(1), 2))     # (106, 98, 108)/4, ties to even
    [26, 24, 27]
    """

    def __init__(self, count: int, width: int) -> None:
        if count < 1 or width < 8 or width % 8:
            raise ValueError(f"need count >= 1 and a width that is a positive multiple of 8, got {count}, {width}")
        self.count, self.width = count, width
        self._bytes = width // 8
        #: One in the lowest bit of every lane.
        self.ones = int.from_bytes((b"\x01" + bytes(self._bytes - 1)) * count, "little")
        #: ``2^(width−1)`` in every lane: the offset of :meth:`pack_offset`.
        self.half = self.rep(1 << (width - 1))
        self._round = {}
        self._spans = [(i, i + self._bytes) for i in range(0, self._bytes * count, self._bytes)]

    def rep(self, value: int) -> int:
        """``value`` in every lane (``0 <= value < 2^width``)."""
        return value * self.ones

    def pack_offset(self, values: Sequence[int]) -> int:
        """The ints ``v_j + 2^(width−1)`` in the lanes, for ``|v_j| < 2^(width−1)``."""
        size = self._bytes
        raw = int.from_bytes(b"".join([v.to_bytes(size, "little", signed=True) for v in values]), "little")
        # A two's complement lane with its sign bit flipped holds v_j + 2^(width−1).
        return raw ^ self.half

    def pack_signed(self, values: Sequence[int]) -> int:
        """``Σ_j v_j·2^(width·j)`` for ``|v_j| < 2^(width−1)``: lane j holds v_j, borrows
        included (add ``rep(offset)`` for nonnegative lanes)."""
        return self.pack_offset(values) - self.half

    def unpack(self, packed: int) -> List[int]:
        """The lanes of a packed int whose lanes are all in ``[0, 2^width)``."""
        raw = packed.to_bytes(self._bytes * self.count, "little")
        return [int.from_bytes(raw[a:b], "little") for a, b in self._spans]

    def round_shift(self, packed: int, bits: int) -> int:
        """Every lane divided by ``2^bits``, rounded to nearest with ties to even
        (lanes nonnegative and below ``2^width − 2^(bits−1)``; ``0 < bits < width``)."""
        consts = self._round.get(bits)
        if consts is None:
            consts = self._round[bits] = (self.rep((1 << (bits - 1)) - 1),
                                          self.rep((1 << (self.width - bits)) - 1))
        # round_div_pow2 lane by lane: the parity bit of each lane's floor picks
        # the tie; what a lane's low bits leave above the lane below is masked off.
        return ((packed + consts[0] + ((packed >> bits) & self.ones)) >> bits) & consts[1]
