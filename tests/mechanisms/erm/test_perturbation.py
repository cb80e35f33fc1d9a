"""Output perturbation (dp_beam.mechanisms.erm.perturbation; spec
private_erm_and_incremental_regression.md §4.1 items 1–4): noise scales and per-call fractions.

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import (
    ContinualERMMechanism,
    LogisticLoss,
    MultiResolutionERMMechanism,
    OutputPerturbation,
    SlidingWindowERMMechanism,
    alg2_noise_scale,
    alg3_noise_scale,
    alg5_base_noise_scale,
    alg5_finetune_noise_scale,
    solve_erm,
)

from .helpers import UNIT, data, feed


#: Relative tolerance of closed-form noise scales: output perturbation
#: calibrates for Δ₂ plus √p grid steps of its noise (the minimiser is
#: rounded to that grid, noise_grid.grid_padded_scale), a relative excess of
#: at most 2^-29·√p·scale/Δ₂ — below 1e-6 for the calls tested here.
GRID_PAD = 1e-6


def test_noise_scale_formulas_match_spec_vectors():
    assert alg2_noise_scale(1, 1, 8192, 0.1) == pytest.approx(0.0048828125, rel=1e-12)
    assert alg2_noise_scale(1, 10, 2048, 1) == pytest.approx(0.0001953125, rel=1e-12)
    assert alg3_noise_scale(1, 1, 1024, 0.1) == pytest.approx(0.0390625, rel=1e-12)
    assert alg3_noise_scale(1, 1, 512, 0.1) == pytest.approx(0.078125, rel=1e-12)
    assert alg3_noise_scale(1, 10, 512, 1) == pytest.approx(0.00078125, rel=1e-12)
    assert alg5_base_noise_scale(1, 1, 4, 1024, 1) == pytest.approx(0.00146484375, rel=1e-12)
    assert alg5_finetune_noise_scale(1, 1, 1024, 1) == pytest.approx(0.01171875, rel=1e-12)
    assert alg5_base_noise_scale(1, 10, 4, 256, 1) == pytest.approx(0.0005859375, rel=1e-12)
    assert alg5_finetune_noise_scale(1, 10, 256, 1) == pytest.approx(0.0046875, rel=1e-12)


def test_streams_use_the_spec_noise_scales():
    multi = MultiResolutionERMMechanism(0.1, 8192, lam=1, **UNIT)
    assert multi.noise_scale() == pytest.approx(0.0048828125, rel=GRID_PAD)
    for k in range(5):
        assert multi.call_noise(k)["scale"] == pytest.approx(0.0048828125, rel=GRID_PAD)
    # ContinualERMMechanism splits its ε in halves (§1.9): ε_tot = 0.2 gives the spec's ε = 0.1 per part.
    cont = ContinualERMMechanism(0.2, 1024, 8192, lam=1, **UNIT)
    assert cont.update_noise_scale() == pytest.approx(0.0390625, rel=GRID_PAD)
    assert cont.base_noise_scale() == pytest.approx(0.0048828125, rel=GRID_PAD)
    slide = SlidingWindowERMMechanism(1.0, 1024, 7168, lam=1, **UNIT)
    assert slide.P == 4
    assert slide.base_noise_scale() == pytest.approx(0.00146484375, rel=GRID_PAD)
    for level in range(3):
        assert slide.finetune_noise_scale(level) == pytest.approx(0.01171875, rel=GRID_PAD)


def test_per_call_fractions_and_stds_of_releases():
    cont = ContinualERMMechanism(2.0, 1, 2, lam=1.0, rng=ZeroNoise(), **UNIT)
    releases = [r for rs in feed(cont, 8)[0] for r in rs]
    kinds = [(r.kind, r.level, r.fraction) for r in releases]
    # Blocks 2..8 with B = 2 b0: base k=0, doubling j=0, base k=1, doubling 0, 1, single, base k=2.
    assert kinds == [("base", 0, 0.5), ("doubling", 0, 0.5), ("base", 1, 0.25), ("doubling", 0, 0.5),
                     ("doubling", 1, 0.25), ("single", 0, 0.5), ("base", 2, 0.125)]
    p = cont.loss.n_params
    for r in releases:
        assert r.call_epsilon == pytest.approx(r.fraction * 1.0)      # each part holds ε/2 = 1
        assert r.noise_std == pytest.approx(math.sqrt(p + 1) * r.noise_scale)   # Var ν_j = (p+1) b²
    multi = MultiResolutionERMMechanism(1.0, 2, lam=1.0, rng=ZeroNoise(), **UNIT)
    out = feed(multi, 4)[0]
    assert [[(r.level, r.fraction) for r in rs] for rs in out] == [
        [(0, 0.5)], [(0, 0.5), (1, 0.25)], [(0, 0.5)], [(0, 0.5), (1, 0.25), (2, 0.125)]]


def test_gaussian_and_coordinate_laplace_calibration():
    loss = LogisticLoss(**UNIT)
    p = loss.n_params
    gauss = OutputPerturbation(loss, 0.5, 1.0, "gaussian", delta=1e-6)
    rho = gauss.rho
    n, f = 40, 0.25
    delta2 = 2 * 1 / (0.5 * n)
    # (f·ρ)-zCDP: Δ²/(2σ²) = f·ρ.
    sigma = gauss.call_noise(n, f)["scale"]
    assert delta2**2 / (2 * sigma**2) == pytest.approx(f * rho, rel=GRID_PAD)
    coord = OutputPerturbation(loss, 0.5, 1.0, "coord_laplace_l1")
    assert coord.call_noise(n, f)["scale"] == pytest.approx(math.sqrt(p) * delta2 / f, rel=GRID_PAD)
    stream = SlidingWindowERMMechanism(1.0, 1, 3, lam=1.0, noise="gaussian", delta=1e-6, **UNIT)
    cost = stream.privacy_cost()
    assert cost["delta"] == 1e-6 and cost["rho"] == pytest.approx(rho, rel=1e-12)


def test_normalisation_guard_doubling_the_data_halves_the_call_cost():
    # §4.2 item 11: at a fixed noise scale the per-call ε = Δ₂/b with Δ₂ = 2L/(λ|D|).
    op = OutputPerturbation(LogisticLoss(**UNIT), 1.0, 1.0)
    b = op.call_noise(64, 0.5)["scale"]
    assert op.call_noise(128, 0.25)["scale"] == pytest.approx(b, rel=GRID_PAD)
    # And the objective is normalised by |D|: duplicating every point leaves the minimiser unchanged.
    loss = LogisticLoss(**UNIT)
    X, y = data(30)
    X = loss.clip(X)
    ref = np.array([0.3, -0.2])
    once, _ = solve_erm(loss, X, y, 0.7, ref, tol_fraction=1e-6)
    twice, _ = solve_erm(loss, np.vstack([X, X]), np.concatenate([y, y]), 0.7, ref, tol_fraction=1e-6)
    np.testing.assert_allclose(once, twice, atol=1e-7)


def test_secure_noise_is_the_default_and_trains():
    stream = SlidingWindowERMMechanism(1.0, 2, 2, lam=0.5, **UNIT)
    assert stream._source.secure
    (rel,) = stream.step(*data(2, seed=1))
    assert np.all(np.isfinite(rel.params)) and rel.noise == "l2_laplace"
