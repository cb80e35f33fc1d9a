"""Mechanism registry and participation sensitivity (dp_beam.mechanisms.counting.registry)."""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import (
    MECHANISMS,
    ZeroNoise,
    get_mechanism,
    participation_norm,
    participation_sensitivity,
)

from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

from ..participation_helpers import brute_force_norm, patterns
from .cpu_kernels import fingerprint, outputs_under_kernels, stream_releases


def test_registry_names_match_classes():
    assert set(MECHANISMS) == {"tree", "honaker", "smooth_binary", "blt", "sqrt_toeplitz"}
    for name, cls in MECHANISMS.items():
        assert cls.name == name and get_mechanism(name) is cls
        mech = cls(1.0, horizon=16, noise="gaussian", delta=1e-6, rng=ZeroNoise())
        assert mech.step(2.0) == 2.0 and mech.t == 1
        for method in ("noise_std", "ci_halfwidth", "privacy_cost", "state_size", "to_state", "from_state"):
            assert callable(getattr(mech, method))


@pytest.mark.parametrize("bad", ["binary", None, 3])
def test_get_mechanism_names_the_parameter(bad):
    with pytest.raises(ValueError, match="mechanism"):
        get_mechanism(bad)


def tree_right_factor(horizon):
    """The p-sum nodes of tree.py: one node per step, at level ν2(t)."""
    rows = []
    for t in range(1, horizon + 1):
        level = (t & -t).bit_length() - 1
        row = np.zeros(horizon)
        row[t - (1 << level):t] = 1.0
        rows.append(row)
    return np.array(rows)


@pytest.mark.parametrize("horizon,k,b", [(8, 3, 1), (12, 3, 2), (13, 4, 3)])
def test_tree_participation_is_an_upper_bound(horizon, k, b):
    assert participation_norm("tree", horizon, k, b) >= brute_force_norm(tree_right_factor(horizon), k, b) - 1e-12


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_multiplier_is_between_1_and_k(name):
    laplace = getattr(MECHANISMS[name], "LAPLACE", True)
    noises = ("laplace", "gaussian") if laplace else ("gaussian",)
    for noise in noises:
        for k, b in ((1, 1), (4, 1), (4, 50)):
            mult = participation_sensitivity(name, 1024, k, b, noise=noise)
            assert 1.0 - 1e-12 <= mult <= k + 1e-12
        assert participation_sensitivity(name, 1024, 1, 7, noise=noise) == pytest.approx(1.0)
        assert participation_sensitivity(name, None, 5, 3, noise=noise) == 5.0


def _l1_right_factor(name, horizon):
    if name == "tree":
        return tree_right_factor(horizon), horizon.bit_length()
    cls = get_mechanism(name)
    return cls.right_factor(horizon), cls._plan(horizon).l1


@pytest.mark.parametrize("name", ["tree", "honaker", "smooth_binary"])
@pytest.mark.parametrize("horizon,k,b", [(8, 3, 1), (12, 3, 2), (13, 4, 3), (9, 4, 4)])
def test_laplace_multiplier_covers_the_l1_participation_norm(name, horizon, k, b):
    # Laplace noise is calibrated to the L1 column norm: the multiplier must cover
    # max_P ||sum_P R[:, s]||_1 / l1, which for these 0/1 factors is the pattern size.
    right, l1 = _l1_right_factor(name, horizon)
    assert np.abs(right).sum(axis=0).max() <= l1 + 1e-12
    worst = max(np.abs(right[:, p].sum(axis=1)).sum() for p in patterns(horizon, k, b))
    mult = participation_sensitivity(name, horizon, k, b, noise="laplace")
    assert mult * l1 >= worst - 1e-12
    assert mult == min(k, (horizon - 1) // b + 1)


def test_laplace_tree_multiplier_is_the_l1_one_not_the_l2_one():
    # Tree, T = 1024, 4 participations: the L2 ratio is 3.77, but Laplace noise is
    # calibrated in L1 where the four columns add up to 4 x levels.
    assert participation_sensitivity("tree", 1024, 4, 1) == 4.0
    assert participation_sensitivity("tree", 1024, 4, 1, noise="laplace") == 4.0
    assert participation_sensitivity("tree", 1024, 4, 1, noise="gaussian") == pytest.approx(
        math.sqrt(156 / 11))
    # A Laplace tree calibrated through the multiplier has k times the noise of one step.
    mech = get_mechanism("tree")(1.0, sensitivity=4.0, horizon=1024, rng=ZeroNoise())
    plain = get_mechanism("tree")(1.0, horizon=1024, rng=ZeroNoise())
    assert mech.noise_std(10) == pytest.approx(4 * plain.noise_std(10))


@pytest.mark.parametrize("name", ["blt", "sqrt_toeplitz"])
def test_laplace_multiplier_is_refused_where_laplace_is_not_offered(name):
    with pytest.raises(ValueError, match="noise"):
        participation_sensitivity(name, 1024, 4, 1)
    with pytest.raises(ValueError, match="noise"):
        participation_sensitivity("tree", 1024, 4, 1, noise="uniform")


def test_multiplier_calibrates_through_sensitivity():
    mult = participation_sensitivity("blt", 1024, 4, 256, noise="gaussian")
    cls = get_mechanism("blt")
    mech = cls(1.0, sensitivity=mult, horizon=1024, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    plain = cls(1.0, horizon=1024, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    assert mech.noise_std(10) == pytest.approx(mult * plain.noise_std(10))
    assert mult * cls._plan(1024).l2 == pytest.approx(participation_norm("blt", 1024, 4, 256))
    assert mult < 4 / math.sqrt(2)  # correlated noise pays far less than k for spread-out steps


@pytest.mark.parametrize("kwargs,name", [(dict(k=0), "k"), (dict(b=0), "b"), (dict(k=1.5), "k"), (dict(horizon=0), "horizon")])
def test_participation_validation(kwargs, name):
    args = dict(mechanism_name="blt", horizon=64, k=2, b=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        participation_sensitivity(**args, noise="gaussian")


@pytest.mark.parametrize("noise, horizon", [("laplace", None), ("laplace", 2000),
                                            ("gaussian", None), ("gaussian", 2000)])
def test_default_mechanism_is_the_most_accurate_for_the_configuration(noise, horizon):
    from dp_beam.mechanisms import ZeroNoise
    from dp_beam.mechanisms.counting.registry import MECHANISMS, default_mechanism

    delta = 1e-6 if noise == "gaussian" else None
    worst = {}
    for name, cls in MECHANISMS.items():
        try:
            m = cls(epsilon=1.0, horizon=horizon, noise=noise, delta=delta, rng=ZeroNoise())
        except ValueError:  # the mechanism does not support this noise family
            continue
        worst[name] = max(m.noise_std(t) for t in range(1, (horizon or 2000) + 1))
    best = min(worst.values())
    chosen = default_mechanism(noise, horizon)
    if (noise, horizon) == ("laplace", None):
        # Honaker is more accurate here but its exact per-step interval is
        # costly (see default_mechanism); the tree is the documented default.
        assert chosen == "tree" and min(worst, key=worst.get) == "honaker"
        return
    # Ties (BLT and the square-root factorisation coincide closely) are allowed.
    assert worst[chosen] <= best * 1.01


def _releases(name):
    """SHA-256 of the exact bits of keyed streams of mechanism ``name``: Laplace (where it is
    offered) and Gaussian noise, a scalar and a vector stream with a horizon, and an
    unbounded one (epochs of 1, 2, 4, … steps)."""
    cls = get_mechanism(name)
    key = NoiseKey.from_bytes(bytes(range(32)))
    out = []
    for noise, delta in (("laplace", None), ("gaussian", 1e-6)):
        if noise == "laplace" and not getattr(cls, "LAPLACE", True):  # the tree has no flag
            continue
        for dim, horizon, steps in ((1, 1024, 300), (7, 256, 200), (2, None, 300)):
            mech = cls(1.0, sensitivity=1.5, horizon=horizon, noise=noise, delta=delta, dim=dim,
                       rng=KeyedNoise(key, (name, noise, dim)))
            out.extend(stream_releases(mech, dim, steps))
    return fingerprint(out)


@pytest.mark.slow
def test_every_mechanism_releases_the_same_bits_under_every_cpu_kernel():
    """A replay on a worker with another CPU releases the same values. √Toeplitz failed this
    while its release was a BLAS product (each of three OpenBLAS kernels gave other bits),
    BLT while its float recurrence was one."""
    snippet = ("from tests.mechanisms.counting import test_registry as t\n"
               f"print([t._releases(name) for name in {sorted(MECHANISMS)!r}])\n")
    assert len(outputs_under_kernels(snippet)) == 1
