"""Exact Laplace release intervals (dp_beam.mechanisms.counting.intervals)."""

import pytest

from dp_beam.mechanisms import laplace_sum_halfwidth
from dp_beam.mechanisms import halfwidths as noise_module  # private reference routine under test
from dp_beam.mechanisms.counting.intervals import laplace_combination_halfwidth, laplace_release_halfwidth
from dp_beam.mechanisms.counting.tree import BinaryTreeMechanism


def _reference(scales, level):
    """The numerical (Gil-Pelaez) half-width, bypassing the closed form."""
    bmax = max(scales)
    return bmax * noise_module._numerical_halfwidth(tuple(sorted(round(s / bmax, 12) for s in scales)), level)


@pytest.mark.parametrize("horizon", [72, None])
def test_tree_release_halfwidths_match_the_numerical_reference(horizon):
    # One pattern per popcount (bounded) or per (epoch, popcount) (unbounded,
    # unequal scales). Tolerance 2e-10: the numerical reference's own error
    # at 95 % (see tests/mechanisms/test_noise.py, _reference_tolerance).
    mech = BinaryTreeMechanism(1.0, horizon=horizon)
    patterns = {tuple(mech.noise_scales(t)) for t in [1, 3, 7, 15, 31, 63, 100, 255, 1000, 4095]
                if horizon is None or t <= horizon}
    for scales in patterns:
        got = laplace_release_halfwidth(scales, 0.95)
        assert got == laplace_sum_halfwidth(scales, 0.95)
        assert got == pytest.approx(_reference(scales, 0.95), rel=2e-10, abs=0)


def test_combination_below_the_multiplicity_path_is_the_expanded_sum():
    assert laplace_combination_halfwidth([1.0, 0.5], [5, 3], 0.9) == laplace_sum_halfwidth([1.0] * 5 + [0.5] * 3, 0.9)
    assert laplace_combination_halfwidth([0.5, 0.5, 0.0], [1, 2, 4]) == laplace_sum_halfwidth([0.5] * 3)
    with pytest.raises(ValueError, match="level"):
        laplace_combination_halfwidth([1.0], [1], 1.0)
