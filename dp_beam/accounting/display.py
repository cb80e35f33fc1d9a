"""Privacy numbers as people read them: rounded for display, never in the accounting.

Sums of binary floats carry noise in their last bits (``0.1 + 0.5`` is
``0.6000000000000001``, ``1 - (0.5 + 0.25 + 0.25)`` can be ``1.1e-16``).
The accounting keeps and compares the exact floats (with its own relative
slack, :class:`~dp_beam.accounting.Budget`); only what is printed or drawn
goes through these functions, so a message never shows a digit that is
float noise rather than a property of the plan.
"""

import math
from typing import Optional

__all__ = ["DIGITS", "fmt", "rounded"]

#: Significant digits kept for display: far more than any ε is meaningful to,
#: far fewer than the ~16 digits where float noise lives.
DIGITS = 12


def rounded(x: Optional[float], digits: int = DIGITS,
            scale: Optional[float] = None) -> Optional[float]:
    """``x`` rounded to ``digits`` significant digits (of ``scale`` when given).

    ``scale`` is the magnitude the number was computed against: a remaining
    budget ``1 - 0.9999999999999999`` is noise relative to the budget ``1``,
    not a tiny positive amount, so it rounds to 0 with ``scale=1``.
    ``None``, infinities and NaN pass through.

    >>> rounded(0.1 + 0.5), rounded(1 - (0.5 + 0.25 + 0.2499999999999999), scale=1.0)
    (0.6, 0.0)
    >>> rounded(1e-7), rounded(123456.78901234567)
    (1e-07, 123456.789012)
    """
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return x
    x = float(x)
    if not math.isfinite(x) or x == 0:
        return x
    ref = abs(float(scale)) if scale not in (None, 0) and math.isfinite(scale) else abs(x)
    decimals = digits - 1 - math.floor(math.log10(ref))
    out = round(x, decimals)
    return out + 0.0  # no "-0.0"


def fmt(x: Optional[float], digits: int = DIGITS, scale: Optional[float] = None,
        none: str = "-") -> str:
    """The shortest text of :func:`rounded` ``x``: ``0.6``, ``1e-06``, ``inf``; ``none`` for None.

    >>> fmt(0.1 + 0.5), fmt(2.0), fmt(None), fmt(float("inf")), fmt(1e-6)
    ('0.6', '2', '-', 'inf', '1e-06')
    >>> fmt(1 - 0.9999999999999999, scale=1.0)
    '0'
    """
    if x is None:
        return none
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{rounded(x, digits, scale):.{digits}g}"
