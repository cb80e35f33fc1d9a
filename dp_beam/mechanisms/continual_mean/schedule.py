"""The per-user withhold-release schedule of Algorithm 6 (seed 003).

docs/privacy/mean.md M-2: a user's samples are summed
into elements of doubling size (1, 1, 2, 4, … samples); the level-ℓ element
is released when the user's count reaches 2^ℓ, on an O(d) per-user state
(:class:`UserState`). :func:`user_hash` is the public, data-independent hash
that orders users and assigns them to median buckets (M-6).
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..stable_hash import stable_hash

__all__ = [
    "element_size",
    "release_level",
    "represented_count",
    "UserState",
    "withhold_release",
    "user_hash",
]


def user_hash(user: Any) -> int:
    """A public, stable 63-bit hash of a user id (same on every worker and run)."""
    return stable_hash(user) >> 1


def element_size(level: int) -> int:
    """Samples summed in a level-ℓ element: 1 for ℓ ≤ 1, else 2^{ℓ−1} (M-2)."""
    return 1 if level <= 1 else 1 << (level - 1)


def release_level(count: int, top: int) -> Optional[int]:
    """The level released when a user's count reaches ``count``, or None.

    ``count = 2^ℓ`` with ``ℓ <= top`` releases level ℓ; other counts
    withhold, and counts past ``2^top`` are never released (M-2).
    """
    if count >= 1 and count & (count - 1) == 0:
        level = count.bit_length() - 1
        if level <= top:
            return level
    return None


def represented_count(count: int, top: int) -> int:
    """Samples of a user with ``count`` samples that released elements cover: 2^{⌊log2 M⌋} (M-2)."""
    if count <= 0:
        return 0
    return 1 << min(count.bit_length() - 1, top)


class UserState:
    """Per-user state of the schedule: count M_u, running segment sum s_u, first step, hash.

    O(d) numbers per user (M-2). Plain tuple form via
    :meth:`to_tuple` for Beam state cells.
    """

    __slots__ = ("count", "segment", "first_step", "uhash", "covered")

    def __init__(self, count: int = 0, segment: Optional[np.ndarray] = None,
                 first_step: Optional[int] = None, uhash: int = 0,
                 covered: Optional[np.ndarray] = None) -> None:
        self.count = count
        self.segment = segment
        self.first_step = first_step
        self.uhash = uhash
        # Tuned preset with a prior query: sum of the user's released samples
        # (its first 2^{⌊log2 M_u⌋}), whose mean the query reads.
        self.covered = covered

    def to_tuple(self) -> Tuple[Any, ...]:
        seg = self.segment
        if seg is not None:
            # A float: the segment of a scalar stream (aggregate._contribution_scalar).
            seg = (seg,) if type(seg) is float else tuple(float(v) for v in seg)
        cov = None if self.covered is None else tuple(float(v) for v in self.covered)
        return (self.count, seg, self.first_step, self.uhash, cov)

    @classmethod
    def from_tuple(cls, t: Optional[Tuple[Any, ...]]) -> "UserState":
        if t is None:
            return cls()
        count, seg, first, uh, cov = t
        return cls(count, None if seg is None else np.asarray(seg, dtype=np.float64), first, uh,
                   None if cov is None else np.asarray(cov, dtype=np.float64))


def withhold_release(state: UserState, x: Any, top: int, store_upto: int,
                     step: int = 0) -> Dict[str, Any]:
    """Consume one sample x (a d-vector in [0,1]^d) of one user (M-2; Algorithm 6 lines 6–8, 14–18).

    Returns a dict with the user's new ``count``, the released ``level`` and
    raw ``element`` (or None), and ``sample`` = x when the sample's index is at
    most ``store_upto`` (= 2^{L−1}, the samples Algorithm 7 may read), else
    None. ``state`` is updated in place. The caller enforces the cap m.
    """
    x = np.asarray(x, dtype=np.float64)
    if state.count == 0:
        state.first_step = step
        state.segment = np.zeros_like(x)
    state.count += 1
    state.segment = state.segment + x
    out = {"count": state.count, "level": None, "element": None,
           "sample": x if state.count <= store_upto else None}
    level = release_level(state.count, top)
    if level is not None:
        out["level"] = level
        out["element"] = state.segment
        state.segment = np.zeros_like(x)
    return out
