"""The budget of a run as its accounting reports state it: one row per privacy total.

A total the accounting could not bound stays without a number (its reason
in the note), and the per-transform bars of a bounded total are the
summands of the report's ε
(:func:`dp_beam.accounting.compose.charges_by_transform`), so they add up to
the ε spent.
"""

import math
import re
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, NamedTuple, Optional

from dp_beam.accounting.display import fmt

__all__ = ["budget_rows", "BudgetRow", "final_reports", "spent_text", "status_text"]


class BudgetRow(NamedTuple):
    """One privacy total of a run (per unit and neighbour relation), as its report states it.

    ``spent`` is the report's ε (basic composition; ``None``: no bound, see
    ``note``), ``bars`` its summands per transform (``None`` when the total
    has no bound or the split cannot be recovered), ``tight`` the tightest ε
    at the budget's δ and ``method`` its route, ``remaining`` the report's
    remaining ε (budget minus ``tight``).
    """
    unit: str
    relation: str
    spent: Optional[float]
    tight: Optional[float]
    at_delta: Optional[float]
    method: str
    budget: Optional[float]
    remaining: Optional[float]
    within: Optional[bool]
    bars: Optional["OrderedDict"]
    transforms: tuple
    note: str


_DECLARED = re.compile(r"over at most (\d+) events per user \(declared events_per_user\)")
_RELATION_ORDER = {"add/remove": 0, "replace": 1, "values": 2}


def _entry(d):
    """A :class:`~dp_beam.records.LedgerEntry` from its JSON form (hashable: lists → tuples).

    A ledger line is an object; a report's ``lines`` hold the same entries as
    arrays in field order.
    """
    from dp_beam.records import LedgerEntry

    def frozen(v):
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    if isinstance(d, list):
        return LedgerEntry(*(frozen(v) for v in d[:len(LedgerEntry._fields)]))
    fields = LedgerEntry._fields
    return LedgerEntry(**{k: frozen(v) for k, v in d.items() if k in fields})


def final_reports(reports: Iterable[Dict[str, Any]]) -> "OrderedDict":
    """The final report per ``(unit, relation)``: the one composed from the most ledger lines.

    ``CombineAccounting`` re-emits accumulating reports as streams open; a
    batch run's last is its final one, and a streaming run's per-bundle files
    are read in path order, so the most complete report is taken (ties: the
    last read). Reports without ``relation`` (schema 1) are add/remove ones.
    """
    final = {}
    for r in reports:
        k = (r["unit"], r.get("relation") or "add/remove")
        if k not in final or len(r.get("lines") or ()) >= len(final[k].get("lines") or ()):
            final[k] = r
    order = sorted(final, key=lambda ur: (ur[0] != "event", _RELATION_ORDER.get(ur[1], 3), ur[1]))
    return OrderedDict((k, final[k]) for k in order)


def budget_rows(ledger: Iterable[Dict[str, Any]],
                reports: Iterable[Dict[str, Any]]) -> List[BudgetRow]:
    """One :class:`BudgetRow` per final accounting report; from the ledger alone without reports.

    Without ``report*.jsonl`` the ledger is composed here
    (:func:`dp_beam.accounting.compose`, no budget), which is what the
    report would have said.
    """
    from dp_beam.accounting import compose
    from dp_beam.accounting.compose import charges_by_transform
    from dp_beam.records import to_json

    if not reports:
        if not ledger:
            return []
        reports = [to_json(r) for r in compose([_entry(e) for e in ledger])]
    rows = []
    for (unit, relation), r in final_reports(reports).items():
        spent, bars = r.get("epsilon"), None
        note = r.get("note") or ""
        if spent is not None:
            m = _DECLARED.search(note)
            lines = [_entry(e) for e in r.get("lines") or ()]
            split = charges_by_transform(lines, unit, relation,
                                         int(m.group(1)) if m else None) if lines else None
            if split is not None and math.isclose(sum(split.values()), spent, rel_tol=1e-9,
                                                  abs_tol=1e-12):
                bars = OrderedDict(split)
            elif lines or spent:
                note = (note + "; " if note else "") + (
                    "the split per transform could not be recovered from the report")
        budget = r.get("budget_epsilon")
        rows.append(BudgetRow(
            unit=unit, relation=relation, spent=spent, tight=r.get("epsilon_at_delta"),
            at_delta=r.get("at_delta"), method=r.get("method") or "", budget=budget,
            remaining=r.get("remaining_epsilon"),
            within=(r.get("within_budget") if budget is not None or r.get("budget_rho")
                    is not None else None),
            bars=bars, transforms=tuple(r.get("transforms") or ()), note=note))
    return rows


def spent_text(row: BudgetRow) -> str:
    """What the panel prints beside a total: the sum of its bars, or why there is none."""
    if row.spent is None:
        return "no bound (see the note)"
    text = f"ε spent {fmt(row.spent)}"
    if row.budget is not None:
        text += f" of {fmt(row.budget)}"
    if row.tight is not None and row.tight < row.spent * (1 - 1e-9):
        text += f"; tightest at δ={fmt(row.at_delta)}: {fmt(row.tight)}"
    return text


def status_text(row: BudgetRow) -> str:
    if row.spent is None:
        return "no bound" + (" (not within budget)" if row.within is False else "")
    if row.within is None:
        return "not budgeted"
    return "within" if row.within else "OVER"
