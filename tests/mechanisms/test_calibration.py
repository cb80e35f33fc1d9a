"""Privacy calibration (dp_beam.mechanisms.calibration, spec §1.2)."""

import math

import dp_accounting
import pytest

from dp_beam.accounting.costs import zcdp_to_epsilon_classic
from dp_beam.mechanisms import (
    eps_from_rho_delta,
    gaussian_sigma,
    laplace_scale,
    rho_from_eps,
    rho_from_eps_delta,
)


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-6), (0.1, 1e-9), (8.0, 1e-3), (1e-4, 0.5)])
def test_rho_solves_the_conversion_equation(epsilon, delta):
    rho = rho_from_eps_delta(epsilon, delta)
    log_term = math.log(1 / delta)
    assert rho + 2 * math.sqrt(rho * log_term) == pytest.approx(epsilon, rel=1e-12)
    # Difference form of spec §1.2 (a), independent of the implementation's form.
    assert math.sqrt(rho) == pytest.approx(math.sqrt(log_term + epsilon) - math.sqrt(log_term), rel=1e-9)
    assert eps_from_rho_delta(rho, delta) == pytest.approx(epsilon, rel=1e-12)


def test_known_values():
    # ε = 1, δ = 1e-6: √ρ = √(ln 1e6 + 1) − √(ln 1e6).
    expected_rho = (math.sqrt(math.log(1e6) + 1) - math.sqrt(math.log(1e6))) ** 2
    assert rho_from_eps_delta(1.0, 1e-6) == pytest.approx(expected_rho, rel=1e-12)
    assert rho_from_eps_delta(1.0, 1e-6) == pytest.approx(0.0174689, rel=1e-5)
    assert eps_from_rho_delta(0.5, math.exp(-2)) == pytest.approx(0.5 + 2 * math.sqrt(1.0), rel=1e-12)
    assert rho_from_eps(2.0) == 2.0


def test_zcdp_sigma_formula():
    rho = rho_from_eps_delta(1.0, 1e-6)
    assert gaussian_sigma(1.0, 1.0, 1e-6, "zcdp") == pytest.approx(1 / math.sqrt(2 * rho), rel=1e-12)
    assert gaussian_sigma(3.0, 1.0, 1e-6) == pytest.approx(3 / math.sqrt(2 * rho), rel=1e-12)
    assert gaussian_sigma(1.0, 1.0, 1e-6) == pytest.approx(5.35, abs=0.01)
    assert gaussian_sigma(0.0, 1.0, 1e-6) == 0.0


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-8)])
def test_analytic_sigma_is_exact_and_smaller(epsilon, delta):
    analytic = gaussian_sigma(2.0, epsilon, delta, "analytic")
    zcdp = gaussian_sigma(2.0, epsilon, delta, "zcdp")
    assert analytic < zcdp
    # Sensitivity 2 scales σ by 2; at unit sensitivity the mechanism is exactly
    # (ε, δ)-DP per the independent epsilon-from-sigma routine.
    assert dp_accounting.get_epsilon_gaussian(analytic / 2.0, delta) == pytest.approx(epsilon, rel=1e-6)
    if epsilon < 1:
        classical = 2.0 * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
        assert analytic <= classical


def test_laplace_scale():
    assert laplace_scale(10.0, 1.0) == 10.0
    assert laplace_scale(224.0, 1.0) == 224.0
    assert laplace_scale(3.0, 0.5) == 6.0
    assert laplace_scale(0.0, 0.5) == 0.0


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: rho_from_eps_delta(-1.0, 1e-6), "epsilon"),
        (lambda: rho_from_eps_delta(0.0, 1e-6), "epsilon"),
        (lambda: rho_from_eps_delta(float("inf"), 1e-6), "epsilon"),
        (lambda: rho_from_eps_delta(1.0, 0.0), "delta"),
        (lambda: rho_from_eps_delta(1.0, 1.0), "delta"),
        (lambda: rho_from_eps_delta(1.0, None), "delta"),
        (lambda: eps_from_rho_delta(-0.1, 1e-6), "rho"),
        (lambda: eps_from_rho_delta(0.1, 2.0), "delta"),
        (lambda: gaussian_sigma(-1.0, 1.0, 1e-6), "l2_sensitivity"),
        (lambda: gaussian_sigma(1.0, 0.0, 1e-6), "epsilon"),
        (lambda: gaussian_sigma(1.0, 1.0, 1e-6, "classical"), "calibration"),
        (lambda: laplace_scale(-1.0, 1.0), "l1_sensitivity"),
        (lambda: laplace_scale(1.0, -1.0), "epsilon"),
        (lambda: laplace_scale(1.0, True), "epsilon"),
        (lambda: rho_from_eps(float("nan")), "epsilon"),
    ],
)
def test_validation_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_error_message_shows_the_value():
    with pytest.raises(ValueError, match=r"epsilon must be > 0, got -1"):
        laplace_scale(1.0, -1)


def test_eps_from_rho_delta_is_the_accountants_conversion():
    # One ρ → ε formula: the accountant's classic conversion, the same float as the
    # closed form the module wrote before, over a grid of ρ and δ.
    for rho in [0.0, 1e-12, 1e-6, 1e-3, 0.0174689048, 0.1, 0.5, 1.0, 3.7, 50.0, 1e4]:
        for delta in [1e-15, 1e-9, 1e-6, 1e-3, 0.1, 0.5, 0.999]:
            closed_form = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
            assert eps_from_rho_delta(rho, delta) == zcdp_to_epsilon_classic(rho, delta) == closed_form
