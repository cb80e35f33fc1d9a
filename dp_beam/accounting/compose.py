"""Composition of ledger entries into a report per privacy unit.

Rules (``docs/privacy/accounting.md``; seed 001):

* AC-2 sequential composition: transforms reading the same stream add up: ε
  and δ by basic composition, ρ exactly, and the tightest (ε, δ) at the
  budget's δ from privacy loss distributions or the zCDP conversion
  (:mod:`dp_beam.accounting.costs`).
* AC-3 parallel composition: the keys of one transform partition its events by
  a data-independent rule applied row by row (``key_fn``); an event, and after
  contribution bounding a user's capped contributions, is split over disjoint
  keys, so the charges of one transform's keys compose to their maximum.
* Units: an event belongs to one user, so a user-level guarantee is also an
  event-level one and the event-level total counts every transform. The
  user-level total counts user-level transforms as they are and event-level
  transforms through group privacy (AC-6) over at most ``events_per_user``
  events per user: declared explicitly, or else the largest per-user cap
  the user-level transforms declare (``LedgerEntry.max_contributions``: a
  count's or sum's ``max_contributions``, a mean's ``max_samples_per_user``
  times its ``max_keys_per_user``). That bound is an
  assumption about the input of the event-level transforms (they do not
  enforce it), and the report's note says so. Without any declaration the
  user-level total is unbounded (``None``).
* AC-5 post-processing is free: it never produces a ledger entry.
* Neighbour relations (:mod:`dp_beam.accounting.relations`): every charge is
  stated for one relation (``LedgerEntry.relation``) and so is every total
  (``AccountingReport.relation``). Within a relation charges add up as above;
  across relations they enter only through a conversion that holds: an
  add/remove charge counts twice (2ε, (1 + e^ε)·δ, 4ρ) in a ``"replace"`` or
  ``"values"`` total, a replace charge counts as it is in a ``"values"``
  total, and a charge with no conversion (``"replace"`` or ``"values"`` into
  ``"add/remove"``, ``"values"`` into ``"replace"``) makes the total
  unbounded (``None``), with a note naming the transforms and why.
  Group privacy over a user's events applies within each relation, before
  the conversion.
* Which totals: a plan whose charges share one relation gets its totals
  under that relation only (one report per unit, as before relations were
  recorded); a plan that mixes relations gets the add/remove totals and the
  totals under every other relation present, per unit; a budget's relation
  (:class:`~dp_beam.accounting.Budget`) is always reported, and only the
  reports under it carry the budget.
"""

from collections import OrderedDict
from typing import Dict, Iterable, List, Optional

from dp_beam.accounting.budget import Budget
from dp_beam.accounting.costs import best_epsilon, scale
from dp_beam.accounting.display import fmt
from dp_beam.accounting.relations import (ADD_REMOVE, REPLACE, VALUES, check_relation, convert,
                                          factor, why_unbounded)
from dp_beam.records import RELATIONS, AccountingReport, LedgerEntry

__all__ = ["budget_relation", "charges_by_transform", "check_budget", "compose", "group_size",
           "per_transform", "relations_of", "totals_of", "unbounded_by_relation", "UNITS"]

UNITS = ("event", "user")


def per_transform(entries: Iterable[LedgerEntry]) -> "OrderedDict[str, LedgerEntry]":
    """Maximum charge per transform over its keys (parallel composition, AC-3)."""
    by_transform = OrderedDict()
    for e in entries:
        check_relation(e.relation, f"relation of ledger entry {e.transform!r}")
        cur = by_transform.get(e.transform)
        if cur is None:
            by_transform[e.transform] = e
            continue
        if cur.unit != e.unit:
            raise ValueError(
                f"transform {e.transform!r} reports two privacy units "
                f"({cur.unit!r}, {e.unit!r}); labels of transforms must be unique")
        if cur.relation != e.relation:
            raise ValueError(
                f"transform {e.transform!r} reports two neighbour relations "
                f"({cur.relation!r}, {e.relation!r}); labels of transforms must be unique")
        by_transform[e.transform] = cur._replace(
            epsilon=max(cur.epsilon, e.epsilon), delta=max(cur.delta, e.delta),
            rho=max(cur.rho, e.rho))
    return by_transform


def _charge(e: LedgerEntry, k: int = 1, conversion: int = 1):
    eps, delta, rho = scale(e.epsilon, e.delta, e.rho, k)
    eps, delta, rho = convert(eps, delta, rho, conversion)
    return (eps, delta, rho, e.noise)


def _minus(limit: Optional[float], used: Optional[float]) -> Optional[float]:
    if limit is None or used is None:
        return None
    return limit - used


def relations_of(entries: Iterable[LedgerEntry]) -> List[str]:
    """The relations the entries are stated for, in the order of ``RELATIONS``."""
    present = {e.relation for e in entries}
    return [r for r in RELATIONS if r in present]


def budget_relation(budget: Optional[Budget], entries: Iterable[LedgerEntry]) -> str:
    """The relation a budget applies to: its own, else the plan's single one, else add/remove."""
    own = getattr(budget, "relation", None)
    if own is not None:
        return check_relation(own)
    present = relations_of(entries)
    return present[0] if len(present) == 1 else ADD_REMOVE


def totals_of(entries: Iterable[LedgerEntry], budget: Optional[Budget] = None) -> List[str]:
    """The relations a plan's totals are stated for (see the module docstring)."""
    entries = list(entries)
    present = relations_of(entries)
    wanted = set(present) if len(present) == 1 else set(present) | {ADD_REMOVE}
    if budget is not None:
        wanted.add(budget_relation(budget, entries))
    return [r for r in RELATIONS if r in wanted]


def unbounded_by_relation(entries: Iterable[LedgerEntry], relation: str) -> List[LedgerEntry]:
    """The transforms (one entry each) whose relation gives no bound under ``relation``."""
    return [e for e in per_transform(entries).values() if factor(e.relation, relation) is None]


def _names(entries) -> str:
    return ", ".join(repr(t) for t in sorted({e.transform for e in entries}))


def _relation_note(blocked, relation) -> str:
    parts = []
    for charge_relation in RELATIONS:
        mine = [e for e in blocked if e.relation == charge_relation]
        if mine:
            parts.append(f"{_names(mine)} ({charge_relation!r}): "
                         f"{why_unbounded(charge_relation, relation)}")
    return (f"no {relation!r} bound: transforms stated for another neighbour relation, with no "
            "conversion to this one: " + "; ".join(parts))


def _conversion_note(converted, relation) -> str:
    return (f"add/remove charges of {_names(converted)} counted twice under {relation!r} "
            "(one unit's data replaced = one removal and one addition: 2ε, (1 + e^ε)·δ, 4ρ)")


def compose(entries: Iterable[LedgerEntry], budget: Optional[Budget] = None,
            events_per_user: Optional[int] = None) -> List[AccountingReport]:
    """Compose ledger entries into reports per privacy unit and neighbour relation.

    A plan without user-level transforms gets event-level reports only; a
    plan whose charges share one relation gets one report per unit, stated
    for that relation (see the module docstring for mixed plans).

    >>> from dp_beam.records import LedgerEntry
    >>> a = LedgerEntry("count", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree", "stream")
    >>> b = a._replace(transform="sum")
    >>> [(r.unit, r.relation, r.epsilon) for r in compose([a, b])]
    [('event', 'add/remove', 1.0)]
    >>> u = b._replace(unit="user", max_contributions=2)
    >>> [(r.unit, r.epsilon) for r in compose([a, u])]   # a counts twice for a user
    [('event', 1.0), ('user', 1.5)]

    An ERM stream (replace one event) beside an add/remove count: no
    add/remove bound, and the count counts twice under replace.

    >>> m = a._replace(transform="model", relation="replace")
    >>> [(r.relation, r.epsilon) for r in compose([a, m])]
    [('add/remove', None), ('replace', 1.5)]
    """
    entries = list(dict.fromkeys(entries))  # a re-emitted entry is not a new charge
    per = per_transform(entries)
    group = group_size(per.values(), events_per_user)
    units = [u for u in UNITS if u == "event" or any(e.unit == u for e in per.values())]
    relations = totals_of(entries, budget)
    budgeted = budget_relation(budget, entries) if budget is not None else None
    return [_total(entries, per, unit, relation, group, events_per_user,
                   budget if relation == budgeted else None)
            for unit in units for relation in relations]


def _total(entries, per, unit, relation, group, events_per_user, budget):
    """The report of the ``(unit, relation)`` total, with the notes that qualify it."""
    event_level = [e for e in per.values() if e.unit != "user"]
    blocked = [e for e in per.values() if factor(e.relation, relation) is None]
    notes = [_relation_note(blocked, relation)] if blocked else []
    group_missing = unit == "user" and bool(event_level) and group is None
    if blocked or group_missing:
        charges = None
    else:
        charges = list(_charges(per, unit, relation, group).values())
    if unit == "user" and event_level:
        notes += _group_notes(event_level, relation, group, group_missing, bool(blocked),
                              events_per_user)
    converted = [e for e in per.values() if factor(e.relation, relation) == 2]
    if charges is not None and converted:
        notes.append(_conversion_note(converted, relation))
    if charges is not None or blocked:
        included = list(per)
    else:
        included = [t for t, e in per.items() if e.unit == unit]
    lines = tuple(e for e in entries if e.transform in included)
    return _report(unit, relation, charges, budget, tuple(included), lines, "; ".join(notes))


def _group_notes(event_level, relation, group, group_missing, blocked, events_per_user):
    """Why a user-level total with event-level transforms has no bound, or what it assumes."""
    names = ", ".join(sorted(e.transform for e in event_level))
    if group_missing:
        return ["no user-level bound: event-level transforms " + names
                + " need a declared number of events per user (group privacy)"]
    if blocked:
        return []  # the relation note already says why there is no bound
    source = ("declared events_per_user" if events_per_user is not None
              else "the largest per-user cap of the user-level transforms")
    note = (f"event-level transforms {names} counted by group privacy over at "
            f"most {group} events per user ({source}); this assumes no user has "
            "more events in their input")
    if any(e.relation == REPLACE for e in event_level) and relation != VALUES:
        note += (", and that replacing a user keeps their number of events "
                 "(replace-relation transforms reveal event counts)")
    return [note]


def group_size(entries: Iterable[LedgerEntry],
               events_per_user: Optional[int] = None) -> Optional[int]:
    """Events per user that event-level charges are multiplied by in a user-level total.

    ``events_per_user`` when declared, else the largest ``max_contributions``
    of the user-level entries (a count's cap, a mean's samples per user over
    all its keys), else ``None``: no user-level bound.
    """
    if events_per_user is not None:
        return events_per_user
    declared = [e.max_contributions for e in entries if e.unit == "user" and e.max_contributions]
    return max(declared) if declared else None


def _charges(per, unit, relation, group):
    """``{transform: (ε, δ, ρ, noise)}`` as each enters the ``(unit, relation)`` total."""
    return OrderedDict(
        (name, _charge(e, group if unit == "user" and e.unit != "user" else 1,
                       factor(e.relation, relation)))
        for name, e in per.items())


def charges_by_transform(entries: Iterable[LedgerEntry], unit: str, relation: str,
                         events_per_user: Optional[int] = None) -> Optional[Dict[str, float]]:
    """``{transform: ε}`` as each transform enters the ``(unit, relation)`` total, or ``None``.

    The summands of :func:`compose`'s ``epsilon`` for that total (keys in
    parallel, group privacy, relation conversion), in the order of the
    entries: what a chart of the total must stack so that its bars add up to
    the reported ε. ``None`` when the total is unbounded. Only transforms
    the total counts appear (an event-level total counts every transform, a
    user-level one too, through group privacy).

    >>> from dp_beam.records import LedgerEntry
    >>> a = LedgerEntry("count", "event", "add/remove one event", 0.25, 0.0, 0.03, "tree", "stream")
    >>> u = a._replace(transform="mean", unit="user", epsilon=0.5, max_contributions=2)
    >>> charges_by_transform([a, u], "user", "add/remove")
    {'count': 0.5, 'mean': 0.5}
    >>> charges_by_transform([a, u._replace(max_contributions=None)], "user", "add/remove") is None
    True
    """
    entries = list(dict.fromkeys(entries))
    per = per_transform(entries)
    if any(factor(e.relation, relation) is None for e in per.values()):
        return None
    group = group_size(per.values(), events_per_user)
    if unit == "user" and group is None and any(e.unit != "user" for e in per.values()):
        return None
    return {name: c[0] for name, c in _charges(per, unit, relation, group).items()}


def _report(unit, relation, charges, budget, transforms, lines, note):
    b_eps = budget.epsilon if budget is not None else None
    b_delta = budget.delta if budget is not None and budget.epsilon is not None else None
    b_rho = budget.rho if budget is not None else None
    if charges is None:
        return AccountingReport(unit, None, None, None, None, b_delta, "none", b_eps, b_delta,
                                b_rho, None, None, None, budget is None, transforms, lines, note,
                                relation=relation)
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
        lines=lines, note=note, relation=relation)


# How to restate a plan whose charges give no bound under the budget's relation.
_REMEDY = {
    VALUES: ("give {names} neighbours=\"participation\" (an add/remove guarantee), or state "
             "the budget for the values relation: Budget(..., relation=\"values\")"),
    REPLACE: ("state the budget for the replace relation: Budget(..., relation=\"replace\") "
              "(add/remove charges then count twice), or leave {names} out of this budget"),
}


def check_budget(entries: Iterable[LedgerEntry], budget: Budget,
                 events_per_user: Optional[int] = None) -> List[AccountingReport]:
    """Compose a plan and raise ``ValueError`` naming the transforms if it is over budget.

    This is the privacy filter of a pipeline: it runs at construction. The
    budget applies to every unit the plan bounds, under the budget's relation
    (:func:`budget_relation`). A plan with charges that give no bound under
    that relation (a ``"values"`` mean or an ERM stream under an add/remove
    budget) is refused, naming them and how to restate the plan. A user-level
    total the plan cannot bound for lack of group privacy (event-level
    transforms, nothing declared) is refused too: a pipeline with a
    user-level transform states a user-level guarantee, and running it with
    that guarantee silently unbounded would mislead; the error names the
    transforms and the parameter to declare (``events_per_user``).
    """
    entries = list(entries)
    relation = budget_relation(budget, entries)
    _refuse_unbounded_relation(unbounded_by_relation(entries, relation), budget, relation)
    reports = compose(entries, budget, events_per_user)
    per = per_transform(entries)
    _refuse_missing_group(per, events_per_user)
    _refuse_over_budget(reports, per, budget, relation)
    return reports


def _refuse_unbounded_relation(blocked, budget, relation):
    """Raises when charges give no bound under the budget's relation, naming how to restate."""
    if not blocked:
        return
    remedies = []
    for charge_relation in (VALUES, REPLACE):
        mine = [e for e in blocked if e.relation == charge_relation]
        if mine:
            remedies.append(_REMEDY[charge_relation].format(names=_names(mine)))
    stated = ("is stated for" if getattr(budget, "relation", None) is not None else
              "applies to (a budget without relation= does when the plan mixes relations)")
    raise ValueError(
        f"budget {budget!r} {stated} {relation!r} neighbours, and the plan has "
        f"{_relation_note(blocked, relation)}. To fix: " + "; or ".join(remedies))


def _refuse_missing_group(per, events_per_user):
    """Raises when a user-level total needs group privacy and nothing bounds a user's events."""
    event_level = sorted(t for t, e in per.items() if e.unit != "user")
    user_level = sorted(t for t, e in per.items() if e.unit == "user")
    if user_level and event_level and group_size(per.values(), events_per_user) is None:
        raise ValueError(
            f"the user-level total of this plan is unbounded: user-level transforms "
            f"{', '.join(map(repr, user_level))} protect users, event-level transforms "
            f"{', '.join(map(repr, event_level))} protect single events, and nothing bounds how "
            "many events one user has (no user-level transform declares a per-user cap). "
            "Declare it: CombineAccounting(budget, events_per_user=N) "
            "(dp_beam.plan(..., events_per_user=N)), or make the event-level transforms "
            "user-level (privacy_unit=\"user\", max_contributions=N)")


def _refuse_over_budget(reports, per, budget, relation):
    """Raises at the first bounded total under the budget's relation that exceeds it."""
    for r in reports:
        if r.epsilon is None or r.relation != relation:
            continue
        if not r.within_budget:
            costs = ", ".join(
                e.transform
                + (f" ({e.relation}, counted twice)" if factor(e.relation, relation) == 2 else "")
                + f": epsilon={fmt(e.epsilon)}, delta={fmt(e.delta)}, rho={fmt(e.rho)}"
                for e in per.values() if e.transform in r.transforms)
            tight = ("" if r.epsilon_at_delta == r.epsilon else
                     f" (at delta={fmt(r.at_delta)}: {fmt(r.epsilon_at_delta)})")
            raise ValueError(
                f"budget exceeded for privacy unit {r.unit!r} under {relation!r} neighbours: "
                f"planned epsilon={fmt(r.epsilon)}{tight}, delta={fmt(r.delta)}, "
                f"rho={fmt(r.rho)} > {budget!r} ({costs})")
