"""BBScheduler and BBImprover (dp_beam.mechanisms.growing.schedulers): properties 2–4 and 6–11
of spec growing_databases.md §7, and state round trips.

"Exact" means within 1e-9 relative error. Statistical tests use fixed seeds, so they are
deterministic; their tolerances are derived from the sampling distribution and stated next to
each, so a correct implementation passes for almost every seed, and the planted bugs show that
the tests can fail.
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.growing import (
    BBImprover,
    BBImproverParams,
    BBScheduler,
    BBSchedulerParams,
    BlackBox,
    LaplaceHistogram,
    PMWG,
    PMWGParams,
    rho_star,
)

from .helpers import close


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
