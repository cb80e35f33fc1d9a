"""Argument checks shared by the private-ERM modules (spec private_erm_and_incremental_regression.md §1).

Seed 004 (Watson et al.). Each check raises ValueError naming the argument, so
a bad parameter of a stream, the loss or the solver is reported under the name
its caller used. Internal to :mod:`dp_beam.mechanisms.erm`.
"""

import math
import numbers

__all__ = ["check_real", "check_int", "is_pow2"]


def check_real(name, value, *, positive=False, nonnegative=False, finite=True):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def is_pow2(n):
    return n >= 1 and n & (n - 1) == 0
