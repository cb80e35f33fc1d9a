"""Composition of ledger entries into a report per privacy unit.

Rules (spec withhold_release_and_composition.md §4, seed 001):

* R2 sequential composition: transforms reading the same stream add up: ε
  and δ by basic composition, ρ exactly, and the tightest (ε, δ) at the
  budget's δ from privacy loss distributions or the zCDP conversion
  (:mod:`dp_beam.accounting.costs`).
* R3 parallel composition: the keys of one transform partition its events by
  a data-independent rule applied row by row (``key_fn``); an event, and after
  contribution bounding a user's capped contributions, is split over disjoint
  keys, so the charges of one transform's keys compose to their maximum.
* Units: an event belongs to one user, so a user-level guarantee is also an
  event-level one and the event-level total counts every transform. The
  user-level total counts user-level transforms as they are and event-level
  transforms through group privacy (R5) over at most ``events_per_user``
  events per user: declared explicitly, or else the largest
  ``max_contributions`` the user-level transforms declare. That bound is an
  assumption about the input of the event-level transforms (they do not
  enforce it), and the report's note says so. Without any declaration the
  user-level total is unbounded (``None``).
* R4 post-processing is free: it never produces a ledger entry.
"""

from collections import OrderedDict
from typing import Iterable, List, Optional

from dp_beam.accounting.costs import best_epsilon, scale
from dp_beam.records import AccountingReport, LedgerEntry

UNITS = ("event", "user")


def per_transform(entries: Iterable[LedgerEntry]) -> "OrderedDict[str, LedgerEntry]":
    """Maximum charge per transform over its keys (parallel composition, R3)."""
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


def _charge(e: LedgerEntry, k: int = 1):
    eps, delta, rho = scale(e.epsilon, e.delta, e.rho, k)
    return (eps, delta, rho, e.noise)


def _minus(limit: Optional[float], used: Optional[float]) -> Optional[float]:
    if limit is None or used is None:
        return None
    return limit - used


def compose(entries: Iterable[LedgerEntry], budget=None,
            events_per_user: Optional[int] = None) -> List[AccountingReport]:
    """Compose ledger entries into one report per privacy unit.

    A plan without user-level transforms gets an event-level report only.

    >>> from dp_beam.records import LedgerEntry
    >>> a = LedgerEntry("count", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree", "stream")
    >>> b = a._replace(transform="sum")
    >>> [(r.unit, r.epsilon) for r in compose([a, b])]
    [('event', 1.0)]
    >>> u = b._replace(unit="user", max_contributions=2)
    >>> [(r.unit, r.epsilon) for r in compose([a, u])]   # a counts twice for a user
    [('event', 1.0), ('user', 1.5)]
    """
    entries = list(dict.fromkeys(entries))  # a re-emitted entry is not a new charge
    per = per_transform(entries)
    declared = [e.max_contributions for e in per.values()
                if e.unit == "user" and e.max_contributions]
    group = events_per_user if events_per_user is not None else (max(declared) if declared else None)
    units = [u for u in UNITS if u == "event" or any(e.unit == u for e in per.values())]
    reports = []
    for unit in units:
        event_level = [e for e in per.values() if e.unit != "user"]
        note = ""
        if unit == "event":
            charges = [_charge(e) for e in per.values()]
        elif event_level and group is None:
            charges = None
            note = ("no user-level bound: event-level transforms "
                    + ", ".join(sorted(e.transform for e in event_level))
                    + " need a declared number of events per user (group privacy)")
        else:
            charges = [_charge(e, group if e.unit != "user" else 1) for e in per.values()]
            if event_level:
                source = ("declared events_per_user" if events_per_user is not None
                          else "the largest max_contributions of the user-level transforms")
                note = (f"event-level transforms {', '.join(sorted(e.transform for e in event_level))}"
                        f" counted by group privacy over at most {group} events per user "
                        f"({source}); this assumes no user has more events in their input")
        included = [t for t, e in per.items() if charges is not None or e.unit == unit]
        lines = tuple(e for e in entries if e.transform in included)
        reports.append(_report(unit, charges, budget, tuple(included), lines, note))
    return reports


def _report(unit, charges, budget, transforms, lines, note):
    b_eps = budget.epsilon if budget is not None else None
    b_delta = budget.delta if budget is not None and budget.epsilon is not None else None
    b_rho = budget.rho if budget is not None else None
    if charges is None:
        return AccountingReport(unit, None, None, None, None, b_delta, "none", b_eps, b_delta,
                                b_rho, None, None, None, budget is None, transforms, lines, note)
    eps = float(sum(c[0] for c in charges))
    delta = float(sum(c[1] for c in charges))
    rho = float(sum(c[2] for c in charges))
    at_delta = b_delta if b_delta is not None else delta
    tight, method = best_epsilon(charges, at_delta)
    # ``tight`` holds at δ = ``at_delta`` (the budget's δ), whatever route gave it.
    within = True if budget is None else budget.admits(tight, at_delta, rho)
    return AccountingReport(
        unit=unit, epsilon=eps, delta=delta, rho=rho, epsilon_at_delta=tight, at_delta=at_delta,
        method=method, budget_epsilon=b_eps, budget_delta=b_delta, budget_rho=b_rho,
        remaining_epsilon=_minus(b_eps, tight),
        remaining_delta=_minus(b_delta, delta if method == "basic composition" else at_delta),
        remaining_rho=_minus(b_rho, rho), within_budget=within, transforms=transforms,
        lines=lines, note=note)


def check_budget(entries: Iterable[LedgerEntry], budget,
                 events_per_user: Optional[int] = None) -> List[AccountingReport]:
    """Compose a plan and raise ``ValueError`` naming the transforms if it is over budget.

    This is the privacy filter of a pipeline: it runs at construction. The
    budget applies to every unit the plan bounds; a user-level total the plan
    cannot bound (event-level transforms, nothing declared) is reported, not
    rejected, because the event-level guarantee is then the one in force.
    """
    entries = list(entries)
    reports = compose(entries, budget, events_per_user)
    for r in reports:
        if r.epsilon is None:
            continue
        if not r.within_budget:
            costs = ", ".join(
                f"{e.transform}: epsilon={e.epsilon:g}, delta={e.delta:g}, rho={e.rho:g}"
                for e in per_transform(entries).values() if e.transform in r.transforms)
            raise ValueError(
                f"budget exceeded for privacy unit {r.unit!r}: planned "
                f"epsilon={r.epsilon:g} (at delta={r.at_delta:g}: {r.epsilon_at_delta}), "
                f"delta={r.delta:g}, rho={r.rho:g} > {budget!r} ({costs})")
    return reports
