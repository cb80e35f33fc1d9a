"""The budget rows of a report (report_budget.py): what report*.jsonl says, nothing more."""

from dp_beam import report_budget as budget

_LEDGER = [
    {"transform": "count", "unit": "event", "neighbours": "add/remove one event",
     "epsilon": 0.5, "delta": 0.0, "rho": 0.125, "mechanism": "tree", "scope": "stream"},
    {"transform": "sum", "unit": "event", "neighbours": "add/remove one event",
     "epsilon": 0.25, "delta": 0.0, "rho": 0.03, "mechanism": "tree", "scope": "stream"},
]


def _row(**kw):
    fields = dict(unit="event", relation="add/remove", spent=1.0, tight=None, at_delta=None,
                  method="", budget=None, remaining=None, within=None, bars=None,
                  transforms=(), note="")
    fields.update(kw)
    return budget.BudgetRow(**fields)


def test_final_reports_keeps_the_report_of_most_lines_and_orders_event_first():
    early = {"unit": "event", "lines": [1], "epsilon": 0.5}
    final = {"unit": "event", "lines": [1, 2], "epsilon": 1.0}
    user = {"unit": "user", "relation": "add/remove", "lines": [1, 2]}
    replace = {"unit": "event", "relation": "replace", "lines": []}
    out = budget.final_reports([user, replace, final, early])
    assert list(out) == [("event", "add/remove"), ("event", "replace"), ("user", "add/remove")]
    assert out[("event", "add/remove")] is final


def test_budget_rows_compose_the_ledger_when_there_is_no_report():
    (row,) = budget.budget_rows(_LEDGER, [])
    assert (row.unit, row.relation, row.spent, row.within) == ("event", "add/remove", 0.75, None)
    assert dict(row.bars) == {"count": 0.5, "sum": 0.25}
    assert budget.budget_rows([], []) == []


def test_budget_rows_show_no_bound_with_the_reports_reason():
    unbounded = {"record": "AccountingReport", "unit": "user", "relation": "add/remove",
                 "epsilon": None, "note": "no user-level bound: why", "budget_epsilon": 1.0,
                 "within_budget": False, "lines": []}
    (row,) = budget.budget_rows(_LEDGER, [unbounded])
    assert (row.spent, row.bars, row.note, row.within) == (None, None, "no user-level bound: why",
                                                           False)


def test_budget_rows_say_when_the_bars_do_not_add_up_to_the_reported_epsilon():
    wrong = {"record": "AccountingReport", "unit": "event", "relation": "add/remove",
             "epsilon": 2.0, "lines": _LEDGER}
    (row,) = budget.budget_rows([], [wrong])
    assert row.bars is None
    assert row.note == "the split per transform could not be recovered from the report"


def test_spent_and_status_texts():
    assert budget.spent_text(_row(spent=None)) == "no bound (see the note)"
    assert budget.spent_text(_row(spent=1.5, budget=2.0)) == "ε spent 1.5 of 2"
    assert budget.spent_text(_row(spent=1.5, tight=1.0, at_delta=1e-6)) == (
        "ε spent 1.5; tightest at δ=1e-06: 1")
    assert budget.status_text(_row(spent=None, within=False)) == "no bound (not within budget)"
    assert budget.status_text(_row(spent=None)) == "no bound"
    assert budget.status_text(_row()) == "not budgeted"
    assert budget.status_text(_row(within=True)) == "within"
    assert budget.status_text(_row(within=False)) == "OVER"
