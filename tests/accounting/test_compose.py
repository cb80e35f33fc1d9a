"""Budgets and composition of ledger entries (spec §4 R2, R3)."""

import numpy as np
import pytest

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
