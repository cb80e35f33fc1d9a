"""The black boxes (dp_beam.mechanisms.growing.boxes): SmallDB (properties 12–14 of spec
growing_databases.md §7), MWEM, the Laplace histogram and ERM.

"Exact" means within 1e-9 relative error. Statistical tests use fixed seeds, so they are
deterministic; their tolerances are derived from the sampling distribution and stated next to
each, so a correct implementation passes for almost every seed, and the planted bugs show that
the tests can fail.
"""

import math

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import KeyedNoise, NoiseKey, SeededNoise
from dp_beam.mechanisms.growing import (
    BBImprover,
    BBScheduler,
    BBSchedulerParams,
    ERMBox,
    LaplaceHistogram,
    MWEMHistogram,
    SmallDB,
)

from .helpers import close


Q3 = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0.5, 0.5, 1, 0]], dtype=float)


def test_12_smalldb_output_size():
    box = SmallDB(Q3, 4)
    counts = np.array([5, 3, 1, 1])
    for alpha in (1.5, 1.0, 0.7):
        m = math.ceil(4 * math.log(3) / alpha ** 2)
        y = box.run(counts, 1.0, alpha, 0.05, SeededNoise(12))
        assert box.size_for(alpha) == m
        assert np.allclose(y * m, np.round(y * m)) and round(float(y.sum() * m)) == m


@pytest.mark.parametrize("source", ["seeded", "keyed"])
def test_13_smalldb_distribution_matches_the_exponential_mechanism(source):
    box = SmallDB(Q3, 4)
    counts = np.array([2, 1, 1, 0])
    alpha = 1.6                                           # m = 2: 10 candidate multisets
    m = box.size_for(alpha)
    cands = box.candidates(m)
    err = np.abs(Q3 @ cands.T / m - (Q3 @ counts / 4)[:, None]).max(axis=0)
    p = np.exp(-1.0 * 4 * err / 2)
    p /= p.sum()
    draws = 20_000 if source == "seeded" else 3_000
    noise = SeededNoise(13) if source == "seeded" else KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("t13",))
    index = {tuple(c): i for i, c in enumerate(cands)}
    observed = np.zeros(len(cands))
    for _ in range(draws):
        y = box.run(counts, 1.0, alpha, 0.05, noise)
        observed[index[tuple(np.round(y * m).astype(int))]] += 1
    # Chi-square goodness of fit, 9 degrees of freedom: under the exact law the p-value is
    # uniform, so p < 1e-3 happens with probability 1e-3 for a correct sampler.
    assert stats.chisquare(observed, draws * p).pvalue > 1e-3


def test_14_smalldbg_gamma_exponent_is_one_fifth():
    box = SmallDB(Q3, 4)
    g1 = BBSchedulerParams(epsilon=1.0, n=10 ** 8, p=box.p, g=box.g).gamma_formula
    g2 = BBSchedulerParams(epsilon=1.0, n=32 * 10 ** 8, p=box.p, g=box.g).gamma_formula
    assert close(g1 / g2, 32 ** 0.2, 1e-12)


def test_mwem_spends_its_epsilon_in_t_rounds():
    calls = []

    class Recording(SeededNoise):
        def laplace(self, scale, size):
            calls.append(("laplace", scale))
            return super().laplace(scale, size)

    Q = np.vstack([np.eye(6), 1 - np.eye(6)])
    box = MWEMHistogram(Q, 6, rounds=5)
    y = box.run(np.array([50, 10, 0, 0, 5, 35]), 1.0, 0.2, 0.05, Recording(3))
    measurements = [s for kind, s in calls if kind == "laplace" and s > 1.0]
    assert len(measurements) == 5 and all(math.isclose(s, 10.0, rel_tol=1e-6) for s in measurements)
    assert abs(y.sum() - 1) < 1e-12 and np.all(y > 0)
    big = MWEMHistogram(Q, 6)
    y = big.run(np.array([5000, 1000, 0, 0, 500, 3500]), 1.0, 0.2, 0.05, SeededNoise(4))
    assert np.abs(Q @ y - Q @ np.array([0.5, 0.1, 0, 0, 0.05, 0.35])).max() < 0.03


def test_laplace_histogram_and_bbscheduler_accuracy():
    rng = np.random.default_rng(31)
    p = rng.dirichlet(np.ones(10))
    sched = BBScheduler(LaplaceHistogram(10), epsilon=1.0, n=2000, rng=SeededNoise(31))
    for _ in range(30):
        sched.extend(rng.multinomial(1000, p))
    x = sched.counts / sched.t
    assert np.abs(sched.latest.output - x).sum() < 0.1
    assert sched.spent["epsilon"] <= 1.0 + 1e-12


def test_ermg_excess_risk_decreases():
    feats = np.array([[x, y] for x in (-1.0, 0.0, 1.0) for y in (-1.0, 1.0)] * 2)
    labels = [0] * 6 + [1] * 6
    box = ERMBox(feats, labels, classes=(0, 1), feature_bound=1.5, lam=0.05)
    assert box.p == 0.5 and box.output_kind == "model"
    rng = np.random.default_rng(32)
    p = np.array([3, 1, 2, 1, 1, 2, 1, 2, 1, 3, 2, 1], dtype=float)
    imp = BBImprover(box, epsilon=1.0, delta=1e-6, n=200, rng=SeededNoise(32))
    risks = []
    for _ in range(8):                                 # sizes 200, 400, ..., 25 600
        imp.extend(rng.multinomial(imp.t or 200, p / p.sum()))
        risks.append(box.excess_risk(imp.latest.output, imp.counts))
    assert risks[-1] < risks[4] < risks[0] and risks[-1] < 0.05
    with pytest.raises(ValueError, match="answered"):
        box.answer(imp.latest.output, np.ones(12))
