"""Argument checks shared by the noise sources and the mechanisms.

Each returns the argument converted to its plain Python type, or raises
``ValueError`` whose message starts with the argument's name, so a bad
parameter is reported under the name its caller used.

>>> check_real("lam", 2), check_int("block_size", 4), check_probability("beta", 0.05)
(2.0, 4, 0.05)
>>> check_int("max_size", None, optional=True) is None
True
>>> check_real("c", 1.5, nonnegative=True, at_most=1.0)
Traceback (most recent call last):
...
ValueError: c must be <= 1, got 1.5
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

__all__ = ["check_scale", "check_size", "check_dim", "check_step_index", "check_real", "check_int",
           "check_probability", "check_epsilon", "check_delta", "check_nonnegative"]


def check_scale(name: str, value: Any) -> float:
    """``value`` as a float, checked finite and >= 0 (a noise scale or width); ``name`` names it
    in the error."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_size(size: Any) -> int:
    """``size`` as an int, checked >= 0 (the number of draws asked of a noise source)."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise ValueError(f"size must be an int >= 0, got {size!r}")
    return int(size)


def check_dim(dim: Any) -> int:
    """``dim`` as an int, checked >= 1 (the dimension of a noise vector or its direction)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise ValueError(f"dim must be an int >= 1, got {dim!r}")
    return int(dim)


def check_step_index(t: Any) -> int:
    """``t`` as an int, checked >= 1 (the 1-based step of a continual mechanism)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
        raise ValueError(f"t must be an int >= 1, got {t!r}")
    return int(t)


def check_real(name: str, value: Any, *, positive: bool = False, nonnegative: bool = False,
               finite: bool = True, unit_interval: bool = False, below: Optional[float] = None,
               at_most: Optional[float] = None) -> float:
    """``value`` as a float: a real number (not a bool), finite unless ``finite=False``, and
    > 0, >= 0, in (0, 1), < ``below`` or <= ``at_most`` as asked; the first failed condition is
    named in the error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    if unit_interval and not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    if below is not None and not value < below:
        raise ValueError(f"{name} must be < {below:g}, got {value!r}")
    if at_most is not None and not value <= at_most:
        raise ValueError(f"{name} must be <= {at_most:g}, got {value!r}")
    return value


def check_int(name: str, value: Any, minimum: int = 1, *, optional: bool = False) -> Optional[int]:
    """``value`` as an int >= ``minimum`` (not a bool); ``None`` passes through when
    ``optional``."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if optional else ''}, "
                         f"got {value!r}")
    return int(value)


def check_probability(name: str, value: Any) -> float:
    """``value`` as a float in the open interval (0, 1) (a failure probability such as β)."""
    return check_real(name, value, unit_interval=True)


def check_epsilon(value: Any, name: str = "epsilon") -> float:
    """A privacy parameter ε: a finite float > 0."""
    return check_real(name, value, positive=True)


def check_delta(value: Any) -> float:
    """A Gaussian mechanism's δ: a float in (0, 1); ``None`` is refused with the reason."""
    if value is None:
        raise ValueError("delta must be in (0, 1): the mechanisms use Gaussian noise, got None")
    return check_real("delta", value, unit_interval=True)


def check_nonnegative(name: str, value: Any, *, optional: bool = False) -> Optional[float]:
    """``value`` (a Python int or float, not a bool) as a float, finite and >= 0; ``None``
    passes through when ``optional``. The checks of a privacy budget's parts."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return float(value)
