"""Free post-processing of released values (``docs/privacy/counting.md``, C-14; AC-5).

Everything here takes noisy releases and public metadata only, never raw data
or exact node values, so it costs no privacy and adds no ledger entry (AC-5).

* :func:`isotonic_increasing`: least-squares non-decreasing fit of a released
  series (C-14, pool-adjacent-violators via SciPy), for running counts offline.
* :class:`MonotoneRelease`: the online variant: never release below the
  previous release. Released values cannot be revised online (C-14),
  so this is a running maximum, not the isotonic fit.
* :func:`hay_consistency`: least-squares consistency of a complete k-ary tree
  of equal-variance noisy counts, parent = Σ children (C-14, Hay et al. 2010).
"""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from ..state import StateRecord, state_field

__all__ = ["hay_consistency", "isotonic_increasing", "MonotoneRelease", "MonotoneState"]


def isotonic_increasing(values: Sequence[float], weights: Optional[Sequence[float]] = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in (weighted) least squares.

    >>> isotonic_increasing([3, 1, 2]).tolist()
    [2.0, 2.0, 2.0]
    >>> isotonic_increasing([1, 3, 2, 4]).tolist()
    [1.0, 2.5, 2.5, 4.0]
    """
    from scipy.optimize import isotonic_regression

    y = np.asarray(values, dtype=np.float64)
    if y.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {y.shape}")
    if y.size == 0:
        return y.copy()
    if not np.all(np.isfinite(y)):
        raise ValueError("values must be finite")
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    return isotonic_regression(y, weights=w, increasing=True).x


def _floor_from_state(floor: Any) -> Any:
    # A vector floor was written as a list; a scalar one (or None) as it was.
    return np.asarray(floor, dtype=np.float64) if isinstance(floor, list) else floor


@dataclasses.dataclass(frozen=True)
class MonotoneState(StateRecord):
    """The state of a :class:`MonotoneRelease`: its name, the wrapped mechanism's state and
    the previous release (None before the first; an array for vector streams)."""

    mechanism: str
    inner: Dict[str, Any]
    floor: Any = state_field(decode=_floor_from_state)


class MonotoneRelease:
    """Wraps a continual mechanism so that its releases never decrease.

    Each release is ``max(previous release, mechanism release)`` (coordinate
    by coordinate), a function of released values only, so it is free (AC-5) and
    the wrapped mechanism's privacy cost is unchanged. For a non-decreasing
    truth (a running count, a running sum of non-negative values) the error of
    a release is at most the larger of its own noise and the previous
    release's error. ``noise_std``, ``ci_halfwidth`` and ``privacy_cost`` are
    those of the wrapped mechanism: they describe the unadjusted estimate.

    >>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
    >>> m = MonotoneRelease(BinaryTreeMechanism(epsilon=1.0, rng=ZeroNoise()))
    >>> [m.step(x) for x in (2, -1, 0, 1)]   # a decrease in the input is held flat
    [2.0, 2.0, 2.0, 2.0]
    """

    def __init__(self, mechanism: Any, floor: Union[None, float, np.ndarray] = None) -> None:
        self.mechanism = mechanism
        self._floor = floor

    @property
    def name(self) -> str:
        return f"{self.mechanism.name}+monotone"

    @property
    def t(self) -> int:
        return self.mechanism.t

    def step(self, x: Union[float, np.ndarray]) -> Union[float, np.ndarray]:
        value = self.mechanism.step(x)
        if self._floor is not None:
            value = np.maximum(value, self._floor)
            if np.ndim(value) == 0:
                value = float(value)
        self._floor = value
        return value

    def noise_std(self, t: int) -> float:
        return self.mechanism.noise_std(t)

    def ci_halfwidth(self, t: int, level: float = 0.95) -> float:
        return self.mechanism.ci_halfwidth(t, level)

    def privacy_cost(self) -> Mapping[str, Any]:
        return self.mechanism.privacy_cost()

    def state_size(self) -> int:
        return self.mechanism.state_size() + int(np.size(self._floor) if self._floor is not None else 0)

    def to_state(self) -> Dict[str, Any]:
        """The wrapped mechanism's state and the floor (:class:`MonotoneState`)."""
        return MonotoneState("monotone", self.mechanism.to_state(), self._floor).to_state()

    @classmethod
    def from_state(cls, state: Dict[str, Any], inner_cls: type, rng: Any = None) -> "MonotoneRelease":
        """Rebuild from :meth:`to_state` output; ``inner_cls.from_state`` restores the wrapped
        mechanism with ``rng``."""
        record = MonotoneState.from_state(state)
        return cls(inner_cls.from_state(record.inner, rng=rng), record.floor)


def hay_consistency(levels: Sequence[Sequence[float]], k: int = 2) -> List[np.ndarray]:
    """Least-squares consistent counts of a complete k-ary tree (C-14, Hay et al. 2010).

    ``levels[0]`` are the leaves (``k^(H−1)`` noisy counts), ``levels[i]`` the
    nodes at height i+1, each the parent of ``k`` consecutive nodes below;
    ``levels[-1]`` is the root. All counts must carry noise of equal variance.
    Returns the consistent levels (parent = Σ children), computed in the two
    passes of Hay et al.; equal to the least-squares projection.

    >>> [lv.round(4).tolist() for lv in hay_consistency([[1.0, 1.0], [4.0]])]
    [[1.6667, 1.6667], [3.3333]]
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    noisy = [np.asarray(lv, dtype=np.float64) for lv in levels]
    height = len(noisy)
    if height == 0:
        raise ValueError("levels must not be empty")
    for i, lv in enumerate(noisy):
        if lv.shape[0] != k ** (height - 1 - i):
            raise ValueError(f"levels[{i}] must hold {k ** (height - 1 - i)} counts for a "
                             f"complete {k}-ary tree of height {height}, got {lv.shape[0]}")
    z = [noisy[0]]
    for i in range(1, height):
        ell = i + 1  # height of this level (leaves have height 1)
        children = z[-1].reshape((noisy[i].shape[0], k) + noisy[i].shape[1:]).sum(axis=1)
        denom = k ** ell - 1
        z.append(((k ** ell - k ** (ell - 1)) / denom) * noisy[i]
                 + ((k ** (ell - 1) - 1) / denom) * children)
    out = [None] * height
    out[-1] = z[-1]
    for i in range(height - 2, -1, -1):
        parent = out[i + 1]
        zc = z[i].reshape((parent.shape[0], k) + parent.shape[1:])
        gap = (parent - zc.sum(axis=1)) / k
        out[i] = (zc + gap[:, None, ...]).reshape(z[i].shape)
    return out
