"""Argument checks shared by the noise sources and the continual mechanisms.

Each returns the argument converted to its plain Python type, or raises
``ValueError`` naming what was expected.
"""

import math
import numbers

__all__ = ["check_scale", "check_size", "check_step_index"]


def check_scale(name, value):
    """``value`` as a float, checked finite and >= 0 (a noise scale or width); ``name`` names it
    in the error."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_size(size):
    """``size`` as an int, checked >= 0 (the number of draws asked of a noise source)."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise ValueError(f"size must be an int >= 0, got {size!r}")
    return int(size)


def check_step_index(t):
    """``t`` as an int, checked >= 1 (the 1-based step of a continual mechanism)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
        raise ValueError(f"t must be an int >= 1, got {t!r}")
    return int(t)
