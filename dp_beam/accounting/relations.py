"""Neighbour relations of ledger entries and the conversions between them.

Every charge is stated for one neighbour relation (``LedgerEntry.relation``,
one of :data:`~dp_beam.records.RELATIONS`); a total is stated for one relation
too, and a charge enters it only through a conversion that holds:

=================  ===========  ====================  ====================
charge \\ total     add/remove   replace               values
=================  ===========  ====================  ====================
add/remove         as it is     counted twice         counted twice
replace            unbounded    as it is              as it is
values             unbounded    unbounded             as it is
=================  ===========  ====================  ====================

* **add/remove → replace** (group privacy of size 2): inputs that differ in
  one unit's data are two add/remove steps apart (remove the unit, add its
  replacement D'' through D'), so for every output set S
  ``P[M(D) ∈ S] <= e^ε (e^ε P[M(D'') ∈ S] + δ) + δ``: an (ε, δ)-DP charge
  is ``(2ε, (1 + e^ε)·δ)``-DP for replace. This is group privacy for a group
  of two (Dwork & Roth 2014, "The Algorithmic Foundations of Differential
  Privacy", §2.3, Thm. 2.2: kε for pure ε); chaining k steps gives
  ``δ·Σ_{i<k} e^{iε}``, which for k = 2 is ``(1 + e^ε)·δ``, at most the
  usual ``k·e^{(k−1)ε}·δ = 2e^ε·δ``. Pure ε gives 2ε, and ρ-zCDP gives 4ρ
  (Bun & Steinke 2016, "Concentrated Differential Privacy: Simplifications,
  Extensions, and Lower Bounds", group privacy, Prop. 1.9: k²ρ for groups of
  k). For a Gaussian charge, 4ρ is exactly the Gaussian mechanism with twice
  the sensitivity, so privacy loss distributions stay exact.
* **add/remove → values**: a values neighbour changes one user's values with
  the arrival pattern fixed, which is one particular replacement of that
  user's data, so the replace conversion above covers it.
* **replace → values**: a values-neighbour pair is a replace-neighbour pair
  (the number of units, and even each unit's arrival pattern, is unchanged),
  so a replace guarantee holds for it as it is.
* **replace → add/remove**: none. A replace guarantee takes the number of
  units as public; the ERM transforms release on a count-triggered schedule,
  so adding or removing one event moves every later release time and is
  detected with certainty.
* **values → add/remove, values → replace**: none. A values guarantee takes
  the arrival pattern (who sends a sample, when) as public;
  ``ContinualMean(neighbours="values")`` publishes exact user counts, so adding
  or removing a user, or replacing one by a user who arrives at other times,
  is detected with certainty.

Group privacy over a user's events (:func:`dp_beam.accounting.costs.scale`)
is applied first, then the conversion: a user-level replacement is a removal
of the user's events followed by an addition.
"""

import math
from typing import Optional, Tuple

from dp_beam.records import RELATIONS

__all__ = ["ADD_REMOVE", "check_relation", "convert", "factor", "REPLACE", "VALUES",
           "why_unbounded"]

ADD_REMOVE, REPLACE, VALUES = RELATIONS

# factor[charge relation][total relation]: 1 as it is, 2 counted twice, None unbounded.
_FACTOR = {
    ADD_REMOVE: {ADD_REMOVE: 1, REPLACE: 2, VALUES: 2},
    REPLACE: {ADD_REMOVE: None, REPLACE: 1, VALUES: 1},
    VALUES: {ADD_REMOVE: None, REPLACE: None, VALUES: 1},
}

# Why a charge of one relation says nothing about a total of another.
_WHY_UNBOUNDED = {
    (REPLACE, ADD_REMOVE): ("private only for replacing one unit's data with the number of "
                            "units public; their count-triggered release schedule reveals "
                            "whether a unit was added or removed"),
    (VALUES, ADD_REMOVE): ("private only for changing one user's values with the arrival "
                           "pattern public; their exact user counts reveal whether a unit was "
                           "added or removed"),
    (VALUES, REPLACE): ("private only for changing one user's values with the arrival pattern "
                        "public; a replaced unit may arrive at other times, which their exact "
                        "user counts reveal"),
}


def check_relation(relation: str, name: str = "relation") -> str:
    """``relation`` if it is one of :data:`~dp_beam.records.RELATIONS`, else ``ValueError``."""
    if not isinstance(relation, str) or relation not in RELATIONS:
        raise ValueError(f"{name} must be one of {RELATIONS}, got {relation!r}")
    return relation


def factor(charge_relation: str, total_relation: str) -> Optional[int]:
    """How a charge stated for ``charge_relation`` counts in a ``total_relation`` total.

    1: as it is; 2: converted as a group of two (:func:`convert`); ``None``: no
    bound follows.

    >>> factor("add/remove", "replace"), factor("replace", "values"), factor("values", "add/remove")
    (2, 1, None)
    """
    return _FACTOR[check_relation(charge_relation)][check_relation(total_relation)]


def why_unbounded(charge_relation: str, total_relation: str) -> str:
    """Why charges of ``charge_relation`` leave a ``total_relation`` total unbounded."""
    return _WHY_UNBOUNDED[(charge_relation, total_relation)]


def convert(epsilon: float, delta: float, rho: float, k: int) -> Tuple[float, float, float]:
    """An add/remove charge restated for replace/values neighbours (k = 2), or as it is (k = 1).

    ``(ε, δ, ρ) → (2ε, min(1, (1 + e^ε)·δ), 4ρ)`` (see the module docstring).

    >>> convert(0.5, 0.0, 0.125, 2)
    (1.0, 0.0, 0.5)
    >>> eps, delta, rho = convert(1.0, 1e-6, 0.5, 2)
    >>> eps, round(delta / 1e-6, 4), rho
    (2.0, 3.7183, 2.0)
    """
    if k == 1:
        return epsilon, delta, rho
    if k != 2:
        raise ValueError(f"k must be 1 or 2, got {k!r}")
    if not delta:
        d = 0.0
    elif epsilon > 700.0:  # e^ε overflows; the bound is vacuous long before
        d = 1.0
    else:
        d = min((1.0 + math.exp(epsilon)) * delta, 1.0)
    return 2.0 * epsilon, d, 4.0 * rho
