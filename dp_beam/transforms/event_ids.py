"""Event ids as sort keys: a total order over every id a user's ``id_fn`` may return.

Shared by the transforms that order events (or queries) by a user-supplied id,
so that ties between events of one step break the same way on every run.
"""

import math
import numbers
from typing import Any, Optional, Tuple

__all__ = ["MAX_ID_DEPTH", "id_key"]

#: Deepest nesting of tuples accepted in an event id.
MAX_ID_DEPTH = 8


def id_key(value: Any, depth: int = 0) -> Tuple[Any, Optional[str]]:
    """``(key, None)``: an event id as a key that orders against every other valid id; or
    ``(None, reason)``.

    Accepted ids: ints, finite floats (compared as numbers), ``str``, ``bytes``
    and (lists or) tuples of these; each kind gets a rank, so ids of different
    kinds compare too and sorting never raises.
    """
    if value is None:
        return None, "id_fn returned None"
    if isinstance(value, numbers.Integral):
        return (0, int(value)), None
    if isinstance(value, numbers.Real):
        try:
            v = float(value)
        except (OverflowError, ValueError, TypeError, ArithmeticError):
            return None, f"id_fn returned a number out of the float range ({type(value).__name__})"
        if not math.isfinite(v):
            return None, f"id_fn returned a non-finite number {v!r}"
        return (0, v), None
    if isinstance(value, str):
        return (1, str(value)), None
    if isinstance(value, bytes):
        return (2, bytes(value)), None
    if isinstance(value, (tuple, list)) and depth < MAX_ID_DEPTH:
        parts = []
        for part in value:
            k, err = id_key(part, depth + 1)
            if err:
                return None, err
            parts.append(k)
        return (3, tuple(parts)), None
    return None, (f"id_fn returned {type(value).__name__}: an event id must be an int, a finite "
                  "float, a str, bytes or a tuple of these")
