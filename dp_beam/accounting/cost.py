"""The privacy cost of one mechanism as a small immutable value.

Every mechanism states its cost as a :class:`Cost`: the (ε, δ)-DP guarantee
it gives and, where it has one, the ρ-zCDP guarantee (``rho``). Pure ε-DP
implies ε²/2-zCDP (Bun & Steinke 2016, arXiv:1605.02065, Prop. 1.4), so a
Laplace mechanism always has both; a Gaussian one is ρ-zCDP and (ε, δ)-DP with
ε from the simple conversion ``ε = ρ + 2√(ρ ln(1/δ))`` (the same paper,
Prop. 1.3), which the ledger's accountant may tighten later
(:mod:`dp_beam.accounting.costs`). ``docs/privacy/accounting.md`` states the
composition claims.

A cost reads like the dict the ledger has always used (``cost["epsilon"]``,
``dict(cost)``) and compares equal to it, so code that reads costs does not
change when a mechanism starts returning one.

>>> a = Cost.laplace(0.5)
>>> a
Cost(epsilon=0.5, delta=0.0, rho=0.125)
>>> (a + a)["epsilon"], (3 * a).rho
(1.0, 0.375)
>>> Cost.gaussian(0.02, 1e-6) == {"epsilon": Cost.gaussian(0.02, 1e-6).epsilon,
...                               "delta": 1e-6, "rho": 0.02}
True
>>> a.group(2)
Cost(epsilon=1.0, delta=0.0, rho=0.5)
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Iterator, Optional, Union

from dp_beam.accounting.costs import scale, zcdp_to_epsilon_classic

__all__ = ["Cost"]

_FIELDS = ("epsilon", "delta", "rho")


def _check(name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a real >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, eq=False)
class Cost(Mapping):
    """(ε, δ)-DP and ρ-zCDP cost of a mechanism; ``rho`` is None when not zCDP.

    ``+`` is basic composition (ε, δ and ρ add; ρ stays None if either side
    has none), ``k * cost`` the k-fold composition of the same mechanism and
    :meth:`group` group privacy for a unit that changes k records.
    """

    epsilon: float
    delta: float = 0.0
    rho: Optional[float] = None

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _check("epsilon", self.epsilon))
        delta = _check("delta", self.delta)
        if delta > 1:
            raise ValueError(f"delta must be <= 1, got {self.delta!r}")
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "rho", _check("rho", self.rho, allow_none=True))

    @classmethod
    def laplace(cls, epsilon: float) -> "Cost":
        """Pure ε-DP, hence ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
        epsilon = _check("epsilon", epsilon)
        return cls(epsilon, 0.0, 0.5 * epsilon * epsilon)

    @classmethod
    def gaussian(cls, rho: float, delta: float, epsilon: Optional[float] = None) -> "Cost":
        """ρ-zCDP stated as (ε, δ)-DP; ε defaults to ``ρ + 2√(ρ ln(1/δ))`` (Prop. 1.3).

        A mechanism calibrated by another (tighter) conversion passes the ε it
        was calibrated to.
        """
        rho = _check("rho", rho)
        delta = _check("delta", delta)
        if epsilon is None:
            epsilon = zcdp_to_epsilon_classic(rho, delta)
        return cls(epsilon, delta, rho)

    @classmethod
    def of(cls, value: Union["Cost", Mapping]) -> "Cost":
        """A cost from a cost or a mapping with ``epsilon`` (and optionally ``delta``, ``rho``)."""
        if isinstance(value, Cost):
            return value
        if not isinstance(value, Mapping) or "epsilon" not in value:
            raise ValueError(f"a cost needs an 'epsilon', got {value!r}")
        return cls(value["epsilon"], value.get("delta", 0.0) or 0.0, value.get("rho"))

    def __add__(self, other) -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        rho = None if self.rho is None or other.rho is None else self.rho + other.rho
        return Cost(self.epsilon + other.epsilon, min(self.delta + other.delta, 1.0), rho)

    def __mul__(self, k) -> "Cost":
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            return NotImplemented
        rho = None if self.rho is None else k * self.rho
        return Cost(k * self.epsilon, min(k * self.delta, 1.0), rho)

    __rmul__ = __mul__

    def group(self, k: int) -> "Cost":
        """Group privacy: ε·k, δ·k·e^{(k−1)ε}, ρ·k² (:func:`~dp_beam.accounting.costs.scale`)."""
        epsilon, delta, rho = scale(self.epsilon, self.delta,
                                    0.0 if self.rho is None else self.rho, k)
        return Cost(epsilon, min(delta, 1.0), None if self.rho is None else rho)

    # -- the read-only mapping the ledger code reads ------------------------------
    def __getitem__(self, key: str):
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def __eq__(self, other) -> bool:
        if isinstance(other, Mapping):
            return dict(self) == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.epsilon, self.delta, self.rho))

    def __repr__(self) -> str:
        return f"Cost(epsilon={self.epsilon!r}, delta={self.delta!r}, rho={self.rho!r})"
