"""Shared behaviour of the factorisation mechanisms (dp_beam.mechanisms.counting.factorisation).

Every mechanism streams ``B (R x + z)``. The tests recover B from the
streaming code itself by feeding *basis noise* (the k-th noise vector drawn is
the k-th unit vector, in a run of dimension >= number of draws, so coordinate
k of release t is ``B[t, k]``) and check ``B R = A`` against each class's
declared right factor R, whose largest column norm is what the noise is
calibrated to. Statistical tests use ``dim = n`` independent runs at once;
tolerances are 5 standard errors of the estimator, derived where used.
"""

import json
import math
import pickle

import numpy as np
import pytest

from dp_beam.mechanisms import (
    BLTMechanism,
    HonakerTreeMechanism,
    NoiseSource,
    KeyedNoise,
    SeededNoise,
    SmoothBinaryMechanism,
    SqrtToeplitzMechanism,
    ZeroNoise,
    gaussian_sigma,
    laplace_sum_halfwidth,
)
from dp_beam.mechanisms.counting.factorisation import prefix_sum_lower_bound, prefix_sum_matrix
from dp_beam.mechanisms.counting.intervals import laplace_combination_halfwidth

CLASSES = [HonakerTreeMechanism, SmoothBinaryMechanism, BLTMechanism, SqrtToeplitzMechanism]
LAPLACE_CLASSES = [HonakerTreeMechanism, SmoothBinaryMechanism]
GAUSS = dict(noise="gaussian", delta=1e-6)


class BasisNoise(NoiseSource):
    """The k-th noise vector drawn is ``scale·e_k`` (unit vectors in draw order)."""

    def __init__(self, dim, scaled=False):
        self.dim = dim
        self.row = 0
        self.scaled = scaled

    def _basis(self, scale, size):
        rows = size // self.dim
        out = np.zeros((rows, self.dim))
        out[np.arange(rows), self.row + np.arange(rows)] = scale if self.scaled else 1.0
        self.row += rows
        return out.ravel()

    laplace = _basis
    gaussian = _basis


def left_factor(cls, horizon, n_draws, **kwargs):
    src = BasisNoise(n_draws, scaled=kwargs.pop("scaled", False))
    mech = cls(1.0, horizon=horizon, dim=n_draws, rng=src, **kwargs)
    rows = [mech.step(np.zeros(n_draws)) for _ in range(horizon)]
    return np.array(rows).reshape(horizon, n_draws), src.row, mech


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("horizon", [1, 2, 7, 16, 37])
def test_left_times_right_is_the_prefix_sum_matrix(cls, horizon):
    right = cls.right_factor(horizon)
    left, draws, mech = left_factor(cls, horizon, right.shape[0], **GAUSS)
    assert draws == right.shape[0]  # one noise per row of R, in R's row order
    np.testing.assert_allclose(left @ right, prefix_sum_matrix(horizon), atol=1e-12)
    plan = mech._plan_of(horizon)
    # The calibrated column norm is the true largest column norm of R.
    assert plan.l2 == pytest.approx(np.linalg.norm(right, axis=0).max(), rel=1e-12)
    for t in range(1, horizon + 1):
        assert cls._var_factor(plan, t) == pytest.approx((left[t - 1] ** 2).sum(), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("cls", LAPLACE_CLASSES)
def test_laplace_column_norm_is_l1_of_right_factor(cls):
    for horizon in (5, 16, 37):
        right = cls.right_factor(horizon)
        assert cls._plan(horizon).l1 == np.abs(right).sum(axis=0).max()


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("horizon", [40, None])
def test_noise_std_is_the_norm_of_the_scaled_left_row(cls, horizon):
    """Bounded and unbounded (epochs): noise_std(t)² = Σ_k (coefficient of draw k)²."""
    steps = 40
    src = BasisNoise(200, scaled=True)
    mech = cls(1.3, sensitivity=2.0, horizon=horizon, dim=200, rng=src, **GAUSS)
    left = np.array([mech.step(np.zeros(200)) for _ in range(steps)])
    assert src.row <= 200
    for t in (1, 2, 3, 7, 8, 15, 16, 31, 40):
        assert mech.noise_std(t) == pytest.approx(np.linalg.norm(left[t - 1]), rel=1e-9)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("horizon", [50, None])
@pytest.mark.parametrize("dim", [1, 3])
def test_zero_noise_releases_exact_prefix_sums(cls, horizon, dim):
    rng = np.random.default_rng(dim)
    n = 300 if horizon is None else horizon
    xs = rng.normal(size=(n, dim)) * 5
    mech = cls(1.0, horizon=horizon, dim=dim, rng=ZeroNoise(), **GAUSS)
    out = np.array([mech.step(x[0] if dim == 1 else x) for x in xs]).reshape(n, dim)
    np.testing.assert_allclose(out, np.cumsum(xs, axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(np.reshape(mech.current(), dim), out[-1])
    assert type(mech.current()) is (float if dim == 1 else np.ndarray)


@pytest.mark.parametrize("cls", CLASSES)
def test_gaussian_calibration_and_covariance(cls):
    """Empirical variance and covariance of releases vs scale²·B Bᵀ.

    With n i.i.d. Gaussian runs, the sample variance has SE σ²√(2/n) and the
    sample covariance of (X, Y) has SE √((σx²σy² + c²)/n); 5 SE each.
    """
    horizon, n = 24, 20000
    mech = cls(0.8, horizon=horizon, dim=n, rng=SeededNoise(11), **GAUSS)
    releases = np.array([mech.step(np.zeros(n)) for _ in range(horizon)])
    right = cls.right_factor(horizon)
    left, _, _ = left_factor(cls, horizon, right.shape[0], **GAUSS)
    scale = mech._scale(horizon)
    assert scale == pytest.approx(gaussian_sigma(mech._plan_of(horizon).l2, 0.8, 1e-6))
    cov = scale * scale * left @ left.T
    for t in (1, 5, 16, 24):
        assert mech.noise_std(t) ** 2 == pytest.approx(cov[t - 1, t - 1], rel=1e-9)
        var = releases[t - 1].var()
        assert abs(var - cov[t - 1, t - 1]) < 5 * cov[t - 1, t - 1] * math.sqrt(2 / n)
    for s, t in ((4, 5), (8, 16), (3, 24)):
        emp = np.mean(releases[s - 1] * releases[t - 1])
        se = math.sqrt((cov[s - 1, s - 1] * cov[t - 1, t - 1] + cov[s - 1, t - 1] ** 2) / n)
        assert abs(emp - cov[s - 1, t - 1]) < 5 * se


@pytest.mark.parametrize("cls", LAPLACE_CLASSES)
def test_laplace_calibration(cls):
    """Sample variance vs 2b²‖B_t‖²; Var(s²) ≈ (2σ⁴ + κ4)/n with κ4 = Σ a⁴·12b⁴."""
    horizon, n = 20, 20000
    mech = cls(0.7, horizon=horizon, dim=n, rng=SeededNoise(5))
    releases = np.array([mech.step(np.zeros(n)) for _ in range(horizon)])
    b = mech._scale(horizon)
    assert b == pytest.approx(mech._plan_of(horizon).l1 / 0.7)
    for t in (1, 7, 16, 20):
        terms = cls._laplace_terms(mech._plan_of(horizon), t)
        var = mech.noise_std(t) ** 2
        assert var == pytest.approx(sum(2 * (a * b) ** 2 * m for a, m in terms), rel=1e-12)
        kappa4 = sum(12 * (a * b) ** 4 * m for a, m in terms)
        assert abs(releases[t - 1].var() - var) < 5 * math.sqrt((2 * var * var + kappa4) / n)


@pytest.mark.parametrize("cls", LAPLACE_CLASSES)
def test_laplace_ci_matches_expanded_sum_and_covers(cls):
    mech = cls(1.0, horizon=64, dim=40000, rng=SeededNoise(3))
    releases = [mech.step(np.zeros(40000)) for _ in range(31)]
    b = mech._scale(64)
    for t in (3, 31):
        terms = cls._laplace_terms(mech._plan_of(64), t)
        expanded = [abs(a) * b for a, m in terms for _ in range(m)]
        width = mech.ci_halfwidth(t)
        assert width == pytest.approx(laplace_sum_halfwidth(expanded), rel=1e-6)
        # Coverage of 95 %: binomial SE √(.95·.05/n) ≈ 0.0011; 5 SE.
        assert abs(np.mean(np.abs(releases[t - 1]) <= width) - 0.95) < 0.0055


def test_combination_halfwidth_with_large_multiplicities():
    # 100 copies take the multiplicity path; it must agree with the expanded list.
    got = laplace_combination_halfwidth([1.0, 0.3], [40, 60])
    want = laplace_sum_halfwidth([1.0] * 40 + [0.3] * 60)
    assert got == pytest.approx(want, rel=1e-6)
    assert laplace_combination_halfwidth([], []) == 0.0


@pytest.mark.parametrize("cls", CLASSES)
def test_gaussian_ci_is_normal_quantile(cls):
    mech = cls(1.0, horizon=32, rng=ZeroNoise(), **GAUSS)
    assert mech.ci_halfwidth(9) == pytest.approx(1.959963984540054 * mech.noise_std(9))


CONFIGS = [
    dict(horizon=40, dim=1),
    dict(horizon=40, dim=3),
    dict(horizon=None, dim=2),
    dict(horizon=None, dim=1, calibration="analytic"),
]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("cut", [0, 1, 7, 16, 31])
def test_restored_mechanism_continues_identically(cls, config, cut):
    total = 40
    data = np.random.default_rng(cut).normal(size=(total, config["dim"]))
    feed = data[:, 0] if config["dim"] == 1 else data
    full = cls(1.5, rng=SeededNoise(np.random.default_rng(42)), **GAUSS, **config)
    expected = [full.step(x) for x in feed]
    gen = np.random.default_rng(42)
    first = cls(1.5, rng=SeededNoise(gen), **GAUSS, **config)
    head = [first.step(x) for x in feed[:cut]]
    state = json.loads(json.dumps(first.to_state()))
    assert state["mechanism"] == cls.name and state["t"] == cut
    restored = cls.from_state(state, rng=gen)
    assert restored.t == cut and restored.state_size() == first.state_size()
    tail = [restored.step(x) for x in feed[cut:]]
    for got, want in zip(head + tail, expected):
        np.testing.assert_array_equal(got, want)
    assert restored.to_state() == full.to_state()


@pytest.mark.parametrize("cls", CLASSES)
def test_state_pickles_and_secure_default(cls):
    mech = cls(1.0, horizon=8, **GAUSS)
    assert isinstance(mech.noise_source, KeyedNoise)
    mech.step(1.0)
    copy = pickle.loads(pickle.dumps(mech))
    assert copy.current() == mech.current()
    seeded = cls(1.0, horizon=8, rng=4, **GAUSS)
    seeded.step(1.0)
    clone = pickle.loads(pickle.dumps(seeded))
    assert clone.step(2.0) == seeded.step(2.0)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s: s.update(mechanism="tree"), "mechanism"),
        (lambda s: s.update(version=99), "version"),
        (lambda s: s.pop("core"), "core"),
        (lambda s: s.update(core={"nodes": [[1.0]]}), "core"),
        (lambda s: s.update(t=99), "t="),
        (lambda s: s.update(epsilon=-1), "epsilon"),
    ],
)
def test_from_state_rejects_bad_states(cls, mutate, match):
    mech = cls(1.0, horizon=16, rng=ZeroNoise(), **GAUSS)
    for _ in range(5):
        mech.step(1.0)
    state = mech.to_state()
    mutate(state)
    with pytest.raises(ValueError, match=match):
        cls.from_state(state, rng=ZeroNoise())


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(epsilon=0.0, **GAUSS), "epsilon"),
        (dict(epsilon="1", **GAUSS), "epsilon"),
        (dict(epsilon=1.0, sensitivity=-1.0, **GAUSS), "sensitivity"),
        (dict(epsilon=1.0, horizon=0, **GAUSS), "horizon"),
        (dict(epsilon=1.0, horizon=2.5, **GAUSS), "horizon"),
        (dict(epsilon=1.0, noise="gauss"), "noise"),
        (dict(epsilon=1.0, noise="gaussian"), "delta"),
        (dict(epsilon=1.0, noise="gaussian", delta=1.0), "delta"),
        (dict(epsilon=1.0, dim=0, **GAUSS), "dim"),
        (dict(epsilon=1.0, rng="seed", **GAUSS), "rng"),
        (dict(epsilon=1.0, calibration="classical", **GAUSS), "calibration"),
    ],
)
def test_constructor_validation_names_the_parameter(cls, kwargs, name):
    with pytest.raises(ValueError, match=name):
        cls(**kwargs)


@pytest.mark.parametrize("cls", CLASSES)
def test_step_and_queries_validate(cls):
    mech = cls(1.0, horizon=4, dim=2, rng=ZeroNoise(), **GAUSS)
    before = mech.to_state()
    for bad in ([1.0], [1.0, np.nan], "3", None):
        with pytest.raises(ValueError, match="x must"):
            mech.step(bad)
    assert mech.to_state() == before
    for t in (0, -1, 1.5, True, 5):
        with pytest.raises(ValueError, match="t must"):
            mech.noise_std(t)
    for _ in range(4):
        mech.step([1.0, 1.0])
    with pytest.raises(ValueError, match="horizon"):
        mech.step([1.0, 1.0])


def test_lower_bound_reproduces_known_values():
    assert prefix_sum_lower_bound(2**10) == pytest.approx(2.910, abs=5e-4)
    assert prefix_sum_lower_bound(2**16) == pytest.approx(4.232, abs=5e-4)
    assert prefix_sum_lower_bound(2**20) == pytest.approx(5.115, abs=5e-4)
    # It is ‖A‖_*/T: check the closed-form singular values on a small T.
    a = prefix_sum_matrix(50)
    assert prefix_sum_lower_bound(50) == pytest.approx(np.linalg.svd(a, compute_uv=False).sum() / 50, rel=1e-12)


# -- exact integer right factor -------------------------------------------------------


@pytest.mark.parametrize("cls", ["blt", "sqrt_toeplitz"])
def test_integer_right_factor_sensitivity_holds_for_off_grid_neighbours(cls, monkeypatch):
    """BLT and √Toeplitz compute y = C x + z in integer units h (EXACT =
    "right_factor"). With one keyed noise, neighbouring streams (one step
    changed by Δ, values off any grid) give integer vectors whose L2 distance
    is the exact sensitivity up to the bounded rounding, and never above the
    calibrated S·(1 + RIGHT_FACTOR_SLACK)."""
    import importlib

    from dp_beam.mechanisms import KeyedNoise, NoiseKey
    from dp_beam.mechanisms.counting.factorisation import RIGHT_FACTOR_SLACK

    module = importlib.import_module(f"dp_beam.mechanisms.counting.{'blt' if cls == 'blt' else 'toeplitz'}")
    mech_cls = BLTMechanism if cls == "blt" else SqrtToeplitzMechanism
    captured = []
    real = module.from_units
    monkeypatch.setattr(module, "from_units", lambda values, e: captured.append(list(values)) or real(values, e))
    if hasattr(module, "from_unit"):  # BLT's scalar path converts its one int by itself
        scalar = module.from_unit
        monkeypatch.setattr(module, "from_unit", lambda value, e: captured.append([value]) or scalar(value, e))
    horizon, delta_sens = 32, 0.7
    xs = [0.1 * t + 1.0 / 7.0 for t in range(horizon)]
    runs = []
    for changed in (None, 0, 9):
        values = list(xs)
        if changed is not None:
            values[changed] += delta_sens
        mech = mech_cls(1.0, sensitivity=delta_sens, horizon=horizon, noise="gaussian", delta=1e-6,
                        rng=KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("exact", cls)))
        captured.clear()
        releases = [mech.step(v) for v in values]
        runs.append((np.array([c[0] for c in captured], dtype=object), releases, mech))
    base, _, mech = runs[0]
    plan = mech._plan_of(horizon)
    unit = 2.0 ** mech._exact_exponent(plan)
    column = mech_cls.right_factor(horizon)
    for changed, (ints, releases, _) in zip((0, 9), runs[1:]):
        diff = np.array([float(a - b) for a, b in zip(ints, base)]) * unit
        exact = column[:, changed] * delta_sens
        # the rounding moves each coordinate by at most 2·err_units units
        assert np.max(np.abs(diff - exact)) <= 2 * plan.err_units * unit + 1e-15
        assert np.linalg.norm(diff) <= plan.l2 * delta_sens * (1 + RIGHT_FACTOR_SLACK)
    # The releases are the noisy prefix sums: with the noise removed they are exact.
    zero = mech_cls(1.0, sensitivity=delta_sens, horizon=horizon, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    assert [zero.step(v) for v in xs] == pytest.approx(np.cumsum(xs), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("noise, delta, calibration", [("laplace", None, "zcdp"), ("gaussian", 1e-6, "zcdp"),
                                                       ("gaussian", 1e-5, "analytic")])
def test_privacy_cost_is_a_cost_with_the_numbers_of_the_old_dict(cls, noise, delta, calibration):
    from dp_beam.accounting.cost import Cost

    if noise == "laplace" and not cls.LAPLACE:
        pytest.skip("no Laplace noise")
    mech = cls(0.7, horizon=64, noise=noise, delta=delta, calibration=calibration, rng=ZeroNoise())
    cost = mech.privacy_cost()
    old = {"epsilon": mech.epsilon, "delta": 0.0 if mech.delta is None else mech.delta, "rho": mech.rho}
    assert isinstance(cost, Cost)
    assert (cost.epsilon, cost.delta, cost.rho) == (old["epsilon"], old["delta"], old["rho"])
    assert cost == old and dict(cost) == old
