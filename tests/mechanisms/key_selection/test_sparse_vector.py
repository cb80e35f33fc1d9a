"""The sparse-vector method of key selection
(dp_beam.mechanisms.key_selection.sparse_vector, claims 10–17).

Statistical tests are seeded, so they are deterministic; their thresholds are
still derived from the sampling distribution, stated in each test, so that a
correct implementation passes for almost every seed and the planted bugs
show that the tests can fail."""

import json
import math
import pickle

import numpy as np
import pytest

from dp_beam.mechanisms import (
    KeySelection,
    KeyedNoise,
    SeededNoise,
    ZeroNoise,
)
from dp_beam.mechanisms.key_selection.sparse_vector import KeySparseVector
from dp_beam.mechanisms.key_selection.thresholds import sparse_vector_excess

from .helpers import (CountingNoise, ScriptedNoise, admission, admission_steps, cp_lower, cp_upper,
                      laplace_survival, same_distribution_pvalue, svt)


# One-unit admission, vectorised: ρ and ν_t drawn as the mechanism draws them.
def one_unit_rate(tau, br, bn, horizon, n, seed, count=1):
    gen = np.random.default_rng(seed)
    rho = gen.laplace(0.0, br, n)
    hit = np.zeros(n, dtype=bool)
    for _ in range(horizon):
        hit |= count + gen.laplace(0.0, bn, n) >= tau + rho
    return int(hit.sum())


@pytest.mark.parametrize("horizon", [1, 64])
def test_one_unit_admission_rate_matches_the_bound_and_planted_bugs_are_caught(horizon):
    sel = svt(1.0, 0.4, horizon=horizon)
    d1, br, bn = sel.delta_per_key, sel.offset_scale, sel.step_scale
    assert d1 == pytest.approx(0.1076, abs=1e-3)
    n = 200_000
    hits = one_unit_rate(sel.base_threshold(), br, bn, horizon, n, seed=1)
    # The bound holds (a 99.9 % lower confidence bound above δ₁ would refute it) and
    # is essentially exact (h is the exact conditional probability): the rate's upper
    # confidence bound reaches the certified lower bound.
    assert cp_lower(hits, n) <= d1
    assert cp_upper(hits, n) >= sel.admission_bounds(1)[0]
    # A key with no data at all: δ₀, below δ₁.
    zeros = one_unit_rate(sel.base_threshold(), br, bn, horizon, n, seed=2, count=0)
    assert cp_lower(zeros, n) <= sel.admission_bounds(0)[1] < d1
    if horizon > 1:
        # Planted bug 1: no union over the steps (τ for a single test).
        tau = 1 + sparse_vector_excess(br, bn, 1, d1)
        assert cp_lower(one_unit_rate(tau, br, bn, horizon, n, seed=3), n) > d1
    # Planted bug 2: ρ left out of the threshold computation (only the ν_t); at
    # horizon 1 its rate measures 0.19.
    p_step = -math.expm1(math.log1p(-d1) / horizon)
    tau = 1 + bn * math.log(0.5 / p_step)
    assert cp_lower(one_unit_rate(tau, br, bn, horizon, n, seed=4), n) > d1


class SvtNoUnionBound(KeySelection):
    """Planted bug: the threshold of a single test, for a whole horizon of tests."""

    def base_threshold(self):
        if self._base_threshold is None:
            self._base_threshold = 1.0 + sparse_vector_excess(self.offset_scale, self.step_scale, 1,
                                                     self.delta_per_key)
        return self._base_threshold


class SvtNoEpochGrowth(KeySelection):
    """Planted bug: an unbounded stream's τ_t without the epoch term g(t)."""

    def _svt_shift(self, t):
        return 0.0


@pytest.mark.parametrize("horizon", [64, None])
def test_one_unit_key_through_the_mechanism(horizon):
    last, n = 64, 3000
    sel = svt(1.0, 0.4, horizon=horizon)
    bug = SvtNoUnionBound if horizon is not None else SvtNoEpochGrowth
    buggy = bug(1.0, 0.4, horizon=horizon, method="sparse_vector")

    def rate(selection, seed):
        source, arrivals = SeededNoise(seed), np.random.default_rng(seed + 1)
        admitted = 0
        for _ in range(n):
            first = int(arrivals.integers(1, 9))
            admitted += admission(selection.new_counter(first, rng=source), [1], last) is not None
        return admitted

    # Claim 13 through new_counter/step (keys opening at steps 1–8): measured 0.098
    # bounded, 0.037 unbounded (τ_t grows there), δ₁ = 0.108. The planted bugs
    # measure 0.84 and 0.72.
    assert cp_lower(rate(sel, 20), n) <= sel.delta_per_key
    assert cp_lower(rate(buggy, 20), n) > sel.delta_per_key


# -- 10. the privacy claim, exactly --------------------------------------------------------


def output_distribution(counts, taus, br, bn, offset=True):
    """Exact law of the admission step (index k, or len(counts) for never), by quadrature."""
    from scipy import integrate
    steps = len(counts)

    def p_k(r, k):
        p = 1.0
        for i in range(k):
            p *= 1.0 - laplace_survival(taus[i] + r - counts[i], bn)
        if k < steps:
            p *= laplace_survival(taus[k] + r - counts[k], bn)
        return p

    out = []
    for k in range(steps + 1):
        if not offset:
            out.append(p_k(0.0, k))
            continue
        kinks = sorted({0.0} | {counts[i] - taus[i] for i in range(steps)})
        edges = [kinks[0] - 80 * br] + kinks + [kinks[-1] + 80 * br]
        f = lambda r: p_k(r, k) * math.exp(-abs(r) / br) / (2 * br)  # noqa: E731
        out.append(sum(integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-11, limit=200)[0]
                       for lo, hi in zip(edges, edges[1:])))
    return np.array(out)


SCENARIOS = [([12] * 8, 0), ([10] * 8, 0), ([0, 2, 4, 6, 8, 10, 12, 14], 3), ([9] * 8, 6), ([4] * 8, 0)]


def worst_log_ratio(br, bn, offset=True):
    worst = 0.0
    taus = [10.0] * 8
    for counts, t_u in SCENARIOS:
        # Neighbour: one more unit, from step t_u on (claim 10).
        more = [c + (t >= t_u) for t, c in enumerate(counts)]
        p = output_distribution(counts, taus, br, bn, offset)
        q = output_distribution(more, taus, br, bn, offset)
        assert p.sum() == pytest.approx(1.0, abs=1e-9) and q.sum() == pytest.approx(1.0, abs=1e-9)
        worst = max(worst, float(np.max(np.abs(np.log(p / q)))))
    return worst


def test_sparse_vector_is_epsilon_dp_per_key_on_neighbouring_count_streams():
    sel = svt(1.0, 1e-6, horizon=8)
    # Claim 11: every output (admission step or never) has likelihood ratio <= e^{ε/m}.
    assert worst_log_ratio(sel.offset_scale, sel.step_scale) <= 1.0 + 1e-9
    # Planted bug: without the shared offset, a stream above the threshold has a
    # "never admitted" ratio of e^{T/b_ν}: far above e^ε.
    assert worst_log_ratio(sel.offset_scale, sel.step_scale, offset=False) > 3.0


# -- 11. mechanics ----------------------------------------------------------------------------


def test_offset_is_drawn_once_at_opening_and_each_step_draws_one_step_noise():
    sel = svt(horizon=100)
    source = ScriptedNoise([0.5, -1.0, 2.0])
    key = sel.new_counter(40, rng=source)
    assert (key.t, key.admitted) == (39, None)
    assert source.scales == [sel.offset_scale]            # ρ only: no catching up (claim 15)
    assert key.to_state()["offset"] == 0.5 and key.to_state()["count"] == 0
    assert key.step(3) is False and key.step(0) is False
    assert source.scales == [sel.offset_scale, sel.step_scale, sel.step_scale]
    assert key.to_state()["offset"] == 0.5 and key.to_state()["count"] == 3
    counting = CountingNoise()
    assert svt().new_counter(10**12, rng=counting).t == 10**12 - 1 and counting.draws == 1


def test_zero_noise_admits_exactly_at_the_threshold_sparse_vector():
    sel = svt(1.0, 0.4, horizon=64)
    tau = sel.threshold(5)
    below = sel.new_counter(5, rng=ZeroNoise())
    assert below.step(math.ceil(tau) - 1) is False
    at = sel.new_counter(5, rng=ZeroNoise())
    assert at.step(math.ceil(tau)) is True and at.admitted == 5
    with pytest.raises(ValueError, match="already admitted"):
        at.step(0)
    state = at.to_state()
    assert (state["t"], state["count"], state["offset"]) == (5, None, None)


def test_admission_compares_count_plus_step_noise_with_threshold_plus_offset():
    sel = svt(horizon=10)
    tau = sel.threshold(1)
    # count 10, ν = tau − 10 + 3 − ε: just below τ + ρ with ρ = 3.
    key = sel.new_counter(1, rng=ScriptedNoise([3.0, tau - 10 + 3 - 1e-9, tau - 10 + 3]))
    assert key.step(10) is False
    assert key.step(0) is True and key.admitted == 2


@pytest.mark.parametrize("horizon", [64, None])
@pytest.mark.parametrize("units,within,rate", [(100, 0, 0.99), (60, 3, 0.95)])
def test_sparse_vector_key_with_many_units_is_admitted_early(horizon, units, within, rate):
    sel = svt(1.0, 1e-6, horizon=horizon)
    assert sel.threshold(64) < 60
    source, arrivals = SeededNoise(5), np.random.default_rng(6)
    runs, early = 1000, 0
    for _ in range(runs):
        first = int(arrivals.integers(1, 56))
        at = admission(sel.new_counter(first, rng=source), [units], 64)
        early += at is not None and at - first <= within
    assert early / runs >= rate


# -- 12. lazy start ------------------------------------------------------------------------


def test_lazy_start_is_the_from_start_run_under_the_coupling():
    # Claim 15: same ρ and the same ν_t from s on ⇒ the same admission step, unless
    # the from-start run crossed before s on a count of 0.
    sel = svt(horizon=20)
    tau = sel.threshold(1)
    rho, s = 1.5, 6
    later = [-5.0, -2.0, tau + rho - 12 + 0.1, 0.0, 0.0]     # crosses at s + 2 with 4 units/step
    quiet = [-3.0, 1.0, 0.0, -8.0, 2.0]                       # t < s, far below τ + ρ on count 0
    lazy = sel.new_counter(s, rng=ScriptedNoise([rho] + later))
    start = sel.new_counter(1, rng=ScriptedNoise([rho] + quiet + later))
    assert admission(start, [0] * (s - 1) + [4, 4, 4], 20) == admission(lazy, [4, 4, 4], 20) == s + 2
    # The exception: an early crossing on count 0 (probability <= δ₀ <= δ₁).
    loud = [0.0, tau + rho + 1.0, 0.0, 0.0, 0.0]
    start = sel.new_counter(1, rng=ScriptedNoise([rho] + loud + later))
    assert admission(start, [0] * (s - 1) + [4, 4, 4], 20) == 2


@pytest.mark.parametrize("horizon,first,units", [(64, 21, 40), (None, 13, 36)])
def test_sparse_vector_lazy_start_matches_the_from_start_run_in_law(horizon, first, units):
    sel = svt(1.0, 1e-6, horizon=horizon)
    n, lazy_source, zero_source = 4000, SeededNoise(300), SeededNoise(400)
    lazy = admission_steps((sel.new_counter(first, rng=lazy_source) for _ in range(n)), units, 64)
    zeros, early = [], 0
    for _ in range(n):
        key = sel.new_counter(1, rng=zero_source)
        if admission(key, [], first - 1) is not None:
            early += 1
            continue
        zeros.append(admission(key, [units], 64) or 0)
    assert early == 0 or cp_lower(early, n) <= sel.delta_per_key
    assert same_distribution_pvalue(lazy, zeros) > 1e-3


# -- 13. state -------------------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [64, None])
@pytest.mark.parametrize("cut", [0, 1, 4, 9])
def test_sparse_vector_state_round_trip_mid_stream_continues_identically(horizon, cut):
    sel = svt(1.0, 0.4, max_keys_per_unit=2, horizon=horizon)
    first, feed = 3, [1] * 62
    admitted = 0
    for seed in range(6):
        full = sel.new_counter(first, rng=SeededNoise(np.random.default_rng(seed)))
        expected = [full.step(x) for x in feed if full.admitted is None]
        gen = np.random.default_rng(seed)
        head = sel.new_counter(first, rng=SeededNoise(gen))
        got = [head.step(x) for x in feed[:cut] if head.admitted is None]
        state = json.loads(json.dumps(head.to_state()))
        assert state["mechanism"] == "key_selection_sparse_vector" and state["t"] == head.t
        restored = sel.restore(state, rng=gen)
        assert isinstance(restored, KeySparseVector)
        assert (restored.t, restored.admitted) == (head.t, head.admitted)
        got += [restored.step(x) for x in feed[len(got):] if restored.admitted is None]
        assert got == expected
        assert restored.to_state() == full.to_state()
        admitted += full.admitted is not None and full.admitted > first + cut
    assert admitted >= 1


def test_sparse_vector_admitted_state_round_trips_and_pickles():
    sel = svt(1.0, 0.4, horizon=64)
    key = sel.new_counter(2, rng=ZeroNoise())
    assert key.step(1000)
    restored = sel.restore(json.loads(json.dumps(key.to_state())))
    assert (restored.t, restored.admitted) == (2, 2)
    with pytest.raises(ValueError, match="already admitted"):
        restored.step(0)
    fresh = sel.new_counter(1)
    assert isinstance(fresh.noise_source, KeyedNoise)
    fresh.step(0)
    clone = pickle.loads(pickle.dumps(fresh))
    assert clone.to_state() == fresh.to_state()
    assert pickle.loads(pickle.dumps(sel)).threshold(7) == sel.threshold(7)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s: s.update(mechanism="key_selection"), "mechanism"),
        (lambda s: s.update(version=2), "version"),
        (lambda s: s.pop("offset"), "offset"),
        (lambda s: s.pop("count"), "count"),
        (lambda s: s.update(epsilon=2.0), "different selection"),
        (lambda s: s.update(horizon=None), "different selection"),
        (lambda s: s.update(admitted=3), "admitted"),
        (lambda s: s.update(count=-1), "count"),
        (lambda s: s.update(count=1.5), "count"),
        (lambda s: s.update(offset=None), "offset"),
        (lambda s: s.update(offset=float("nan")), "offset"),
        (lambda s: s.update(t=65), "horizon"),
        (lambda s: s.update(t=-1), "t must"),
        (lambda s: s.update(admitted=5, t=5), "must not hold"),
    ],
)
def test_sparse_vector_restore_rejects_foreign_or_broken_states(mutate, match):
    sel = svt(1.0, 1e-6, horizon=64)
    key = sel.new_counter(3, rng=ZeroNoise())
    key.step(0)
    key.step(0)
    state = key.to_state()
    mutate(state)
    with pytest.raises(ValueError, match=match):
        sel.restore(state, rng=ZeroNoise())
