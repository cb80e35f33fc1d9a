"""Privacy budgets: the limit a pipeline's composed cost is checked against."""

from typing import Optional

from dp_beam.accounting.relations import check_relation
from dp_beam.mechanisms.checks import check_nonnegative

__all__ = ["Budget"]


class Budget:
    """A privacy budget in pure/approximate DP (``epsilon``, ``delta``) or zCDP (``rho``).

    ``Budget(epsilon=1.0)`` admits pure-ε plans only (δ = 0);
    ``Budget(epsilon=1.0, delta=1e-6)`` admits (ε, δ) plans; ``Budget(rho=0.5)``
    admits plans whose zCDP costs add up to at most ρ. Both may be given; then
    both must hold.

    ``relation`` is the neighbour relation the budget is stated for (one of
    :data:`~dp_beam.records.RELATIONS`): ``"add/remove"`` (one unit added or
    removed), ``"replace"`` (one unit's data replaced, the number of units
    public) or ``"values"`` (one user's values changed, the arrival pattern
    public). The plan's total under that relation is checked; charges stated
    for another relation are converted where a conversion holds and refused
    where none does (:func:`dp_beam.accounting.compose`). ``None`` (default)
    means the relation every charge of the plan is stated for when they agree
    (a plan of ERM transforms only is checked under ``"replace"``, as its
    transforms state), and ``"add/remove"`` when they differ.

    >>> Budget(epsilon=1.0, relation="replace")
    Budget(epsilon=1.0, delta=0.0, relation='replace')

    >>> Budget(epsilon=1.0).admits(epsilon=0.4 + 0.6, delta=0.0, rho=0.5)
    True
    >>> Budget(epsilon=1.0).admits(epsilon=1.2, delta=0.0, rho=0.72)
    False
    """

    # Budgets are compared with sums of floats (0.1 + 0.2 > 0.3); a relative
    # slack this small cannot be exploited to overspend meaningfully.
    _REL_SLACK = 1e-9

    def __init__(self, epsilon: Optional[float] = None, delta: float = 0.0,
                 rho: Optional[float] = None, *, relation: Optional[str] = None) -> None:
        if relation is not None:
            check_relation(relation)
        self.relation = relation
        self.epsilon = check_nonnegative("epsilon", epsilon, optional=True)
        self.delta = check_nonnegative("delta", delta)
        self.rho = check_nonnegative("rho", rho, optional=True)
        if self.epsilon is None and self.rho is None:
            raise ValueError("Budget needs epsilon or rho")
        if self.delta >= 1:
            raise ValueError(f"delta must be < 1, got {delta!r}")
        if self.epsilon is not None and self.epsilon == 0:
            raise ValueError("epsilon must be > 0")

    def _fits(self, used, limit):
        return used <= limit * (1 + self._REL_SLACK) + 1e-15

    def admits(self, epsilon: Optional[float], delta: Optional[float],
               rho: Optional[float]) -> bool:
        """Whether a composed cost (any part may be None = unbounded) fits."""
        if self.epsilon is not None:
            if epsilon is None or delta is None:
                return False
            if not (self._fits(epsilon, self.epsilon) and self._fits(delta, self.delta)):
                return False
        if self.rho is not None:
            if rho is None or not self._fits(rho, self.rho):
                return False
        return True

    def __repr__(self):
        parts = []
        if self.epsilon is not None:
            parts.append(f"epsilon={self.epsilon!r}")
            parts.append(f"delta={self.delta!r}")
        if self.rho is not None:
            parts.append(f"rho={self.rho!r}")
        if self.relation is not None:
            parts.append(f"relation={self.relation!r}")
        return f"Budget({', '.join(parts)})"
