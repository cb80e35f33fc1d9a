"""Constraint sets C of private incremental regression: L2 and L1 balls.

``docs/privacy/regression.md`` R-1 (C closed and convex,
``‖C‖ = max_{θ∈C} ‖θ‖₂``), R-9 (Euclidean projection Π_C in NoisyProjGrad),
R-7 (Minkowski functional of the lift, Gaussian width of Def. 3 of seed 002,
arXiv:1701.01093). Lasso is the L1 ball, ridge the
L2 ball (regression.md R-1).

Example:

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import L1Ball, L2Ball
>>> L2Ball(2.0).project(np.array([3.0, 4.0])).round(12).tolist()
[1.2, 1.6]
>>> L1Ball(1.0).project(np.array([3.0, 1.0])).tolist()
[1.0, 0.0]
>>> L1Ball(1.0).minkowski(np.array([0.25, -0.25])), L2Ball(1.0).max_norm
(0.5, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Union

import numpy as np
from numpy.typing import ArrayLike
from scipy import integrate, special

from ..checks import check_real

__all__ = ["L2Ball", "L1Ball", "Constraint", "ConstrainedParams", "constraint_from_dict", "check_constraint"]


def _vector(theta) -> np.ndarray:
    arr = np.asarray(theta, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"theta must be a vector, got shape {arr.shape}")
    return arr


@dataclass(frozen=True)
class _Ball:
    """A norm ball of a public radius: what the L2 and L1 balls share (validation, ‖C‖,
    membership, serialisation). Subclasses set ``kind`` and the norm's ``project``,
    ``minkowski`` and ``gaussian_width``."""

    radius: float = 1.0

    kind = ""

    def __post_init__(self):
        object.__setattr__(self, "radius", check_real("radius", self.radius, positive=True))

    @property
    def max_norm(self) -> float:
        """``‖C‖ = max_{θ∈C} ‖θ‖₂`` (002 Def. 2, "diameter"): the radius, for both balls
        (the L1 ball's vertices ±radius·e_i have the largest L2 norm)."""
        return self.radius

    def minkowski(self, theta) -> float:
        raise NotImplementedError

    def contains(self, theta, tol: float = 1e-9) -> bool:
        return self.minkowski(theta) <= 1.0 + tol

    def to_dict(self) -> dict:
        return {"kind": self.kind, "radius": self.radius}

    def __str__(self):
        return f"{self.kind}({self.radius:g})"


@dataclass(frozen=True)
class L2Ball(_Ball):
    """``C = {θ : ‖θ‖₂ <= radius}`` (ridge-type constraint).

    ``‖C‖ = radius``; Gaussian width ``radius·E‖g‖ = radius·√2·Γ((d+1)/2)/Γ(d/2) ≈ radius·√d``.
    """

    kind = "l2_ball"

    def project(self, theta: ArrayLike) -> np.ndarray:
        """Euclidean projection Π_C(θ): θ scaled down to the radius."""
        theta = _vector(theta)
        norm = float(np.linalg.norm(theta))
        if norm <= self.radius:
            return theta.copy()
        return theta * (self.radius / norm)

    def minkowski(self, theta: ArrayLike) -> float:
        """``‖θ‖_C = inf{r > 0 : θ ∈ rC} = ‖θ‖₂/radius`` (002 Def. 6)."""
        return float(np.linalg.norm(_vector(theta))) / self.radius

    def gaussian_width(self, dim: int) -> float:
        """``w(C) = E sup_{θ∈C} ⟨θ, g⟩ = radius·E‖g‖₂`` for g ~ N(0, I_dim) (002 Def. 3)."""
        return self.radius * math.sqrt(2.0) * math.exp(special.gammaln((dim + 1) / 2) - special.gammaln(dim / 2))


@dataclass(frozen=True)
class L1Ball(_Ball):
    """``C = {θ : ‖θ‖₁ <= radius}`` (Lasso-type constraint, low Gaussian width).

    ``‖C‖ = radius`` (the vertices ±radius·e_i have the largest L2 norm);
    Gaussian width ``radius·E max_i |g_i| ≈ radius·√(2 ln(2d))``.
    """

    kind = "l1_ball"

    def project(self, theta: ArrayLike) -> np.ndarray:
        """Euclidean projection onto the L1 ball (Duchi, Shalev-Shwartz, Singer, Chandra 2008).

        Soft-thresholding at the τ that puts the result on the sphere:
        sort |θ| descending, ``ρ = max{j : u_j − (Σ_{i<=j} u_i − R)/j > 0}``,
        ``τ = (Σ_{i<=ρ} u_i − R)/ρ``, ``Π(θ) = sign(θ)·max(|θ| − τ, 0)``.
        """
        theta = _vector(theta)
        a = np.abs(theta)
        if float(a.sum()) <= self.radius:
            return theta.copy()
        u = np.sort(a)[::-1]
        css = np.cumsum(u)
        j = np.arange(1, u.size + 1)
        rho = int(np.nonzero(u - (css - self.radius) / j > 0)[0][-1])
        tau = (css[rho] - self.radius) / (rho + 1)
        return np.sign(theta) * np.maximum(a - tau, 0.0)

    def minkowski(self, theta: ArrayLike) -> float:
        """``‖θ‖_C = ‖θ‖₁/radius`` (002 Def. 6)."""
        return float(np.abs(_vector(theta)).sum()) / self.radius

    def gaussian_width(self, dim: int) -> float:
        """``w(C) = radius·E max_i |g_i|``, by numerical integration of ``P(max|g_i| > x)``."""
        def tail(x):
            return 1.0 - special.erf(x / math.sqrt(2.0)) ** dim
        value, _ = integrate.quad(tail, 0.0, np.inf, limit=200)
        return self.radius * value


Constraint = Union[L2Ball, L1Ball]


def check_constraint(value: Any, name: str = "constraint") -> Constraint:
    """``value`` if it is an :class:`L2Ball` or :class:`L1Ball`, else ``ValueError`` naming ``name``."""
    if not isinstance(value, (L2Ball, L1Ball)):
        raise ValueError(f"{name} must be L2Ball(radius) or L1Ball(radius), got {value!r}")
    return value


def constraint_from_dict(data: Mapping[str, Any]) -> Constraint:
    """Inverse of ``to_dict`` (for mechanism states)."""
    if not isinstance(data, dict) or data.get("kind") not in ("l2_ball", "l1_ball"):
        raise ValueError(f"constraint state must be a dict with kind 'l2_ball' or 'l1_ball', got {data!r}")
    cls = L2Ball if data["kind"] == "l2_ball" else L1Ball
    return cls(data.get("radius"))


class ConstrainedParams:
    """``to_dict``/``from_dict`` of a frozen parameter dataclass with a ``constraint`` field."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["constraint"] = self.constraint.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConstrainedParams":
        data = dict(data)
        data["constraint"] = constraint_from_dict(data["constraint"])
        return cls(**data)