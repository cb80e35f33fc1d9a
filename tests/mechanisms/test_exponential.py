"""The exponential mechanism (dp_beam.mechanisms.exponential): P(i) ∝ exp(−ε·cost_i/(2Δ)).

Statistical tests use a fixed seed; their thresholds come from the chi-square law
of the frequencies under the softmax, stated next to each test."""

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import SecureNoise, SeededNoise, ZeroNoise
from dp_beam.mechanisms.exponential import exponential_mechanism
from dp_beam.mechanisms.noise import NoiseSource

COST = np.array([0.0, 1.0, 2.0, 4.0])


def softmax_law(cost, epsilon, sensitivity):
    w = np.exp(-epsilon * np.asarray(cost) / (2.0 * sensitivity))
    return w / w.sum()


def frequencies(cost, epsilon, sensitivity, n, seed):
    source = SeededNoise(seed)
    counts = np.zeros(len(cost))
    for _ in range(n):
        counts[exponential_mechanism(cost, epsilon, sensitivity, source)] += 1
    return counts


@pytest.mark.parametrize("epsilon, sensitivity", [(1.0, 1.0), (2.0, 0.5)])
def test_seeded_choices_follow_the_softmax_law(epsilon, sensitivity):
    n = 20_000
    counts = frequencies(COST, epsilon, sensitivity, n, seed=2024)
    # Under the law, Pearson's statistic is chi-square with 3 degrees of freedom (every
    # expected count is > 1000, so the approximation is tight): p < 1e-4 happens with
    # probability 1e-4 for a correct sampler.
    assert stats.chisquare(counts, n * softmax_law(COST, epsilon, sensitivity)).pvalue > 1e-4


def test_the_chi_square_bound_rejects_a_missing_factor_two():
    # Planted bug: P(i) ∝ exp(−ε·cost_i/Δ) is the law of ε' = 2ε; the same test must reject it.
    n = 20_000
    counts = frequencies(COST, 2.0, 1.0, n, seed=2024)
    assert stats.chisquare(counts, n * softmax_law(COST, 1.0, 1.0)).pvalue < 1e-10


def test_zero_noise_returns_the_lowest_cost_and_one_candidate_is_index_zero():
    assert exponential_mechanism([3.0, -1.0, 2.0], 1.0, 1.0, ZeroNoise()) == 1
    assert exponential_mechanism([5.0], 1.0, 1.0, SeededNoise(0)) == 0
    assert exponential_mechanism([5.0], 1.0, 1.0, object()) == 0


def test_secure_noise_returns_a_candidate_and_prefers_the_best_one():
    # ε = 20, Δ = 1 and a cost gap of 10 per step: the softmax gives the best candidate
    # probability 1 − O(e^-100); report-noisy-max concentrates at least as much.
    choices = [exponential_mechanism([0.0, 10.0, 20.0], 20.0, 1.0, SecureNoise()) for _ in range(5)]
    assert choices == [0] * 5


def test_an_unknown_noise_source_is_rejected():
    class Other(NoiseSource):
        def _laplace(self, scale, size):
            return np.zeros(size)

    with pytest.raises(ValueError, match="Other"):
        exponential_mechanism([0.0, 1.0], 1.0, 1.0, Other())

