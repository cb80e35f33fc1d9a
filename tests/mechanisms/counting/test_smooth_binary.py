"""Smooth binary mechanism (dp_beam.mechanisms.counting.smooth_binary)."""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import SmoothBinaryMechanism, ZeroNoise
from dp_beam.mechanisms.counting.smooth_binary import smooth_binary_shape

from ..participation_helpers import brute_force_norm


@pytest.mark.parametrize("log2,h,k", [(10, 13, 5), (16, 19, 8), (20, 23, 10)])
def test_shape_and_max_std(log2, h, k):
    horizon = 1 << log2
    assert smooth_binary_shape(horizon) == (h, k)
    assert math.comb(h, k) >= horizon + 1
    plan = SmoothBinaryMechanism._plan(horizon)
    std = math.sqrt(SmoothBinaryMechanism._var_factor(plan, 1)) * plan.l2
    assert std == pytest.approx(math.sqrt(k * (h - k)))
    # Paper's choice k = h/2 (h even) gives 7 / 10 / 12; ours is never worse.
    paper = min(hh // 2 for hh in range(2, 40, 2) if math.comb(hh, hh // 2) >= horizon + 1)
    assert std <= paper
    assert {7: 10, 10: 16, 12: 20}[paper] == log2


def test_shape_minimises_the_variance():
    for horizon in (1, 2, 5, 30, 1000):
        h, k = smooth_binary_shape(horizon)
        best = min(kk * (hh - kk) for hh in range(2, 40) for kk in range(1, hh) if math.comb(hh, kk) >= horizon + 1)
        assert k * (h - k) == best


def test_leaves_have_k_ones_and_increase():
    leaves = SmoothBinaryMechanism.leaves(200)
    h, k = smooth_binary_shape(200)
    assert all(bin(leaf).count("1") == k for leaf in leaves)
    assert leaves == sorted(leaves) and leaves[-1] < 1 << h
    assert leaves == [v for v in range(1 << h) if bin(v).count("1") == k][:201]


def test_equal_error_at_every_step():
    mech = SmoothBinaryMechanism(1.0, horizon=500, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    stds = {mech.noise_std(t) for t in range(1, 501)}
    assert len(stds) == 1


@pytest.mark.parametrize("horizon", [1, 7, 1000, 2**16])
def test_state_size(horizon):
    mech = SmoothBinaryMechanism(1.0, horizon=horizon, dim=2, rng=ZeroNoise())
    assert mech.state_size() == smooth_binary_shape(horizon)[0] * 2


def test_one_draw_per_released_node():
    mech = SmoothBinaryMechanism(1.0, horizon=300, rng=ZeroNoise())
    total = []
    mech.noise_source.laplace = lambda scale, size: total.append(size) or np.zeros(size)
    for _ in range(300):
        mech.step(1.0)
    assert sum(total) == SmoothBinaryMechanism.right_factor(300).shape[0]


@pytest.mark.parametrize("horizon,k,b", [(10, 3, 1), (12, 2, 3), (14, 3, 2), (9, 4, 2)])
def test_participation_norm_vs_brute_force(horizon, k, b):
    right = SmoothBinaryMechanism.right_factor(horizon)
    exact = brute_force_norm(right, k, b)
    assert SmoothBinaryMechanism.participation_norm(horizon, k, b) >= exact - 1e-12
    assert SmoothBinaryMechanism.participation_norm(horizon, 1, b) == pytest.approx(brute_force_norm(right, 1, b))
