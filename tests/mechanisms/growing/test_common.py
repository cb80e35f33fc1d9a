"""Shared growing-database functions (dp_beam.mechanisms.growing.common): epoch times, γ and the
cost of a run; properties 1 and 5 of spec growing_databases.md §7.

"Exact" means within 1e-9 relative error. Statistical tests use fixed seeds, so they are
deterministic; their tolerances are derived from the sampling distribution and stated next to
each, so a correct implementation passes for almost every seed, and the planted bugs show that
the tests can fail.
"""

import math
from fractions import Fraction

from dp_beam.mechanisms.growing import (
    BBImprover,
    BBScheduler,
    BBSchedulerParams,
    EpochTimes,
    LaplaceG,
    LaplaceHistogram,
    PMWGParams,
    epoch_times,
    rho_star,
)
from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms.calibration import rho_from_eps
from dp_beam.mechanisms.growing.common import growing_cost

from .helpers import close


def test_1_epoch_times_are_exact_ceilings():
    assert EpochTimes(1000, Fraction(1, 10)).first(8) == [1000, 1100, 1210, 1331, 1465, 1611, 1772, 1949]
    assert EpochTimes(100, Fraction(1, 4)).first(8) == [100, 125, 157, 196, 245, 306, 382, 477]
    assert math.ceil(1000 * 1.1 ** 2) == 1211          # the floating-point trap
    assert BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, gamma=0.1).epoch_time(2) == 1210
    assert epoch_times(1000, 0.1, 3)[2] != 1211
    # The decimal path for large i agrees with exact powers (also at integer values).
    for n, gamma in ((1000, Fraction(1, 10)), (7, Fraction(3, 7)), (1 << 20, Fraction(1, 2))):
        times = EpochTimes(n, gamma)
        for i in (65, 80, 137):
            v = n * (1 + gamma) ** i
            assert times(i) == -((-v.numerator) // v.denominator)
    assert EpochTimes(1000, Fraction(1, 10)).epoch_of(1209) == 1


def test_5_gamma_formula():
    pure = BBSchedulerParams(epsilon=1.0, n=10 ** 6, p=3, g=1, beta=0.05)
    approx = BBSchedulerParams(epsilon=1.0, n=10 ** 6, p=3, g=1, beta=0.05, delta=1e-6)
    assert round(pure.gamma_formula, 10) == 0.0819179155
    assert round(approx.gamma_formula, 10) == 0.0900532209
    assert close(pure.gamma, pure.gamma_formula, 1e-11)          # rounded to 12 digits
    assert BBSchedulerParams(epsilon=0.01, n=10, p=3, g=1e6).gamma == 1.0


def test_growing_costs():
    # ρ = ε²/2 (rho_from_eps; for ε = 0.1 the same float as 0.5·ε**2).
    eps = 0.1
    assert growing_cost(eps, 0.0).rho == 0.5 * eps ** 2
    assert growing_cost(1.0, 1e-6) == {"epsilon": 1.0, "delta": 1e-6, "rho": rho_star(1.0, 1e-6)}
    assert growing_cost(1.0, 0.0, 0.3) == {"epsilon": 1.0, "delta": 0.0, "rho": 0.15}
    box = LaplaceHistogram(4)
    for cost in [BBScheduler(box, epsilon=1.0, n=10).privacy_cost(),
                 BBImprover(box, epsilon=1.0, delta=1e-6, n=10).privacy_cost(),
                 PMWGParams(epsilon=1.0, alpha=0.3, n=50, universe_size=4).privacy_cost(),
                 LaplaceG(epsilon=1.0, n=10).privacy_cost()]:
        assert isinstance(cost, Cost) and cost.epsilon == 1.0
    assert PMWGParams(epsilon=1.0, alpha=0.3, n=50, universe_size=4).privacy_cost() == {
        "epsilon": 1.0, "delta": 0.0, "rho": 0.5}


def test_a_pure_cost_converts_epsilon_to_rho_as_every_pure_cost_does():
    # One ε → ρ conversion: rho_from_eps, the one Cost.laplace agrees with.
    for eps in [1e-6, 0.01, 0.1, 0.3, 1.0, 1.7, 2.5, 10.0]:
        assert growing_cost(eps, 0.0).rho == rho_from_eps(eps) == Cost.laplace(eps).rho
