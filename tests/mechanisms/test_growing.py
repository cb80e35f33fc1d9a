"""Growing databases (seed 000): the testable properties 1–30 of spec growing_databases.md §7.

"Exact" means within 1e-9 relative error. Statistical tests use fixed seeds,
so they are deterministic; their tolerances are derived from the sampling
distribution and stated next to each, so a correct implementation passes for
almost every seed, and the planted bugs show that the tests can fail.
"""

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import KeyedNoise, NoiseKey, NoiseSource, SeededNoise, ZeroNoise
from dp_beam.mechanisms.growing import (ATG, NSG, BBImprover, BBImproverParams, BBScheduler,
                                        BBSchedulerParams, BlackBox, EpochTimes, ERMBox,
                                        GrowthNoise, LaplaceG, LaplaceHistogram, MWEMHistogram,
                                        PMWG, PMWGParams, SmallDB, epoch_times, mix, mw_update,
                                        nsg_privacy_cost, relative_entropy, rho_star)
from dp_beam.mechanisms.growing.svt import Z_EXPONENT

REL = 1e-9


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


class RecordingBox(BlackBox):
    """A mock (p, g) black box that records its arguments and releases the exact histogram."""

    name = "mock"

    def __init__(self, universe_size, p=3.0, g=1.0):
        self.universe_size, self.p, self.g = universe_size, p, g
        self.calls = []

    def run(self, counts, epsilon, alpha, beta, source):
        self.calls.append({"t": int(counts.sum()), "epsilon": epsilon, "beta": beta,
                           "alpha": alpha, "counts": counts.copy()})
        return counts / counts.sum()


class ScriptedNoise(NoiseSource):
    """Integer noise chosen by a rule on (scale, exponent); records every request."""

    def __init__(self, rule=lambda scale, exponent: 0.0):
        self.rule, self.calls = rule, []

    def integer_noise(self, kind, scale, exponent, size):
        self.calls.append((kind, scale, exponent, size))
        value = self.rule(scale, exponent)
        return [int(round(math.ldexp(value, -exponent)))] * size

    def _laplace(self, scale, size):
        return np.zeros(size)


# -- BBScheduler (properties 1–8) -------------------------------------------------------


def test_1_epoch_times_are_exact_ceilings():
    assert EpochTimes(1000, Fraction(1, 10)).first(8) == [1000, 1100, 1210, 1331, 1465, 1611, 1772, 1949]
    assert EpochTimes(100, Fraction(1, 4)).first(8) == [100, 125, 157, 196, 245, 306, 382, 477]
    assert math.ceil(1000 * 1.1 ** 2) == 1211          # the floating-point trap
    assert BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, gamma=0.1).epoch_time(2) == 1210
    assert epoch_times(1000, 0.1, 3)[2] != 1211
    # The decimal path for large i agrees with exact powers (also at integer values).
    for n, gamma in ((1000, Fraction(1, 10)), (7, Fraction(3, 7)), (1 << 20, Fraction(1, 2))):
        times = EpochTimes(n, gamma)
        for i in (65, 80, 137):
            v = n * (1 + gamma) ** i
            assert times(i) == -((-v.numerator) // v.denominator)
    assert EpochTimes(1000, Fraction(1, 10)).epoch_of(1209) == 1


def test_2_pure_schedule():
    prm = BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, gamma=0.1)
    expected = [0.0465374108, 0.0443716802, 0.0423067370, 0.0403378910]
    assert [round(prm.eps_i(i), 10) for i in range(4)] == expected
    eps = [prm.eps_i(i) for i in range(2000)]
    assert all(close(b / a, 1.1 ** -0.5) for a, b in zip(eps, eps[1:]))
    partial = np.cumsum(eps)
    # The real partial sums are 1 − 1.1^(−k/2) < 1; in floats, strictly below 1 while that
    # gap exceeds the rounding error, and within 1e-14 of 1 after 2000 terms.
    assert np.all(partial[:300] < 1.0) and np.all(partial <= 1.0 + 1e-14)
    assert abs(math.fsum(eps) - 1.0) < 1e-14
    alt = BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, gamma=0.1, schedule="alt_a")
    assert [round(alt.eps_i(i), 10) for i in range(3)] == [0.0909090909, 0.0826446281, 0.0751314801]
    assert abs(sum(alt.eps_i(i) for i in range(3000)) - 1.0) < 1e-12


def test_3_approximate_dp_schedule():
    prm = BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, gamma=0.1, delta=1e-6)
    assert round(rho_star(1.0, 1e-6), 10) == 0.0174689048
    assert round(prm.scale, 10) == 0.1869165844
    assert [round(prm.eps_i(i), 10) for i in range(3)] == [0.0563574707, 0.0537347399, 0.0512340643]
    S = math.fsum(prm.eps_i(i) ** 2 for i in range(3000))
    assert close(S, 2 * rho_star(1.0, 1e-6), 1e-12) and round(S, 10) == 0.0349378095
    L = math.log(1e6)
    assert S / 2 + math.sqrt(2 * S * L) <= 1 + 1e-12
    assert prm.privacy_cost() == {"epsilon": 1.0, "delta": 1e-6, "rho": rho_star(1.0, 1e-6)}


def test_4_failure_probabilities_sum_below_beta():
    prm = BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1, beta=0.05)
    assert np.all(np.cumsum([prm.beta_i(i) for i in range(200)]) <= 0.05)


def test_5_gamma_formula():
    pure = BBSchedulerParams(epsilon=1.0, n=10 ** 6, p=3, g=1, beta=0.05)
    approx = BBSchedulerParams(epsilon=1.0, n=10 ** 6, p=3, g=1, beta=0.05, delta=1e-6)
    assert round(pure.gamma_formula, 10) == 0.0819179155
    assert round(approx.gamma_formula, 10) == 0.0900532209
    assert close(pure.gamma, pure.gamma_formula, 1e-11)          # rounded to 12 digits
    assert BBSchedulerParams(epsilon=0.01, n=10, p=3, g=1e6).gamma == 1.0


def _stream(rng, N, length, skew=None):
    p = skew if skew is not None else rng.dirichlet(np.ones(N))
    return rng.choice(N, size=length, p=p)


def test_6_mock_black_box_calls():
    rng = np.random.default_rng(6)
    for n, gamma in ((50, 0.2), (1, 0.1), (13, 1.0)):        # (1, 0.1): ceiling collisions
        box = RecordingBox(5)
        sched = BBScheduler(box, epsilon=1.0, n=n, gamma=gamma, rng=ZeroNoise())
        prm = sched.params
        answers = []
        for t, cell in enumerate(_stream(rng, 5, 600), start=1):
            sched.arrive(int(cell))
            for _ in range(int(rng.integers(0, 3))):          # queries do not trigger runs
                answers.append((t, sched.answer(np.eye(5)[0])))
        nonempty = [i for i in range(400) if prm.epoch_time(i) <= 600
                    and prm.epoch_time(i + 1) > prm.epoch_time(i)]
        assert [c["t"] for c in box.calls] == [prm.epoch_time(i) for i in nonempty]
        assert [c["epsilon"] for c in box.calls] == [prm.eps_i(i) for i in nonempty]
        assert [c["beta"] for c in box.calls] == [prm.beta_i(i) for i in nonempty]
        assert [c["alpha"] for c in box.calls] == [prm.alpha_i(i) for i in nonempty]
        for t, value in answers:                                # the run with the largest t_i <= t
            runs = [c for c in box.calls if c["t"] <= t]
            assert value == (None if not runs else runs[-1]["counts"][0] / runs[-1]["t"])
    # Batched arrivals pool the unobservable runs: same total, one call per batch.
    box = RecordingBox(5)
    sched = BBScheduler(box, epsilon=1.0, n=10, gamma=0.5, rng=ZeroNoise())
    sched.extend({0: 100})
    crossed = [i for i in range(12) if sched.params.epoch_time(i) <= 100]
    assert len(box.calls) == 1 and box.calls[0]["t"] == 100
    assert close(box.calls[0]["epsilon"], sum(sched.params.eps_i(i) for i in crossed))
    assert sched.spent["epsilon"] <= sched.privacy_cost()["epsilon"]


def test_7_lemma_11_stale_database_error():
    rng = np.random.default_rng(7)
    for _ in range(30):
        N, n = int(rng.integers(2, 8)), int(rng.integers(5, 60))
        gamma = float(rng.uniform(0.05, 1.0))
        prm = BBSchedulerParams(epsilon=1.0, n=n, p=1, g=1, gamma=gamma)
        stream = _stream(rng, N, 20 * n)
        f = rng.uniform(0, 1, N)
        counts = np.zeros(N)
        snapshot, i = None, 0
        for t, cell in enumerate(stream, start=1):
            counts[cell] += 1
            if t >= prm.epoch_time(i):
                while prm.epoch_time(i) <= t:
                    i += 1
                snapshot = f @ counts / t
            if snapshot is not None:
                assert abs(f @ counts / t - snapshot) <= prm.gamma / (1 + prm.gamma) + 1e-12


@pytest.mark.parametrize("args", [(3, 1, 1, 0.05, 10 ** 6), (3, 100, 0.5, 0.01, 10 ** 8),
                                  (1, 10, 1, 0.05, 10 ** 5), (0.5, 10, 1, 0.05, 10 ** 5)])
def test_8_sup_alpha_i(args):
    p, g, eps, beta, n = args
    for delta, k in ((0.0, 13.3), (1e-6, 5.5)):
        prm = BBSchedulerParams(epsilon=eps, n=n, p=p, g=g, beta=beta, delta=delta)
        worst = max(prm.alpha_i(i) for i in range(0, 400))
        assert worst <= (1 + k ** (1 / p)) * prm.gamma
        assert worst <= prm.theorem10_alpha()


# -- BBImprover (9–11) ---------------------------------------------------------------------


def test_9_10_improver_schedule():
    prm = BBImproverParams(epsilon=1.0, delta=1e-6, n=1000, p=1, g=1, eta=0.1)
    assert round(prm.Z, 10) == 5.0123735235
    assert close(prm.eps_t(1000), 1.869072393e-3, 1e-9)
    assert close(prm.eps_t(1001), 1.868045199e-3, 1e-9)
    assert close(prm.eps_t(2000), 1.276614066e-3, 1e-9)
    assert close(prm.beta_t(1000), 4.995005e-5, 1e-7)
    other = BBImproverParams(epsilon=1.0, delta=1e-5, n=100, p=1, g=1, eta=0.5)
    assert round(other.eps_t(100), 10) == 0.0143931777
    assert round(other.eps_t(400), 10) == 0.0050887568
    with pytest.raises(ValueError, match="delta"):
        BBImproverParams(epsilon=1.0, delta=0.5, n=10, p=1, g=1)


@pytest.mark.parametrize("normaliser", ["bound", "zeta"])
def test_11_improver_partial_sums(normaliser):
    prm = BBImproverParams(epsilon=1.0, delta=1e-6, n=100, p=1, g=1, eta=0.2, normaliser=normaliser)
    t = np.arange(100, 200_001)
    squares = np.cumsum(np.array([prm.eps_t(int(v)) for v in t]) ** 2)
    assert np.all(squares <= 2 * prm.rho)
    betas = np.cumsum([prm.beta_t(int(v)) for v in t[:5000]])
    assert np.allclose(betas, 0.05 * (1 - 100 / (t[:5000] + 1.0)), rtol=1e-12)
    eps, beta = prm.pooled(99, 20_500)          # the zeta path agrees with the direct sum
    assert close(eps ** 2, squares[20_500 - 100], 1e-9)
    assert close(beta, 0.05 * (1 - 100 / 20_501), 1e-12)


def test_improver_runs_every_arrival_and_pools_batches():
    box = RecordingBox(3, p=1.0)
    imp = BBImprover(box, epsilon=1.0, delta=1e-6, n=5, rng=ZeroNoise())
    for cell in [0, 1, 2, 0, 1, 2, 0]:
        imp.arrive(cell)
    assert [c["t"] for c in box.calls] == [5, 6, 7]
    assert [c["epsilon"] for c in box.calls] == [imp.params.eps_t(t) for t in (5, 6, 7)]
    imp.extend({0: 10})
    assert box.calls[-1]["t"] == 17
    assert close(box.calls[-1]["epsilon"] ** 2, sum(imp.params.eps_t(t) ** 2 for t in range(8, 18)))
    assert imp.extend({}) is None                    # no arrival, no run


# -- SmallDB (12–14) -----------------------------------------------------------------------

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


# -- PMWG deterministic parts (15–22) ----------------------------------------------------


def test_15_histogram_stays_a_positive_distribution():
    rng = np.random.default_rng(15)
    prm = PMWGParams(epsilon=1.0, alpha=0.5, n=20, universe_size=6, cap_b=1e6)
    pm = PMWG(prm, rng=SeededNoise(15))
    for _ in range(3000):
        op = rng.integers(0, 3)
        if op == 0:
            pm.extend({int(rng.integers(0, 6)): int(rng.integers(1, 50))})
        elif op == 1:
            pm.query(rng.uniform(0, 1, 6))
        else:
            pm.y = mw_update(pm.y, rng.uniform(0, 1, 6), 0.3, bool(rng.integers(0, 2)))
        assert np.all(pm.y > 0) and abs(pm.y.sum() - 1) <= 1e-12


def test_16_uniform_mixing():
    y = mix(np.array([0.7, 0.1, 0.1, 0.1]), 10)
    assert np.allclose(y, [0.659090909, 0.113636364, 0.113636364, 0.113636364], atol=5e-10)
    rng = np.random.default_rng(16)
    y0 = rng.dirichlet(np.ones(5))
    seq = y0.copy()
    for t in range(40, 40 + 37):
        seq = mix(seq, t)
    assert np.allclose(seq, mix(y0, 40, 37), rtol=1e-12)
    pm = PMWG(PMWGParams(epsilon=1.0, alpha=0.5, n=10, universe_size=4), rng=ZeroNoise())
    pm.extend({0: 10})
    pm.y = np.array([0.7, 0.1, 0.1, 0.1])
    pm.arrive(2)
    assert np.allclose(pm.y, y, rtol=1e-12)


def test_17_mw_vectors():
    y = np.array([0.7, 0.1, 0.1, 0.1])
    f = np.array([1.0, 0, 0, 0])
    down, up = mw_update(y, f, 0.05, True), mw_update(y, f, 0.05, False)
    assert np.allclose(down[:2], [0.689396171, 0.103534610], atol=5e-10) and f @ down < f @ y
    assert np.allclose(up[:2], [0.710393896, 0.096535368], atol=5e-10) and f @ up > f @ y


def test_18_lemma_15_contraction():
    rng = random.Random(18)
    worst = -1.0
    for _ in range(20_000):
        N, t = rng.randint(2, 8), rng.randint(1, 30)
        counts = [0] * N
        for _ in range(t):
            counts[rng.randrange(N)] += 1
        w = [rng.random() ** 3 + 1e-9 for _ in range(N)]
        y = np.array(w) / sum(w)
        x = np.array(counts) / t
        k = rng.randrange(N)
        counts[k] += 1
        x2 = np.array(counts) / (t + 1)
        lhs = relative_entropy(x2, mix(y, t))
        rhs = t / (t + 1) * relative_entropy(x, y) + math.log(N) / (t + 1)
        worst = max(worst, lhs - rhs)
    assert worst <= 1e-12


def test_19_mw_progress():
    rng = np.random.default_rng(19)
    alpha, checked = 0.5, 0
    for _ in range(5000):
        N = int(rng.integers(2, 10))
        x, y = rng.dirichlet(np.ones(N)), rng.dirichlet(np.ones(N))
        f = rng.uniform(0, 1, N)
        gap = f @ x - f @ y
        if abs(gap) < alpha / 2:
            continue
        checked += 1
        y2 = mw_update(y, f, alpha / 4, down=gap < 0)   # the correct direction
        assert relative_entropy(x, y2) <= relative_entropy(x, y) - alpha ** 2 / 16 + 1e-12
    assert checked > 200


def test_20_noiseless_hard_count_stays_below_the_bound():
    rng = np.random.default_rng(20)
    N, n = 8, 50
    prm = PMWGParams(epsilon=1.0, alpha=0.5, n=n, universe_size=N)
    pm = PMWG(prm, rng=ZeroNoise())                        # the ξ -> 0 hook: exact answers
    pm.extend({0: n})
    pool = [np.eye(N)[i] for i in range(N)] + [1 - np.eye(N)[i] for i in range(N)]
    for phase in range(40):
        p = np.roll(np.linspace(1, 8, N) ** 3, phase)        # a shifting, skewed stream
        for _ in range(100):
            pm.arrive(int(rng.choice(N, p=p / p.sum())))
            x = pm.counts / pm.t
            for _ in range(3):                                # the worst query for the current y
                f = max(pool, key=lambda q: abs(q @ x - q @ pm.y))
                assert pm.query(f).kind != "abort"
                assert pm.hard <= prm.b * (1 + sum(1 / tau for tau in range(n + 1, pm.t + 1)))
    assert pm.hard > 10 and not pm.aborted


def test_21_cap_and_permanent_abort():
    forced = ScriptedNoise(lambda scale, e: 1e6 if e != Z_EXPONENT and scale > 0 else 0.0)
    prm = PMWGParams(epsilon=1.0, alpha=0.5, n=100, universe_size=4, cap_b=5)
    pm = PMWG(prm, rng=forced)
    pm.extend({1: 100})
    kinds = []
    for _ in range(4):
        pm.arrive(0)
        for _ in range(5):
            answer = pm.query(np.eye(4)[0])
            kinds.append(answer.kind)
            assert pm.hard <= prm.h_cap(pm.t)
    first_abort = kinds.index("abort")
    assert kinds[:first_abort] == ["hard"] * first_abort and first_abort == prm.h_cap(101)
    assert set(kinds[first_abort:]) == {"abort"} and pm.aborted
    assert pm.query(np.eye(4)[1]).kind == "abort"


def test_22_parameter_functions_and_table():
    pure = PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, K=100)
    approx = PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, K=100, delta=1e-6)
    t = np.arange(1000, 60_000, 7)
    xi = np.array([pure.xi(int(v)) for v in t])
    phi = np.array([pure.phi(int(v)) for v in t])
    assert np.all(np.diff(xi) <= 0) and np.all(np.diff(phi) <= 0) and np.all(np.diff(t * xi) >= 0)
    assert pure.worst_case_cost(400_000)["epsilon"] <= 1.0
    assert approx.worst_case_cost(400_000)["square"] <= 2 * approx.rho
    # The table of spec §4.7 (pmwg_vectors_000.py).
    assert round(pure.b, 4) == 177.4457 and round(pure.A, 4) == 799.5056
    assert round(pure.xi_n_formula, 6) == 0.799506 and round(pure.xi(4000), 6) == 0.399753
    assert round(pure.lam, 7) == 0.0195433 and round(pure.required_n()) == 480_607
    assert round(approx.A, 4) == 444.6142 and round(approx.xi_n_formula, 6) == 0.112809
    assert round(approx.lam, 6) == 0.138508 and round(approx.required_n()) == 67_813
    assert [pure.h_cap(v) for v in (1000, 2000, 10_000)] == [177, 300, 585]
    # The validator (A11): xi_n is recomputed from the constants; a smaller one is refused.
    with pytest.raises(ValueError, match="xi_n"):
        PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, xi_n=0.5)
    louder = PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, threshold_noise=1.0)
    assert louder.xi_n > pure.xi_n and louder.worst_case_cost(100_000)["epsilon"] <= 1.0
    with pytest.raises(ValueError, match="eta_frac"):
        PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, eta_frac=0.6)


def test_22_tuned_constants_of_the_benchmark_stay_private():
    # The constants benchmarks/growing_databases.py reports as "tuned" (TUNED there): the
    # validator must still recompute xi_n so that the worst-case ledger over the whole year of
    # flights (336,776 records from n = 50,000) stays within epsilon.
    tuned = PMWGParams(epsilon=1.0, alpha=0.05, n=50_000, universe_size=1152, K=200_000,
                       cap_b=40.0, threshold_frac=2.0, update="project")
    spec = PMWGParams(epsilon=1.0, alpha=0.05, n=50_000, universe_size=1152, K=200_000)
    assert tuned.xi_n >= tuned.xi_n_formula and tuned.xi_n < spec.xi_n
    assert tuned.worst_case_cost(336_776)["epsilon"] <= 1.0
    assert tuned.privacy_cost() == spec.privacy_cost()
    with pytest.raises(ValueError, match="xi_n"):
        PMWGParams(epsilon=1.0, alpha=0.05, n=50_000, universe_size=1152, cap_b=40.0,
                   threshold_frac=2.0, update="project", xi_n=0.9 * tuned.xi_n_formula)


# -- PMWG / SVT statistical (23–27) --------------------------------------------------------


def _ks_laplace(residuals, scale):
    """KS p-value of residuals against Lap(scale). The grid is 2^-40 of the sensitivity, far
    below the KS resolution, so the discrete law is indistinguishable from the continuous one."""
    return stats.kstest(np.asarray(residuals) / scale, stats.laplace.cdf).pvalue


@pytest.mark.parametrize("source", ["seeded", "keyed"])
def test_23_easy_exact_and_hard_noise_is_laplace(source):
    noise = GrowthNoise(xi_n=0.02, n=100)
    rng = SeededNoise(23) if source == "seeded" else KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("t23",))
    nsg = NSG(threshold=0.0, noise=noise, rng=rng)
    residuals = []
    for i in range(1500):
        t = 100 + 3 * i
        out = nsg.step(5.0, t)                          # far above T: always hard
        assert out.kind == "hard"
        residuals.append((out.numeric - 5.0) / (2 * noise.xi(t)))
    # Under H0 the p-value is uniform: p < 1e-3 has probability 1e-3.
    assert _ks_laplace(residuals, 1.0) > 1e-3
    assert _ks_laplace(residuals, 1.3) < 1e-3            # power: a 30 % wrong scale is caught
    pm = PMWG(PMWGParams(epsilon=1.0, alpha=0.5, n=50, universe_size=4, delta=1e-6), rng=SeededNoise(1))
    pm.extend({0: 20, 1: 30})
    for _ in range(30):
        f = np.array([0.0, 0.0, 1.0, 0.5])
        answer = pm.query(f)
        if answer.kind == "easy":
            assert answer.value == float(f @ pm.y)


def test_24_noise_scales_and_one_z_per_round():
    forced = ScriptedNoise(lambda scale, e: 0.0)
    noise = GrowthNoise(xi_n=0.1, n=10)
    nsg = NSG(threshold=0.5, noise=noise, rng=forced)
    values = [0.1, 0.2, 0.9, 0.3, 0.8, 0.0]
    for i, v in enumerate(values):
        nsg.step(v, 10 + 5 * i)
    z = [c for c in forced.calls if c[2] == Z_EXPONENT]
    assert [c[1] for c in z] == [1.0] * 3 and nsg.rounds == 3      # one Z per round
    rest = [c for c in forced.calls if c[2] != Z_EXPONENT]
    times = [10 + 5 * i for i in range(6)]
    query_scales = [c[1] for c in rest if c[1] not in {2 * noise.xi(t) for t in (20, 30)}]
    assert query_scales == [4 * noise.xi(t) for t in times]
    numeric = [c[1] for c in rest if c[1] in {2 * noise.xi(t) for t in (20, 30)}]
    assert numeric == [2 * noise.xi(20), 2 * noise.xi(30)]
    # The threshold is T + 2·ξ_t·Z: a Z of +0.5 moves it by ξ_t at every time of the round.
    shifted = ScriptedNoise(lambda scale, e: 0.5 if e == Z_EXPONENT else 0.0)
    atg = ATG(threshold=0.5, noise=noise, rng=shifted)
    assert not atg.step(0.5 + 0.99 * noise.xi(40), 40)
    assert atg.step(0.5 + 1.01 * noise.xi(90), 90)


def test_25_false_hard_frequency():
    noise = GrowthNoise(xi_n=0.02, n=100)
    T, a_prime, t = 0.3, 0.2, 400
    xi = noise.xi(t)
    bound = math.exp(-a_prime / (8 * xi)) + math.exp(-a_prime / (4 * xi))
    trials, hard = 4000, 0
    rng = SeededNoise(25)
    for _ in range(trials):
        hard += ATG(threshold=T, noise=noise, rng=rng).step(T - a_prime, t)
    # Binomial slack: 4 standard deviations above the bound.
    assert hard / trials <= bound + 4 * math.sqrt(bound * (1 - bound) / trials)
    assert hard > 0


@pytest.mark.slow
def test_26_end_to_end_accuracy():
    N, alpha, n, K = 16, 0.5, 500_000, 100
    prm = PMWGParams(epsilon=1.0, alpha=alpha, n=n, universe_size=N, K=K)
    assert prm.required_n() <= n
    good, seeds = 0, 20
    for seed in range(seeds):
        rng = np.random.default_rng(1000 + seed)
        p = rng.dirichlet(np.ones(N) * 0.5)
        pm = PMWG(prm, rng=SeededNoise(seed))
        pm.extend(rng.multinomial(n, p))
        worst = 0.0
        for _ in range(K):
            pm.extend(rng.multinomial(int(rng.integers(0, 5000)), p))   # closed-form batches
            f = (rng.uniform(size=N) < 0.5).astype(float)
            answer = pm.query(f)
            assert answer.kind in ("easy", "hard") and answer.within_budget
            worst = max(worst, abs(answer.value - f @ pm.counts / pm.t))
        good += worst <= alpha
    assert good >= 0.95 * seeds


def _atg_outcomes(values, times, noise, trials, seed, query_noise=4.0, threshold_noise=2.0):
    rng = SeededNoise(seed)
    counts = {}
    for _ in range(trials):
        atg = ATG(threshold=0.5, noise=noise, rng=rng, query_noise=query_noise,
                  threshold_noise=threshold_noise)
        out = []
        for v, t in zip(values, times):
            top = atg.step(v, t)
            out.append(top)
            if top:
                break
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts


def _max_ratio(a, b, minimum=300):
    ratios = []
    for k in set(a) | set(b):
        x, y = a.get(k, 0), b.get(k, 0)
        if x >= minimum and y >= minimum:
            ratios.append(max(x / y, y / x))
    return max(ratios)


@pytest.mark.slow
def test_27_atg_empirical_dp_with_a_planted_bug():
    noise = GrowthNoise(xi_n=0.01, n=100)            # φ(s) = 1 at s = n = 100, φ(400) = 0.5
    times = (100, 400)
    base = (0.5, 0.5)
    neighbours = [(0.5 - 1 / 100, 0.5 + 1 / 400), (0.5 + 1 / 100, 0.5 - 1 / 400)]
    trials = 30_000
    # With 30k trials an outcome of probability >= 1 % has >= 300 counts; the relative
    # standard error of a ratio of two such counts is <= sqrt(2/300) ≈ 0.08, so a tolerance
    # of 40 % is 5 standard errors for the rarest compared outcome and far more for the rest.
    bound = math.exp(noise.phi(100)) * 1.4
    ref = _atg_outcomes(base, times, noise, trials, 1)
    for k, values in enumerate(neighbours):
        assert _max_ratio(ref, _atg_outcomes(values, times, noise, trials, 2 + k)) <= bound
    # Planted bug: noise 16 times smaller than the cost claims (query ξ/4, threshold ξ/4).
    buggy_ref = _atg_outcomes(base, times, noise, trials, 1, 0.25, 0.25)
    buggy = _atg_outcomes(neighbours[0], times, noise, trials, 2, 0.25, 0.25)
    assert _max_ratio(buggy_ref, buggy) > bound


# -- ATG / NSG structure (28–30) -------------------------------------------------------------


def test_28_atg_halts_at_its_single_top():
    atg = ATG(threshold=0.5, noise=GrowthNoise(xi_n=0.05, n=10), rng=SeededNoise(28))
    outputs = []
    for t in range(10, 200):
        top = atg.step(0.3 + t / 400, t)
        outputs.append(top)
        if top:
            break
    assert outputs[-1] is True and not any(outputs[:-1]) and atg.halted
    with pytest.raises(RuntimeError, match="halted"):
        atg.step(0.0, 300)


def test_29_nsg_fresh_z_after_each_top():
    key = NoiseKey.from_bytes(bytes(range(32)))
    nsg = NSG(threshold=0.5, noise=GrowthNoise(xi_n=0.01, n=10), rng=KeyedNoise(key, ("t29",)))
    zs, kinds = [], []
    for i in range(12):
        out = nsg.step(0.9 if i % 3 == 2 else 0.1, 10 + i)
        kinds.append(out.kind)
        zs.append(nsg._round._z)
    assert kinds == ["easy", "easy", "hard"] * 4 and nsg.rounds == 4
    assert len({zs[i] for i in (0, 3, 6, 9)}) == 4                 # a new Z per round
    assert all(zs[i] == zs[i + 1] for i in (0, 3, 6, 9))           # the same Z within a round
    assert "_z" not in repr(nsg) and "Fraction" not in repr(nsg._round)


def test_30_privacy_accounting_function():
    noise = GrowthNoise(xi_n=0.3, n=50, c=0.5)
    hard = [50, 51, 80, 300, 1000]
    expected = noise.phi(50) + 1.5 * sum(noise.phi(e) for e in hard)
    assert close(nsg_privacy_cost(hard, noise), expected)
    nsg = NSG(threshold=-1.0, noise=noise, rng=ZeroNoise())        # every query hard
    for e in hard:
        nsg.step(0.0, e)
    assert close(nsg.spent(), expected)


# -- the other black boxes, LaplaceG, state ---------------------------------------------------


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


def test_laplace_g_schedules():
    lap = LaplaceG(epsilon=1.0, n=100, eta=0.2, rng=ZeroNoise())
    total = sum(lap.eps_query(t) for t in range(100, 200_000))
    assert total <= 1.0
    assert lap.answer(0.375, 100) == 0.375 and lap.answer(0.5, 100) is None   # one per time
    naive = LaplaceG(epsilon=1.0, n=100, schedule="queries", max_queries=10, rng=SeededNoise(5))
    assert close(naive.noise_std(1000), math.sqrt(2) * 10 / 1000, 1e-10)


@pytest.mark.parametrize("kind", ["scheduler", "improver", "pmwg"])
def test_state_round_trip(kind):
    rng = np.random.default_rng(40)
    if kind == "pmwg":
        mech = PMWG(PMWGParams(epsilon=1.0, alpha=0.3, n=30, universe_size=5), rng=ZeroNoise())
    elif kind == "scheduler":
        mech = BBScheduler(LaplaceHistogram(5), epsilon=1.0, n=30, gamma=0.3, rng=ZeroNoise())
    else:
        mech = BBImprover(LaplaceHistogram(5), epsilon=1.0, delta=1e-6, n=30, rng=ZeroNoise())
    for _ in range(8):
        mech.extend(rng.multinomial(10, np.ones(5) / 5))
        if kind == "pmwg":
            mech.query(np.eye(5)[int(rng.integers(5))])
    state = mech.to_state()
    if kind == "pmwg":
        twin = PMWG.from_state(state, rng=ZeroNoise())
    else:
        twin = type(mech).from_state(state, mech.box, rng=ZeroNoise())
    for m in (mech, twin):
        m.extend({1: 40})
    f = np.eye(5)[1]
    if kind == "pmwg":
        assert mech.query(f) == twin.query(f) and np.array_equal(mech.y, twin.y)
    else:
        assert mech.answer(f) == twin.answer(f) and mech.runs == twin.runs


def test_atg_and_natg_round_costs():
    noise = GrowthNoise(xi_n=0.5, n=20)
    from dp_beam.mechanisms.growing import NATG

    atg = ATG(threshold=0.0, noise=noise, rng=ZeroNoise())
    natg = NATG(threshold=0.0, noise=noise, rng=ZeroNoise())
    assert atg.step(1.0, 20) and natg.step(1.0, 20) == 1.0
    assert close(atg.privacy_cost(80), 0.75 * noise.phi(20) + 0.25 * noise.phi(80))     # Thm 25
    assert close(natg.privacy_cost(80), 0.75 * noise.phi(20) + 0.75 * noise.phi(80))    # Thm 27
    assert close(atg.privacy_cost(None), 0.5 * noise.phi(20))
