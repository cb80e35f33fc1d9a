"""Budgets and composition of ledger entries (spec §4 R2, R3)."""

import math

import numpy as np
import pytest

from dp_beam.accounting import Budget, check_budget, compose
from dp_beam.accounting.relations import convert, factor
from dp_beam.records import RELATIONS, LedgerEntry


def entry(transform, eps, unit="event", key=None, delta=0.0, scope="stream"):
    return LedgerEntry(transform, unit, "add/remove one event", eps, delta, eps * eps / 2,
                       "tree", scope, key=key)


def test_sequential_composition_adds_across_transforms():
    (event,) = compose([entry("a", 0.25), entry("b", 0.5), entry("c", 0.125)])
    assert event.unit == "event" and event.epsilon == pytest.approx(0.875)
    assert event.rho == pytest.approx((0.25 ** 2 + 0.5 ** 2 + 0.125 ** 2) / 2)


def test_event_level_entries_leave_a_user_level_total_unbounded():
    (event, user) = compose([entry("a", 0.25), entry("b", 0.5, unit="user")], Budget(epsilon=1.0))
    assert event.epsilon == pytest.approx(0.75)
    assert user.epsilon is None and not user.within_budget
    assert "group privacy" in user.note and "a" in user.note


def test_parallel_composition_takes_the_max_over_keys_of_one_transform():
    entries = [entry("a", 0.5, key="AA", scope="key"), entry("a", 0.5, key="UA", scope="key"),
               entry("b", 0.25)]
    (event,) = compose(entries)
    assert event.epsilon == pytest.approx(0.75)
    assert len(event.lines) == 3


def test_duplicate_entries_are_not_charged_twice():
    e = entry("a", 0.5)
    (event,) = compose([e, e])
    assert event.epsilon == 0.5


def test_user_level_total_when_every_transform_is_user_level():
    (event, user) = compose([entry("a", 0.4, unit="user"), entry("b", 0.6, unit="user")])
    assert user.epsilon == pytest.approx(1.0) and event.epsilon == pytest.approx(1.0)


def test_budget_check_raises_naming_transforms_and_costs():
    with pytest.raises(ValueError, match=r"budget exceeded.*hourly: epsilon=0\.7.*daily: epsilon=0\.5"):
        check_budget([entry("hourly", 0.7), entry("daily", 0.5)], Budget(epsilon=1.0))
    reports = check_budget([entry("hourly", 0.5), entry("daily", 0.5)], Budget(epsilon=1.0))
    assert reports[0].remaining_epsilon == pytest.approx(0.0) and reports[0].within_budget


def test_delta_and_rho_budgets():
    gauss = entry("g", 0.5, delta=1e-6)
    with pytest.raises(ValueError, match="budget exceeded"):
        check_budget([gauss], Budget(epsilon=1.0))           # pure-ε budget admits no δ
    check_budget([gauss], Budget(epsilon=1.0, delta=1e-5))
    with pytest.raises(ValueError, match="budget exceeded"):
        check_budget([gauss, gauss._replace(transform="h")], Budget(rho=0.2))


@pytest.mark.parametrize("kwargs, name", [
    (dict(epsilon=-1.0), "epsilon"), (dict(epsilon=1.0, delta=1.5), "delta"),
    (dict(rho=float("nan")), "rho"), (dict(), "epsilon or rho"), (dict(epsilon="1"), "epsilon"),
])
def test_budget_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Budget(**kwargs)


def test_event_level_transforms_join_a_user_total_by_group_privacy():
    e = entry("hourly", 0.1)
    u = entry("mean", 0.5, unit="user")._replace(max_contributions=4)
    event, user = compose([e, u])
    assert event.epsilon == pytest.approx(0.6)
    assert user.epsilon == pytest.approx(0.5 + 4 * 0.1)
    assert "group privacy over at most 4 events" in user.note and "hourly" in user.note
    (_, declared) = compose([e, u], events_per_user=10)
    assert declared.epsilon == pytest.approx(0.5 + 10 * 0.1)
    assert "declared events_per_user" in declared.note


def test_approximate_budget_uses_the_tightest_valid_route():
    gauss = [entry(f"g{i}", 0.3, delta=1e-8)._replace(rho=0.004, noise="gaussian")
             for i in range(10)]
    # Basic composition says ε = 3 > 2, but the ten Gaussians are one of ρ = 0.04.
    (report,) = check_budget(gauss, Budget(epsilon=2.0, delta=1e-6))
    assert report.epsilon == pytest.approx(3.0) and report.epsilon_at_delta < 2.0
    assert report.method in ("privacy loss distribution", "zCDP")
    assert report.remaining_epsilon == pytest.approx(2.0 - report.epsilon_at_delta)


def test_bmi_worked_example_privacy_of_both_algorithms():
    # Seed 001: Algorithm 1 answers four overlapping counts at ε/4 each
    # (sequential); Algorithm 2 measures four disjoint cells at ε each
    # (parallel: the cell is a row-wise, data-independent key) and adds them.
    eps = 1.0
    alg1 = [entry(q, eps / 4) for q in ("males<25", "males", "females<25", "females")]
    alg2 = [entry("cells", eps, key=c, scope="key") for c in ("M<25", "M>=25", "F<25", "F>=25")]
    assert compose(alg1)[0].epsilon == pytest.approx(eps)
    assert compose(alg2)[0].epsilon == pytest.approx(eps)


def test_bmi_worked_example_errors():
    # Total squared error: Algorithm 1 is 4·2(4/ε)² = 128/ε²; Algorithm 2 is
    # 2/ε² + 4/ε² + 2/ε² + 4/ε² = 12/ε². The mean of n squared Laplace errors has
    # relative std √(E[X⁴]/E[X²]² − 1)/√n = √5/√n per query; with n = 200,000
    # that is 0.5 %, so 3 % is over 5 standard errors.
    eps, n = 0.5, 200_000
    rng = np.random.default_rng(2018)
    alg1 = rng.laplace(0, 4 / eps, size=(n, 4))
    cells = rng.laplace(0, 1 / eps, size=(n, 4))
    alg2 = np.stack([cells[:, 0], cells[:, 0] + cells[:, 1],
                     cells[:, 2], cells[:, 2] + cells[:, 3]], axis=1)
    assert (alg1 ** 2).mean(axis=0).sum() == pytest.approx(128 / eps ** 2, rel=0.03)
    assert (alg2 ** 2).mean(axis=0).sum() == pytest.approx(12 / eps ** 2, rel=0.03)


# -- neighbour relations ---------------------------------------------------------------------

def rel_entry(transform, eps, relation, unit="event", delta=0.0, rho=None, noise="laplace",
              **kw):
    text = {"add/remove": "add/remove one unit", "replace": "replace one event",
            "values": "values"}[relation]
    return LedgerEntry(transform, unit, text, eps, delta, eps * eps / 2 if rho is None else rho,
                       "tree", "stream", noise=noise, relation=relation, **kw)


def by_total(reports):
    return {(r.unit, r.relation): r for r in reports}


def test_values_mean_beside_a_user_count_has_no_add_remove_bound():
    # Audit case 1: a values mean publishes exact user counts, so adding a user is
    # detected with certainty; the add/remove total is unbounded, not 1.0.
    mean = rel_entry("mean", 0.5, "values", unit="user")
    count = rel_entry("users", 0.5, "add/remove", unit="user", max_contributions=3)
    reports = compose([mean, count])
    assert [(r.unit, r.relation) for r in reports] == [
        ("event", "add/remove"), ("event", "values"), ("user", "add/remove"), ("user", "values")]
    totals = by_total(reports)
    for unit in ("event", "user"):
        unbounded = totals[unit, "add/remove"]
        assert unbounded.epsilon is None and unbounded.rho is None and unbounded.method == "none"
        assert "'mean' ('values')" in unbounded.note and "exact user counts" in unbounded.note
        assert unbounded.transforms == ("mean", "users")
        # Under values neighbours the add/remove count counts twice: 0.5 + 2 x 0.5.
        values = totals[unit, "values"]
        assert values.epsilon == pytest.approx(1.5)
        assert values.rho == pytest.approx(0.125 + 4 * 0.125)
        assert "'users' counted twice" in values.note
    # The default budget applies to add/remove when relations mix: refused, with the fix.
    with pytest.raises(ValueError) as err:
        check_budget([mean, count], Budget(epsilon=1.0))
    msg = str(err.value)
    assert "'add/remove'" in msg and "'mean'" in msg
    assert 'neighbours="participation"' in msg and 'relation="values"' in msg
    with pytest.raises(ValueError, match=r"budget exceeded .*'values'.*users \(add/remove, "
                                         r"counted twice\): epsilon=0\.5"):
        check_budget([mean, count], Budget(epsilon=1.0, relation="values"))
    reports = check_budget([mean, count], Budget(epsilon=1.5, relation="values"))
    budgeted = [r for r in reports if r.budget_epsilon is not None]
    assert [(r.unit, r.relation) for r in budgeted] == [("event", "values"), ("user", "values")]
    assert all(r.within_budget and r.remaining_epsilon == pytest.approx(0.0) for r in budgeted)
    # Not budgeted: the add/remove totals carry no budget.
    assert all(r.budget_epsilon is None and r.within_budget
               for r in reports if r.relation == "add/remove")
    # A values charge says nothing about replacing a user (who may arrive at other times).
    with pytest.raises(ValueError, match="'replace' bound.*'mean'"):
        check_budget([mean, count], Budget(epsilon=10.0, relation="replace"))


def test_erm_beside_an_add_remove_count_is_converted_to_replace():
    # Audit case 2: ERM streams (replace one event, count-triggered blocks) and an
    # add/remove count. Not 1.0 under either relation.
    erm = rel_entry("erm", 0.5, "replace")
    count = rel_entry("count", 0.5, "add/remove")
    reports = compose([erm, count])
    assert [(r.unit, r.relation) for r in reports] == [("event", "add/remove"),
                                                       ("event", "replace")]
    added, replaced = reports
    assert added.epsilon is None and "'erm' ('replace')" in added.note
    assert "count-triggered release schedule" in added.note
    assert replaced.epsilon == pytest.approx(0.5 + 2 * 0.5)
    assert replaced.rho == pytest.approx(0.125 + 4 * 0.125)
    with pytest.raises(ValueError) as err:
        check_budget([erm, count], Budget(epsilon=5.0))
    assert "'erm'" in str(err.value) and 'relation="replace"' in str(err.value)
    with pytest.raises(ValueError, match="budget exceeded"):
        check_budget([erm, count], Budget(epsilon=1.0, relation="replace"))
    (_, ok) = check_budget([erm, count], Budget(epsilon=1.5, relation="replace"))
    assert ok.within_budget and ok.relation == "replace" and ok.budget_epsilon == 1.5
    # Replace-neighbour pairs are values-neighbour pairs too: the same total under values.
    reports = compose([erm, count], Budget(epsilon=1.5, relation="values"))
    assert [(r.relation, r.epsilon) for r in reports] == [
        ("add/remove", None), ("replace", pytest.approx(1.5)), ("values", pytest.approx(1.5))]
    assert [r.budget_epsilon for r in reports] == [None, None, 1.5]


def test_approximate_and_zcdp_charges_convert_as_a_group_of_two():
    # (ε, δ) → (2ε, (1 + e^ε)δ); ρ → 4ρ (exactly a Gaussian of twice the sensitivity).
    gauss = rel_entry("g", 0.5, "add/remove", delta=1e-6, rho=0.02, noise="gaussian")
    erm = rel_entry("erm", 0.3, "replace")
    (_, replaced) = compose([gauss, erm])
    assert replaced.epsilon == pytest.approx(2 * 0.5 + 0.3)
    assert replaced.delta == pytest.approx((1 + math.exp(0.5)) * 1e-6)
    assert replaced.rho == pytest.approx(4 * 0.02 + 0.3 ** 2 / 2)
    # The chained bound is at most the classic group-privacy δ, 2·e^ε·δ.
    assert (1 + math.exp(0.5)) * 1e-6 <= 2 * math.exp(0.5) * 1e-6
    (_, tight) = compose([gauss, erm], Budget(epsilon=3.0, delta=1e-5, relation="replace"))
    assert tight.epsilon_at_delta <= tight.epsilon and tight.within_budget


def test_conversion_formulas():
    assert convert(0.5, 0.0, 0.125, 2) == (1.0, 0.0, 0.5)
    eps, delta, rho = convert(1.0, 1e-6, 0.3, 2)
    assert (eps, rho) == (2.0, pytest.approx(1.2))
    assert delta == pytest.approx((1 + math.e) * 1e-6)
    assert convert(1.0, 1e-6, 0.3, 1) == (1.0, 1e-6, 0.3)
    assert convert(800.0, 1e-9, 1.0, 2)[1] == 1.0
    assert convert(0.5, 0.6, 0.1, 2)[1] == 1.0
    table = {(a, b): factor(a, b) for a in RELATIONS for b in RELATIONS}
    assert table == {
        ("add/remove", "add/remove"): 1, ("add/remove", "replace"): 2, ("add/remove", "values"): 2,
        ("replace", "add/remove"): None, ("replace", "replace"): 1, ("replace", "values"): 1,
        ("values", "add/remove"): None, ("values", "replace"): None, ("values", "values"): 1}


@pytest.mark.parametrize("relation", RELATIONS)
def test_single_relation_plans_are_reported_as_before(relation):
    # One relation: one report per unit under it, the budget applying to it by default.
    a = rel_entry("a", 0.25, relation)
    b = rel_entry("b", 0.5, relation, unit="user", max_contributions=2)
    event, user = check_budget([a, b], Budget(epsilon=1.0))
    assert (event.relation, user.relation) == (relation, relation)
    assert event.epsilon == pytest.approx(0.75) and user.epsilon == pytest.approx(0.5 + 2 * 0.25)
    assert event.within_budget and event.budget_epsilon == 1.0
    assert "counted twice" not in event.note + user.note
    with pytest.raises(ValueError, match="budget exceeded"):
        check_budget([a, b], Budget(epsilon=0.7))
    # An add/remove budget over replace or values charges alone is refused.
    if relation != "add/remove":
        with pytest.raises(ValueError, match="no 'add/remove' bound"):
            check_budget([a, b], Budget(epsilon=1.0, relation="add/remove"))


def test_add_remove_plan_under_a_stricter_budget_relation_reports_both():
    a, b = entry("a", 0.25), entry("b", 0.5)
    assert [r.relation for r in compose([a, b])] == ["add/remove"]
    reports = check_budget([a, b], Budget(epsilon=1.5, relation="values"))
    assert [(r.relation, r.epsilon, r.budget_epsilon) for r in reports] == [
        ("add/remove", pytest.approx(0.75), None), ("values", pytest.approx(1.5), 1.5)]
    with pytest.raises(ValueError, match="budget exceeded .*'replace'"):
        check_budget([a, b], Budget(epsilon=1.0, relation="replace"))


def test_group_privacy_applies_within_each_relation_before_the_conversion():
    mean = rel_entry("mean", 0.5, "values", unit="user")
    hourly = rel_entry("hourly", 0.1, "add/remove")
    totals = by_total(compose([mean, hourly], events_per_user=4))
    # A user's 4 events, each counted twice under values neighbours.
    assert totals["user", "values"].epsilon == pytest.approx(0.5 + 2 * 4 * 0.1)
    assert totals["user", "values"].rho == pytest.approx(0.125 + 4 * 16 * 0.005)
    assert "group privacy over at most 4 events" in totals["user", "values"].note
    assert totals["event", "values"].epsilon == pytest.approx(0.5 + 2 * 0.1)
    # Unbounded for both reasons: the relation note comes first, then the group one.
    user = by_total(compose([mean, hourly]))["user", "values"]
    assert user.epsilon is None and "declared number of events per user" in user.note
    user = by_total(compose([mean, hourly]))["user", "add/remove"]
    assert user.note.startswith("no 'add/remove' bound")
    erm = rel_entry("erm", 0.2, "replace")
    users = rel_entry("users", 0.3, "add/remove", unit="user", max_contributions=5)
    replaced = by_total(compose([erm, users]))["user", "replace"]
    assert replaced.epsilon == pytest.approx(2 * 0.3 + 5 * 0.2)
    assert "keeps their number of events" in replaced.note


def test_relations_are_validated():
    with pytest.raises(ValueError, match="relation"):
        compose([entry("a", 0.5)._replace(relation="swap")])
    with pytest.raises(ValueError, match="two neighbour relations"):
        compose([entry("a", 0.5, key="x", scope="key"),
                 entry("a", 0.5, key="y", scope="key")._replace(relation="replace")])


@pytest.mark.parametrize("relation", ["swap", "", 1, "Add/Remove"])
def test_budget_relation_validation(relation):
    with pytest.raises(ValueError, match="relation"):
        Budget(epsilon=1.0, relation=relation)


def test_budget_signature_is_unchanged_and_relation_is_keyword_only():
    assert repr(Budget(1.0, 1e-6)) == "Budget(epsilon=1.0, delta=1e-06)"
    assert Budget(1.0).relation is None
    assert repr(Budget(rho=0.5, relation="values")) == "Budget(rho=0.5, relation='values')"
    with pytest.raises(TypeError):
        Budget(1.0, 0.0, None, "replace")


def test_schema_version_2_round_trips_through_json():
    import json

    from dp_beam.records import SCHEMA_VERSION, AccountingReport, to_json

    assert SCHEMA_VERSION == 2
    e = rel_entry("erm", 0.5, "replace", key="AA")
    line = json.loads(json.dumps(to_json(e)))
    assert (line["record"], line["version"], line["relation"]) == ("LedgerEntry", 2, "replace")
    back = LedgerEntry(**{k: v for k, v in line.items() if k in LedgerEntry._fields})
    assert back == e
    # A version-1 line has no relation: it was written for add/remove charges.
    old = {k: v for k, v in to_json(entry("a", 0.5)).items() if k != "relation"}
    old["version"] = 1
    v1 = LedgerEntry(**{k: v for k, v in old.items() if k in LedgerEntry._fields})
    assert v1.relation == "add/remove"
    (_, report) = compose([e, entry("count", 0.5)])
    out = json.loads(json.dumps(to_json(report)))
    assert out["record"] == "AccountingReport" and out["version"] == 2
    assert out["relation"] == "replace" and out["epsilon"] == pytest.approx(1.5)
    assert list(out) == ["record", *AccountingReport._fields]
    assert AccountingReport._fields[-1] == "relation" and LedgerEntry._fields[-1] == "relation"


def test_budget_check_refuses_a_user_total_without_a_group_size():
    plan = [entry("hourly", 0.25), entry("users", 0.25, unit="user")]
    with pytest.raises(ValueError, match=r"user-level total of this plan is unbounded: "
                                         r"user-level transforms 'users' .* event-level "
                                         r"transforms 'hourly' .*events_per_user=N"):
        check_budget(plan, Budget(epsilon=10.0))
    # Declared: the same plan passes, the hourly charge counted for 3 events.
    (_, user) = check_budget(plan, Budget(epsilon=10.0), events_per_user=3)
    assert user.epsilon == pytest.approx(1.0) and "declared events_per_user" in user.note


def test_user_total_notes_what_group_privacy_assumes_of_replace_transforms():
    erm = rel_entry("erm", 0.5, "replace")
    users = rel_entry("users", 0.5, "replace", unit="user", max_contributions=2)
    (_, user) = compose([erm, users])
    assert user.relation == "replace" and user.epsilon == pytest.approx(1.5)
    assert "the largest per-user cap of the user-level transforms" in user.note
    assert "replacing a user keeps their number of events" in user.note
    # Blocked under add/remove: the relation note alone says why, no group-privacy note.
    reports = by_total(compose([erm, rel_entry("c", 0.5, "add/remove", unit="user",
                                               max_contributions=2)]))
    assert "group privacy" not in reports["user", "add/remove"].note
    assert "group privacy over at most 2 events" in reports["user", "replace"].note
