"""Composition of ledger entries into a per-unit report.

Rules (spec withhold_release_and_composition.md §4, seed 001):

* R2 sequential composition: transforms reading the same stream add up
  (ε and δ by basic composition, ρ exactly).
* R3 parallel composition: the keys of one transform partition its events by a
  data-independent rule applied row by row (``key_fn``); an event, and after
  contribution bounding a user's capped contributions, is split over disjoint
  keys, so the charges of one transform's keys compose to their maximum.
* An event-level guarantee follows from a user-level one (an event belongs to
  one user), so the event-level total counts every entry. A user-level total
  from event-level entries needs group privacy over each user's events; this
  first version reports such a user-level total as unbounded (``None``) and
  says so in the report note. A plan without user-level transforms gets an
  event-level report only.
"""

from collections import OrderedDict
from typing import Iterable, List, Optional

from dp_beam.records import AccountingReport, LedgerEntry

UNITS = ("event", "user")


def _per_transform(entries: Iterable[LedgerEntry]):
    """Maximum charge per transform over its keys (parallel composition)."""
    by_transform = OrderedDict()
    for e in entries:
        cur = by_transform.get(e.transform)
        if cur is None:
            by_transform[e.transform] = e
            continue
        if cur.unit != e.unit:
            raise ValueError(
                f"transform {e.transform!r} reports two privacy units "
                f"({cur.unit!r}, {e.unit!r}); labels of transforms must be unique")
        by_transform[e.transform] = cur._replace(
            epsilon=max(cur.epsilon, e.epsilon), delta=max(cur.delta, e.delta),
            rho=max(cur.rho, e.rho))
    return by_transform


def compose(entries: Iterable[LedgerEntry], budget=None) -> List[AccountingReport]:
    """Compose ledger entries into one report per privacy unit.

    >>> from dp_beam.records import LedgerEntry
    >>> a = LedgerEntry("count", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree", "stream")
    >>> b = a._replace(transform="sum")
    >>> [(r.unit, r.epsilon) for r in compose([a, b])]
    [('event', 1.0)]
    >>> [(r.unit, r.epsilon) for r in compose([a, b._replace(unit="user")])]
    [('event', 1.0), ('user', None)]
    """
    entries = list(dict.fromkeys(entries))  # a re-emitted entry is not a new charge
    per = _per_transform(entries)
    reports = []
    units = [u for u in UNITS if u == "event" or any(e.unit == u for e in per.values())]
    for unit in units:
        relevant = [e for e in per.values() if unit == "event" or e.unit == unit]
        unbounded = unit == "user" and any(e.unit != "user" for e in per.values())
        note = ""
        if unbounded:
            eps = delta = rho = None
            note = ("event-level transforms give no user-level bound without group "
                    "privacy: " + ", ".join(sorted(e.transform for e in per.values()
                                                   if e.unit != "user")))
        else:
            eps = float(sum(e.epsilon for e in relevant))
            delta = float(sum(e.delta for e in relevant))
            rho = float(sum(e.rho for e in relevant))
        b_eps = budget.epsilon if budget is not None else None
        b_delta = budget.delta if budget is not None and budget.epsilon is not None else None
        b_rho = budget.rho if budget is not None else None
        reports.append(AccountingReport(
            unit=unit, epsilon=eps, delta=delta, rho=rho,
            budget_epsilon=b_eps, budget_delta=b_delta, budget_rho=b_rho,
            remaining_epsilon=_minus(b_eps, eps), remaining_delta=_minus(b_delta, delta),
            remaining_rho=_minus(b_rho, rho),
            within_budget=True if budget is None else budget.admits(eps, delta, rho),
            transforms=tuple(e.transform for e in relevant),
            lines=tuple(e for e in entries if unit == "event" or e.unit == unit),
            note=note))
    return reports


def _minus(limit: Optional[float], used: Optional[float]) -> Optional[float]:
    if limit is None or used is None:
        return None
    return limit - used


def check_budget(entries: Iterable[LedgerEntry], budget) -> List[AccountingReport]:
    """Compose a plan and raise ``ValueError`` naming the transforms if it is over budget.

    The budget applies to the event-level total and, where the plan bounds it,
    to the user-level total. A user-level total the plan does not bound is only
    an error when every transform is user-level (then it is always bounded).
    """
    entries = list(entries)
    reports = compose(entries, budget)
    for r in reports:
        if r.epsilon is None and r.rho is None:
            continue
        if not r.within_budget:
            costs = ", ".join(
                f"{e.transform}: epsilon={e.epsilon:g}, delta={e.delta:g}, rho={e.rho:g}"
                for e in _per_transform(entries).values() if e.transform in r.transforms)
            raise ValueError(
                f"budget exceeded for privacy unit {r.unit!r}: planned "
                f"epsilon={r.epsilon:g}, delta={r.delta:g}, rho={r.rho:g} > {budget!r} "
                f"({costs})")
    return reports
