"""Budgets and composition of ledger entries (spec §4 R2, R3)."""

import pytest

import dp_beam as dpb
from dp_beam.accounting import Budget, check_budget, compose
from dp_beam.records import LedgerEntry


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
