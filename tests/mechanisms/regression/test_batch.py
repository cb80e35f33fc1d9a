"""PrivIncERM (dp_beam.mechanisms.regression.batch; spec §4.6).
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.regression import (
    PrivIncERM,
    PrivIncERMParams,
    advanced_composition,
    default_tau,
    per_run_budget,
)

from .helpers import unit_points


def test_privincerm_budget_table():
    eps_run, delta_run = per_run_budget(1.0, 1e-6, 100)
    assert eps_run == pytest.approx(0.0092820, abs=5e-8) and delta_run == pytest.approx(5e-9)
    total, total_delta = advanced_composition(eps_run, delta_run, 100, 0.5e-6)
    assert total == pytest.approx(0.517, abs=1e-3) and total <= 1.0
    assert total_delta == pytest.approx(1e-6)
    params = PrivIncERMParams(dim=3, epsilon=1.0, delta=1e-6, horizon=10_000, tau=100)
    assert params.runs == 100 and params.run_epsilon == pytest.approx(eps_run)
    cost = PrivIncERM(params, rng=ZeroNoise()).privacy_cost()
    assert cost["epsilon"] <= 1.0 and cost["delta"] <= 1e-6
    assert default_tau(3, 10_000, 1.0) == math.ceil(30_000 ** (1 / 3))


def test_privincerm_runs_exactly_at_multiples_of_tau_and_repeats_in_between():
    rng = np.random.default_rng(8)
    params = PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=40, tau=10)
    mech = PrivIncERM(params, rng=3)
    thetas, covers = [], []
    for t in range(1, 41):
        rel = mech.step_points(unit_points(rng, 5, 2), rng.uniform(-1, 1, 5))
        thetas.append(rel.theta)
        covers.append(rel.covers)
    assert covers[:9] == [(0, 0)] * 9 and all(not th.any() for th in thetas[:9])
    for j in range(1, 4):
        block = thetas[10 * j - 1: 10 * j + 9]
        assert covers[10 * j - 1] == (1, 10 * j)
        assert all(np.array_equal(th, block[0]) for th in block)
    assert len({tuple(th) for th in thetas}) == 5
    with pytest.raises(ValueError, match="horizon"):
        mech.step(np.zeros(3), np.zeros(2), 0)
