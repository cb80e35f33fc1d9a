"""Argument checks shared by the noise sources and mechanisms (checks.py)."""

import numpy as np
import pytest

from dp_beam.mechanisms.checks import check_scale, check_size, check_step_index


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
