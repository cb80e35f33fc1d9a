"""Argument checks shared by the noise sources, the mechanisms and budgets (checks.py)."""

import numpy as np
import pytest

from dp_beam.mechanisms.checks import (
    check_delta,
    check_epsilon,
    check_int,
    check_nonnegative,
    check_probability,
    check_real,
    check_scale,
    check_size,
    check_step_index,
)


def test_check_scale_returns_a_float():
    assert check_scale("scale", 2) == 2.0 and type(check_scale("scale", 2)) is float
    assert check_scale("sigma", np.float32(0.5)) == 0.5
    assert check_scale("scale", "1.5") == 1.5  # anything float() takes
    assert check_scale("scale", 0) == 0.0


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), None, "x", [1.0]])
def test_check_scale_names_the_argument(value):
    with pytest.raises(ValueError, match=r"^sigma must be a finite number >= 0, got "):
        check_scale("sigma", value)


def test_check_size_and_step_index_return_ints():
    assert check_size(0) == 0 and type(check_size(np.int64(3))) is int
    assert check_step_index(1) == 1 and type(check_step_index(np.int32(7))) is int


@pytest.mark.parametrize("value", [-1, True, 1.0, "2", None])
def test_check_size_refuses_non_ints_and_negatives(value):
    with pytest.raises(ValueError, match=rf"^size must be an int >= 0, got {value!r}$"):
        check_size(value)


@pytest.mark.parametrize("value", [0, -2, True, 1.0, None])
def test_check_step_index_refuses_steps_below_one(value):
    with pytest.raises(ValueError, match=rf"^t must be an int >= 1, got {value!r}$"):
        check_step_index(value)


def test_the_mechanisms_use_them():
    from dp_beam.mechanisms import BinaryTreeMechanism, SeededNoise

    with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
        SeededNoise(0).laplace(-1.0, 2)
    with pytest.raises(ValueError, match="size must be an int >= 0"):
        SeededNoise(0).gaussian(1.0, -1)
    tree = BinaryTreeMechanism(epsilon=1.0, sensitivity=1.0, horizon=8, rng=SeededNoise(0))
    with pytest.raises(ValueError, match="t must be an int >= 1, got 0"):
        tree.noise_scales(0)


# -- the parameter validators of the ERM, regression, growing and budget code -------------------


def test_check_real_returns_a_float():
    assert check_real("lam", 2) == 2.0 and type(check_real("lam", np.float32(0.5))) is float
    assert check_real("c", 0, nonnegative=True, at_most=1.0) == 0.0
    assert check_real("bound", float("inf"), positive=True, finite=False) == float("inf")


@pytest.mark.parametrize("value, options, message", [
    (True, {}, "lam must be a real number, got True"),
    ("1", {}, "lam must be a real number, got '1'"),
    (None, {}, "lam must be a real number, got None"),
    (float("nan"), {}, "lam must be finite, got nan"),
    (float("inf"), {"positive": True}, "lam must be finite, got inf"),
    (0.0, {"positive": True}, "lam must be > 0, got 0.0"),
    (-1, {"nonnegative": True}, "lam must be >= 0, got -1.0"),
    (1.0, {"unit_interval": True}, "lam must be in (0, 1), got 1.0"),
    (1.0, {"below": 1.0}, "lam must be < 1, got 1.0"),
    (1.5, {"at_most": 1.0}, "lam must be <= 1, got 1.5"),
    (0.5, {"below": 0.3678}, "lam must be < 0.3678, got 0.5"),
])
def test_check_real_names_the_argument_and_the_failed_condition(value, options, message):
    with pytest.raises(ValueError) as err:
        check_real("lam", value, **options)
    assert str(err.value) == message


def test_check_int_minimum_and_optional():
    assert check_int("n", 1) == 1 and type(check_int("n", np.int64(3))) is int
    assert check_int("count", 0, 0) == 0
    assert check_int("tau", None, optional=True) is None
    for value, options, message in [
        (0, {}, "n must be an int >= 1, got 0"),
        (True, {}, "n must be an int >= 1, got True"),
        (2.0, {"minimum": 2}, "n must be an int >= 2, got 2.0"),
        (None, {}, "n must be an int >= 1, got None"),
        (0, {"optional": True}, "n must be an int >= 1 or None, got 0"),
    ]:
        with pytest.raises(ValueError) as err:
            check_int("n", value, **options)
        assert str(err.value) == message


def test_probability_epsilon_and_delta():
    assert check_probability("beta", 0.05) == 0.05
    assert check_epsilon(2) == 2.0 and check_epsilon(1, name="epsilon_box") == 1.0
    assert check_delta(1e-6) == 1e-6
    with pytest.raises(ValueError, match=r"^beta must be in \(0, 1\), got 0\.0$"):
        check_probability("beta", 0.0)
    with pytest.raises(ValueError, match=r"^epsilon must be > 0, got -1\.0$"):
        check_epsilon(-1)
    with pytest.raises(ValueError, match=r"^epsilon_box must be > 0"):
        check_epsilon(0, name="epsilon_box")
    with pytest.raises(ValueError, match=r"^delta must be in \(0, 1\): .*got None$"):
        check_delta(None)
    with pytest.raises(ValueError, match=r"^delta must be in \(0, 1\), got 1\.0$"):
        check_delta(1.0)


def test_check_nonnegative_takes_python_numbers_only():
    assert check_nonnegative("rho", 0) == 0.0 and check_nonnegative("rho", None, optional=True) is None
    for value, message in [(None, "rho must be a number, got None"),
                           (True, "rho must be a number, got True"),
                           (np.float32(1.0), "rho must be a number, got "),
                           (-0.5, "rho must be finite and >= 0, got -0.5"),
                           (float("inf"), "rho must be finite and >= 0, got inf")]:
        with pytest.raises(ValueError) as err:
            check_nonnegative("rho", value)
        assert str(err.value).startswith(message)


def test_the_parameter_families_use_the_shared_validators():
    from dp_beam.accounting.budget import Budget
    from dp_beam.mechanisms.erm import LogisticLoss
    from dp_beam.mechanisms.growing import PMWGParams
    from dp_beam.mechanisms.regression import PrivIncReg1Params

    with pytest.raises(ValueError, match=r"^n_features must be an int >= 1, got 0$"):
        LogisticLoss(0, [0, 1], 1.0)
    with pytest.raises(ValueError, match=r"^beta must be in \(0, 1\), got 2\.0$"):
        PMWGParams(epsilon=1.0, alpha=0.5, n=10, universe_size=4, beta=2.0)
    with pytest.raises(ValueError, match=r"^delta must be in \(0, 1\): the mechanisms use Gaussian"):
        PrivIncReg1Params(dim=2, epsilon=1.0, delta=None, horizon=4)
    with pytest.raises(ValueError, match=r"^rho must be finite and >= 0, got -1\.0$"):
        Budget(rho=-1.0)
