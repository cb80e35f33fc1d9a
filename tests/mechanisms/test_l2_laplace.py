"""The L2-Laplace sampler (dp_beam.mechanisms.l2_laplace; spec
private_erm_and_incremental_regression.md §4.1 item 5): density ∝ exp(−‖ν‖/b), so ‖ν‖ ~ Gamma(p, b)
and the direction is uniform on the sphere.
"""

import math

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import SecureNoise, SeededNoise, ZeroNoise
from dp_beam.mechanisms.l2_laplace import l2_laplace_noise


def _keyed(label):
    from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
    return KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("l2", label))


# The test source with p = 100, and the production source (exact Laplace draws for the
# radius, a Box–Muller direction from its stream) on a smaller sample.
@pytest.mark.parametrize("make_source, p, b, n", [
    (lambda: SeededNoise(20241), 100, 1.0, 20_000),
    (lambda: _keyed("law"), 10, 2.0, 5_000),
], ids=["seeded", "keyed"])
def test_l2_laplace_radius_and_direction_statistics(make_source, p, b, n):
    source = make_source()
    nu = np.array([l2_laplace_noise(source, b, p) for _ in range(n)])
    norms = np.linalg.norm(nu, axis=1)
    # ‖ν‖ ~ Gamma(p, b): mean p·b, sd √p·b, so the sample mean has sd √p·b/√n (0.0707 for
    # the first case); 5 sd.
    assert abs(norms.mean() - p * b) < 5 * math.sqrt(p) * b / math.sqrt(n)
    assert stats.kstest(norms, stats.gamma(a=p, scale=b).cdf).pvalue > 1e-3
    # Direction uniform: each coordinate of U has mean 0 and variance 1/p, so the
    # mean over n draws has sd 1/√(p n) (7.1e-4 for the first case); 5 sd, checked on all
    # p coordinates (a 5-sd excursion has probability 6e-7 each).
    U = nu / norms[:, None]
    assert np.max(np.abs(U.mean(axis=0))) < 5 / math.sqrt(p * n)
    # Per-coordinate variance (p+1)b². Pooled over the p coordinates of a
    # draw, Σ_j ν_j²/p = R²/p exactly, so the estimate is mean(R²)/p with
    # E R² = p(p+1)b² and Var R² = p(p+1)(4p+6)b⁴ (Gamma moments): relative sd
    # √((4p+6)/(p(p+1)n)) (0.0014 for the first case); allow 5 sd.
    pooled = np.mean(nu**2)
    assert abs(pooled / ((p + 1) * b * b) - 1) < 5 * math.sqrt((4 * p + 6) / (p * (p + 1) * n))


def test_the_keyed_source_draws_a_laplace_call_and_a_direction_per_vector():
    source = _keyed("calls")
    for _ in range(5):
        l2_laplace_noise(source, 2.0, 10)
    assert source.draws == 10


def test_iid_laplace_is_rejected_by_the_same_test():
    # The flagged per-coordinate implementation has E‖ν‖ ≈ b√(2p) ≈ 14.1 for p = 100.
    rng = np.random.default_rng(7)
    norms = np.linalg.norm(rng.laplace(0, 1.0, size=(2000, 100)), axis=1)
    assert norms.mean() == pytest.approx(math.sqrt(200), rel=0.05)
    assert stats.kstest(norms, stats.gamma(a=100, scale=1.0).cdf).pvalue < 1e-10


def test_l2_laplace_uses_the_injected_source_and_secure_source_works():
    class Counting(SeededNoise):
        def __init__(self):
            super().__init__(1)
            self.calls = []

        def laplace(self, scale, size):
            self.calls.append(("laplace", scale, size))
            return super().laplace(scale, size)

        def gaussian(self, sigma, size):
            self.calls.append(("gaussian", sigma, size))
            return super().gaussian(sigma, size)

    src = Counting()
    l2_laplace_noise(src, 0.5, 7)
    assert src.calls == [("laplace", 0.5, 7), ("gaussian", 1.0, 7)]
    assert np.all(l2_laplace_noise(ZeroNoise(), 3.0, 4) == 0)
    draw = l2_laplace_noise(SecureNoise(), 1.0, 5)
    assert draw.shape == (5,) and np.all(np.isfinite(draw)) and np.linalg.norm(draw) > 0


@pytest.mark.parametrize("dim, scale", [(1, 0.5), (3, 2.5)])
def test_norm_is_gamma_dim_scale_in_mean_and_variance(dim, scale):
    n = 20_000
    source = SeededNoise(dim)
    norms = np.array([np.linalg.norm(l2_laplace_noise(source, scale, dim)) for _ in range(n)])
    # Gamma(dim, scale): mean dim·scale and variance dim·scale²; the sample mean has sd
    # √dim·scale/√n, allow 5 sd. The sample variance has relative sd √((κ − 1)/n) with the
    # kurtosis κ = 3 + 6/dim of the Gamma, allow 5 of those.
    assert abs(norms.mean() - dim * scale) < 5 * math.sqrt(dim) * scale / math.sqrt(n)
    assert abs(norms.var() / (dim * scale ** 2) - 1) < 5 * math.sqrt((2 + 6 / dim) / n)


def test_zero_scale_gives_the_zero_vector_and_the_draw_count_is_fixed():
    class Counting(SeededNoise):
        def __init__(self):
            super().__init__(3)
            self.draws = 0

        def laplace(self, scale, size):
            self.draws += size
            return super().laplace(scale, size)

        def gaussian(self, sigma, size):
            self.draws += size
            return super().gaussian(sigma, size)

    assert np.array_equal(l2_laplace_noise(SeededNoise(1), 0.0, 3), np.zeros(3))
    src = Counting()
    for _ in range(5):
        l2_laplace_noise(src, 1.5, 4)
    assert src.draws == 5 * (4 + 4)        # dim Laplace + dim Gaussian per draw, whatever the data


@pytest.mark.parametrize("scale, dim, name", [(-1.0, 2, "scale"), (float("inf"), 2, "scale"),
                                              (True, 2, "scale"), ("1", 2, "scale"),
                                              (1.0, 0, "dim"), (1.0, 2.0, "dim"),
                                              (1.0, True, "dim")])
def test_bad_arguments_name_the_parameter(scale, dim, name):
    with pytest.raises(ValueError, match=name):
        l2_laplace_noise(SeededNoise(0), scale, dim)
