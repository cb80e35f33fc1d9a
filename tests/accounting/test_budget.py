"""Privacy budgets (budget.py): what a budget admits, and the arguments it refuses."""

import pytest

from dp_beam.accounting import Budget


def test_pure_budget_admits_pure_costs_up_to_float_noise_only():
    budget = Budget(epsilon=1.0)
    assert budget.admits(0.1 + 0.2 + 0.7, 0.0, None)  # 1.0000000000000002
    assert not budget.admits(1.001, 0.0, None)
    assert not budget.admits(0.5, 1e-9, None)  # δ = 0 admits no δ
    assert not budget.admits(None, 0.0, None)  # an unbounded cost never fits


def test_approximate_and_zcdp_parts_must_all_hold():
    budget = Budget(epsilon=2.0, delta=1e-6, rho=0.5)
    assert budget.admits(2.0, 1e-6, 0.5)
    assert not budget.admits(2.0, 2e-6, 0.5)
    assert not budget.admits(2.0, 1e-6, 0.6)
    assert not budget.admits(2.0, 1e-6, None)
    rho_only = Budget(rho=0.5)
    assert rho_only.admits(None, None, 0.5) and not rho_only.admits(0.1, 0.0, 0.51)


def test_repr_shows_the_parts_given():
    assert repr(Budget(epsilon=1)) == "Budget(epsilon=1.0, delta=0.0)"
    assert repr(Budget(rho=0.25, relation="values")) == "Budget(rho=0.25, relation='values')"


@pytest.mark.parametrize("kwargs, message", [
    ({}, "Budget needs epsilon or rho"),
    ({"epsilon": 0}, "epsilon must be > 0"),
    ({"epsilon": -1.0}, "epsilon must be finite and >= 0, got -1.0"),
    ({"epsilon": float("inf")}, "epsilon must be finite and >= 0, got inf"),
    ({"epsilon": True}, "epsilon must be a number, got True"),
    ({"epsilon": "1"}, "epsilon must be a number, got '1'"),
    ({"epsilon": 1.0, "delta": None}, "delta must be a number, got None"),
    ({"epsilon": 1.0, "delta": 1.0}, "delta must be < 1, got 1.0"),
    ({"rho": float("nan")}, "rho must be finite and >= 0, got nan"),
    ({"epsilon": 1.0, "relation": "swap"}, "relation must be one of"),
])
def test_refused_arguments(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Budget(**kwargs)
