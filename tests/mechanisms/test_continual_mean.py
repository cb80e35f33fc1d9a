"""Tests of dp_beam.mechanisms.continual_mean (spec withhold_release_and_composition.md §2, §5)."""

import math
import random

import numpy as np
import pytest

from dp_beam.mechanisms import SeededNoise, ZeroNoise
from dp_beam.mechanisms.noise import gaussian_halfwidth
from dp_beam.mechanisms.continual_mean import (
    PRIOR_RATIOS, QUERY_SHARE, ContinualMeanMechanism, ContinualMeanCore, MeanAggregate, MeanParams, MeanStep,
    MultiTreeMean,
    NaiveMean,
    SingleTreeMean, StepNaiveMean, StepPriorMean, UserState, prior_truncation,
    _contiguous_arrays, _hashed_arrays, contribution, element_size, exponential_mechanism,
    grid, median_cost, quantize, release_level, represented_count, withhold_release)


# -- parameters: §2.10 worked values (A6-12, ALG-1, A6-1) ----------------------

def test_config_a_table_alg6():
    p = MeanParams(1000, 16, 1.0, 0.1, neighbours="values", preset="paper")
    assert (p.L, p.tree_levels, p.eps_tree, p.eps_median) == (4, 10, 0.1, 0.125)
    assert p.beta_median == pytest.approx(0.00416667, rel=1e-5)
    assert p.G == {2: 1, 3: 2, 4: 2} and p.k == {2: 702, 3: 791, 4: 791}
    assert [p.gamma[lv] for lv in (2, 3, 4)] == pytest.approx([2.2838, 1.51724, 1.14607], rel=1e-5)
    assert [p.Delta[lv] for lv in (2, 3, 4)] == pytest.approx([8.08731, 11.0466, 16.2080], rel=1e-5)
    assert [p.noise_scale(lv) for lv in p.levels] == pytest.approx(
        [100, 100, 1617.46, 2209.31, 3241.60], rel=1e-5)
    assert [p.activation_threshold(lv) for lv in (2, 3, 4)] == [1404, 3164, 6328]
    # A6-1: (L+1)·ε_B + (L−1)·ε_M <= ε.
    assert 5 * 0.1 + 3 * 0.125 <= 1.0
    assert p.privacy_cost()["epsilon"] == pytest.approx(0.875)


def test_config_b_table_alg6():
    p = MeanParams(20000, 64, 1.0, 0.1, neighbours="values", preset="paper")
    assert (p.L, p.tree_levels) == (6, 15)
    assert p.eps_tree == pytest.approx(0.0714286, rel=1e-5)
    assert p.eps_median == pytest.approx(0.0833333, rel=1e-5)
    assert p.k == {2: 1131, 3: 1264, 4: 1264, 5: 1342, 6: 1397}
    assert [p.Delta[lv] for lv in range(2, 7)] == pytest.approx(
        [8.66280, 11.8581, 17.3557, 24.4057, 34.7653], rel=1e-5)
    assert [p.noise_scale(lv) for lv in p.levels] == pytest.approx(
        [210, 210, 3638.38, 4980.40, 7289.38, 10250.4, 14601.4], rel=1e-5)


def test_baseline_noise_scales_config_a():
    assert NaiveMean(1000, 16, 1.0, rng=ZeroNoise()).eta == pytest.approx(224)
    assert SingleTreeMean(1000, 16, 1.0, 0.5, rng=ZeroNoise()).eta == pytest.approx(1576.22, rel=1e-5)
    eta5 = MultiTreeMean(1000, 16, 1.0, 0.5, rng=ZeroNoise()).eta
    assert [eta5[lv] for lv in range(5)] == pytest.approx(
        [50, 313.891, 480.684, 753.339, 1212.48], rel=1e-5)
    assert NaiveMean(20000, 64, 1.0, rng=ZeroNoise()).eta == pytest.approx(1344)


def test_participation_sensitivities_and_budget():
    v = MeanParams(1000, 16, 1.0, 0.1, neighbours="values", preset="paper")
    p = MeanParams(1000, 16, 1.0, 0.1, neighbours="participation", preset="paper")
    # Presence of a centred element: ½ for levels 0/1, Δ_ℓ (half the values width) for ℓ >= 2.
    assert [p.element_bound[lv] for lv in p.levels] == pytest.approx(
        [0.5, 0.5] + [v.Delta[lv] for lv in (2, 3, 4)])
    assert [v.element_bound[lv] for lv in v.levels] == pytest.approx(
        [1, 1] + [2 * v.Delta[lv] for lv in (2, 3, 4)])
    # One more tree (counts): ε/2 over L+2 trees; count tree L1 sensitivity 2L.
    assert p.n_trees == 6 and p.eps_tree == pytest.approx(1 / 12)
    assert p.count_dim == 8 and p.count_sensitivity() == 8
    assert p.privacy_cost()["epsilon"] <= 1.0 + 1e-12
    # No medians when L <= 1: the trees get all of ε (A6-14).
    small = MeanParams(10, 3, 1.0, neighbours="values", preset="paper")
    assert small.median_levels == [] and small.eps_tree == pytest.approx(0.5)


def test_gaussian_and_vector_composition():
    p = MeanParams(1000, 16, 1.0, 0.1, dim=3, neighbours="values", noise="gaussian", delta=1e-6,
                   preset="paper")
    cost = p.privacy_cost()
    # ρ/2 to the trees, ρ/2 to the d·(L−1) medians; the total converts back to (ε, δ).
    assert cost["rho"] == pytest.approx(p.rho_total)
    assert cost["epsilon"] == pytest.approx(1.0)
    assert p.tree_sensitivity(2) == pytest.approx(math.sqrt(3) * 2 * p.Delta[2])
    lap = MeanParams(1000, 16, 1.0, 0.1, dim=3, neighbours="values", preset="paper")
    # Pure DP, d coordinates: L1 width d·W_ℓ, medians at ε_M/d each (§3.3).
    assert lap.tree_sensitivity(3) == pytest.approx(3 * 2 * lap.Delta[3])
    assert lap.eps_median_coord == pytest.approx(0.125 / 3)


# -- the withhold-release schedule (WR-1..WR-6) ------------------------------------

def test_schedule_releases_at_powers_of_two_with_segment_sums():
    st = UserState()
    xs = list(range(1, 21))
    released = {}
    for x in xs:
        out = withhold_release(st, np.array([float(x)]), top=4, store_upto=8)
        if out["level"] is not None:
            released[out["count"]] = (out["level"], float(out["element"][0]))
        assert (out["sample"] is not None) == (out["count"] <= 8)
    assert released == {1: (0, 1.0), 2: (1, 2.0), 4: (2, 3.0 + 4.0), 8: (3, sum(range(5, 9))),
                        16: (4, sum(range(9, 17)))}  # 17..20 are past 2^L: never released (WR-6)
    for c in range(1, 40):
        r = represented_count(c, 10)
        assert r == 2 ** int(math.log2(c)) and c - r < r                    # WR-3
    assert [represented_count(t, 10) for t in (3, 7, 8)] == [2, 4, 8]        # WR-4 single user
    assert release_level(32, 4) is None and release_level(16, 4) == 4


def _arrivals(order, n_users, m, seed=0):
    rnd = random.Random(seed)
    if order == "round_robin":
        return [u for _ in range(m) for u in range(n_users)]
    if order == "contiguous":
        return [u for u in range(n_users) for _ in range(m)]
    if order == "heavy":
        return [0] * m + [u for u in range(1, n_users) for _ in range(rnd.randint(1, 3))]
    seq = [u for u in range(n_users) for _ in range(rnd.randint(1, m))]
    rnd.shuffle(seq)
    return seq


@pytest.mark.parametrize("order", ["round_robin", "contiguous", "heavy", "random"])
def test_claim_c1_and_one_element_per_level(order):
    m, n = 16, 30
    p = MeanParams(n, m, 1.0, neighbours="values", preset="paper")
    states, per_user_levels = {}, {}
    counts = {}
    N = 0
    for t, u in enumerate(_arrivals(order, n, m), start=1):
        st = states.setdefault(u, UserState(uhash=u))
        agg = contribution(p, st, np.array([0.3]), step=t)
        for lv, c in agg.counts.items():
            per_user_levels.setdefault(u, []).append(lv)
            N += element_size(lv) * c
        counts[u] = st.count
        assert N == sum(represented_count(c, p.L) for c in counts.values())
        assert 2 * N >= t                                                    # Claim C.1
    for levels in per_user_levels.values():
        assert len(levels) == len(set(levels)) <= p.L + 1                  # WR-2


# -- Algorithm 7 (PM-1..PM-5) -------------------------------------------------------

def test_grid_quantizer_and_cost():
    assert [math.ceil(2 ** (lv / 2) / 2) for lv in range(2, 7)] == [1, 2, 2, 3, 4]   # PM-3
    for G in (1, 2, 3, 4):
        ys = np.linspace(0, 1, 1001)
        assert np.max(np.abs(quantize(ys, G) - ys)) <= 1 / (2 * G) + 1e-12
        assert set(np.round(quantize(ys, G), 12)) <= set(np.round(grid(G), 12))
    assert median_cost([0.1, 0.2, 0.9], [0.2]).tolist() == [1.0]


def test_contiguous_arrays_touch_at_most_two_per_user_and_cost_moves_by_two():
    rnd = np.random.default_rng(1)
    store = {(i, i): [rnd.random(1) for _ in range(rnd.integers(1, 6))] for i in range(40)}
    s, k = 4, 10
    means = _contiguous_arrays(store, s, k)
    assert len(means) == k                                                  # PM-1
    # Owners of each array (same walk): a user spans at most 2 arrays (PM-2).
    owners, pos = {}, 0
    for key in sorted(store):
        for _ in store[key][:s]:
            if pos < s * k:
                owners.setdefault(key, set()).add(pos // s)
            pos += 1
    assert max(len(v) for v in owners.values()) <= 2
    cands = grid(3)
    base = median_cost(quantize([m[0] for m in means], 3), cands)
    for key in list(store)[:15]:                                            # PM-4 (values)
        changed = dict(store)
        changed[key] = [1.0 - x for x in store[key]]
        c2 = median_cost(quantize([m[0] for m in _contiguous_arrays(changed, s, k)], 3), cands)
        assert np.max(np.abs(c2 - base)) <= 2


def test_hashed_arrays_cost_moves_by_one_under_add_remove():
    rnd = np.random.default_rng(2)
    store = {(i, 1000 + i): [rnd.random(1) for _ in range(rnd.integers(1, 6))] for i in range(60)}
    s, k, level = 4, 8, 3
    cands = grid(3)
    base = median_cost(quantize([m[0] for m in _hashed_arrays(store, s, k, level)], 3), cands)
    for key in list(store):
        removed = {kk: v for kk, v in store.items() if kk != key}
        c2 = median_cost(quantize([m[0] for m in _hashed_arrays(removed, s, k, level)], 3), cands)
        assert np.max(np.abs(c2 - base)) <= 1


def test_exponential_mechanism_pmf_and_privacy():
    cost = np.array([3.0, 1.0, 2.0, 5.0])
    eps, sens = 1.0, 2.0
    src = SeededNoise(7)
    R = 20000
    draws = np.bincount([exponential_mechanism(cost, eps, sens, src) for _ in range(R)], minlength=4)
    pmf = np.exp(-eps * cost / 4)
    pmf /= pmf.sum()
    # Each frequency is within 5 binomial standard errors of the softmax pmf (PM-5).
    assert np.all(np.abs(draws / R - pmf) <= 5 * np.sqrt(pmf * (1 - pmf) / R))
    # Neighbouring costs (each moves by <= sensitivity): log-ratio of pmfs <= ε.
    rng = np.random.default_rng(3)
    for _ in range(200):
        c2 = cost + rng.uniform(-sens, sens, size=4)
        q = np.exp(-eps * c2 / 4)
        q /= q.sum()
        assert np.max(np.abs(np.log(pmf) - np.log(q))) <= eps + 1e-12
    assert exponential_mechanism(cost, eps, sens, ZeroNoise()) == 1


# -- Algorithm 6 end to end -----------------------------------------------------------

def _round_robin_steps(n_users, m, rng, lo=0.0, hi=1.0):
    data = {u: rng.uniform(lo, hi, size=m) for u in range(n_users)}
    return data, [[(u, data[u][i]) for u in range(n_users)] for i in range(m)]


def test_noise_off_estimate_is_mean_of_represented_samples_values():
    # ε large makes k_ℓ small, so every level activates; Δ_ℓ >= 2^{ℓ−1} so nothing is truncated (A6-11).
    rng = np.random.default_rng(5)
    n, m = 120, 16
    data, steps = _round_robin_steps(n, m, rng, -3.0, 7.0)
    cm = ContinualMeanMechanism(-3.0, 7.0, m, 200.0, max_users=n, neighbours="values", rng=ZeroNoise(), preset="paper")
    for i, batch in enumerate(steps, start=1):
        out = cm.step(batch)
        assert all(cm.active.values())
        rep = represented_count(i, cm.params.L)
        expected = np.mean([data[u][:rep] for u in range(n)])
        assert out.estimate == pytest.approx(expected, abs=1e-9)
        assert out.denominator == n * rep and out.diverse                    # A6-7, A6-8
        assert 2 * out.denominator >= i * n


def test_noise_off_participation_matches_with_exact_counts():
    rng = np.random.default_rng(6)
    n, m = 200, 8
    data, steps = _round_robin_steps(n, m, rng)
    cm = ContinualMeanMechanism(0.0, 1.0, m, 200.0, max_users=n, rng=ZeroNoise(), preset="paper")
    assert cm.params.neighbours == "participation"
    for i, batch in enumerate(steps, start=1):
        out = cm.step(batch)
        rep = represented_count(i, cm.params.L)
        active_rep = sum(element_size(lv) for lv in out.active if lv <= int(math.log2(i)))
        expected = np.mean([data[u][:active_rep] for u in range(n)])
        assert out.estimate == pytest.approx(expected, abs=1e-9)
    assert all(cm.active.values()) and rep == 8


def test_inactive_levels_buffer_until_activation_then_feed_once():
    rng = np.random.default_rng(8)
    n, m = 100, 16
    cm = ContinualMeanMechanism(0.0, 1.0, m, 8.0, max_users=n, neighbours="values", rng=ZeroNoise(), preset="paper")
    p = cm.params
    order = [u for u in range(n) for _ in range(m)]                     # contiguous: A_ℓ grows slowly
    activated_at = {}
    for t, u in enumerate(order, start=1):
        cm.step([(u, rng.random())])
        for lv in p.median_levels:
            if cm.active[lv] and lv not in activated_at:
                activated_at[lv] = t
                assert cm.core.a[lv] >= p.activation_threshold(lv)            # A6-2
                assert lv not in cm.core.buffer                                 # A6-4
        for lv in p.median_levels:                                            # A6-3 monotone
            if cm.active[lv]:
                assert all(cm.active[l2] for l2 in range(2, lv))
    assert activated_at, "some level must activate in this configuration"
    for lv in p.median_levels:
        if not cm.active[lv]:
            assert cm.tree_counts()[lv] == 0


def test_cap_m_ignores_and_counts_and_too_many_users_raises():
    cm = ContinualMeanMechanism(0, 1, 4, 1.0, max_users=2, neighbours="values", rng=ZeroNoise(), preset="paper")
    for _ in range(6):
        cm.step([("a", 0.5)])
    assert cm.ignored == 2 and cm.users["a"].count == 4
    cm.step([("b", 0.5)])
    with pytest.raises(ValueError, match="max_users"):
        cm.step([("c", 0.5)])


def test_too_many_users_raise_before_the_step_consumes_anything():
    cm = ContinualMeanMechanism(0, 1, 4, 1.0, max_users=2, neighbours="values", rng=ZeroNoise())
    cm.step([("a", 0.2)])
    with pytest.raises(ValueError, match="max_users=2.*not consumed"):
        cm.step(iter([("a", 0.4), ("b", 0.6), ("c", 0.8)]))
    # Nothing of the refused step was taken: "a" still has one sample, t did not move.
    assert set(cm.users) == {"a"} and cm.users["a"].count == 1 and cm.core.t == 1
    assert cm.step([("a", 0.4), ("b", 0.6)]).t == 2


@pytest.mark.parametrize("preset,neighbours", [("tuned", "values"), ("tuned", "participation"),
                                               ("paper", "values"), ("paper", "participation")])
def test_the_beam_transform_with_more_users_than_max_users_releases_every_step(preset, neighbours):
    # The engine-free class refuses user max_users + 1; the transform must not crash
    # on it (a crashed job is an observable, data-dependent outcome). It does not
    # count users: its widths come from the declared max_users, so it releases every
    # step of the schedule, with no event dead-lettered for the extra users.
    import apache_beam as beam

    import dp_beam as dpb
    from tests.beam_util import batch_options, collect

    users, m, step = 40, 8, 10.0
    rnd = random.Random(7)
    events = [{"user": f"u{u}", "ts": i * step + 1 + u % 7, "v": rnd.random()}
              for u in range(users) for i in range(m)]
    transform = dpb.ContinualMean(
        user_fn=lambda e: e["user"], value_fn=lambda e: e["v"], lower=0.0, upper=1.0,
        max_samples_per_user=m, epsilon=1.0, step=step, max_users=4, neighbours=neighbours,
        preset=preset, start=0.0, end=m * step, timestamp_fn=lambda e: e["ts"], rng=3)

    def build(p):
        res = p | beam.Create(events) | transform
        return {"releases": res.releases, "invalid": res.invalid, "accounting": res.accounting}
    out = collect(batch_options(), build)
    assert sorted(r.step for r in out["releases"]) == list(range(m))
    assert all(np.all(np.isfinite(r.value)) for r in out["releases"])
    assert out["invalid"] == [] and len(out["accounting"]) == 1
    engine_free = ContinualMeanMechanism(0.0, 1.0, m, 1.0, max_users=4, neighbours=neighbours, preset=preset,
                                rng=SeededNoise(3))
    with pytest.raises(ValueError, match="max_users"):
        engine_free.step([(f"u{u}", 0.5) for u in range(users)])


def test_variance_of_estimate_matches_tree_noise():
    # A6-10: data fixed, no truncation (Δ_ℓ >= 2^{ℓ−1}), so the only randomness
    # in μ̂_t is the tree noise: E = exact mean and Var = Σ popcount·2η²/N².
    # Noise-free estimate vs noisy: the empirical variance over R=1500 runs of
    # a sum of Laplaces (kurtosis <= 6) has relative s.e. <= √(5/1500) ≈ 0.058;
    # 4 s.e. gives the 25 % tolerance below; the mean within 5 s.e.
    rng = np.random.default_rng(9)
    n, m = 150, 4
    data, steps = _round_robin_steps(n, m, rng)
    base = ContinualMeanMechanism(0, 1, m, 200.0, max_users=n, neighbours="values", rng=ZeroNoise(), preset="paper")
    exact = [base.step(b).estimate for b in steps]
    finals, std = [], None
    gen = np.random.default_rng(10)
    for _ in range(1500):
        cm = ContinualMeanMechanism(0, 1, m, 200.0, max_users=n, neighbours="values", rng=gen, preset="paper")
        for b in steps:
            out = cm.step(b)
        finals.append(out.estimate)
        std = out.noise_std
    finals = np.array(finals)
    assert abs(finals.mean() - exact[-1]) <= 5 * std / math.sqrt(len(finals))
    assert finals.std() == pytest.approx(std, rel=0.25 / 2)


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(11)
    _, steps = _round_robin_steps(80, 8, rng)
    a = ContinualMeanMechanism(0, 1, 8, 50.0, max_users=100, rng=SeededNoise(1), preset="paper")
    for b in steps[:3]:
        a.step(b)
    from dp_beam.mechanisms.continual_mean import ContinualMeanCore
    state = a.core.to_state()
    gen_state = a.core.source.generator.bit_generator.state
    b_core = ContinualMeanCore.from_state(a.params, state, a.lower, a.upper, rng=SeededNoise(0))
    b_core.source.generator.bit_generator.state = gen_state
    users = {u: UserState.from_tuple(s.to_tuple()) for u, s in a.users.items()}
    for batch in steps[3:]:
        o1 = a.step(batch)
        agg = None
        for u, x in batch:
            c = contribution(a.params, users[u], a.rescale(x), step=b_core.t + 1)
            agg = c if agg is None else agg.merge(c)
        o2 = b_core.step(agg)
        assert o1.estimate == o2.estimate and o1.diverse == o2.diverse


def test_baselines_noise_off_are_exact():
    rng = random.Random(3)
    n, m = 20, 8
    naive = NaiveMean(n, m, 1.0, rng=ZeroNoise())
    multi = MultiTreeMean(n, m, 1.0, prior=0.5, rng=ZeroNoise())
    single = SingleTreeMean(n, m, 1.0, prior=0.5, rng=ZeroNoise())
    seen = {}
    for t in range(1, n * m + 1):
        u = rng.randrange(n)
        x = rng.random()
        if len(seen.get(u, [])) < m:
            seen.setdefault(u, []).append(x)
        a = naive.step(x, u)
        b = multi.step(x, u)
        c = single.step(x, u)
        assert a == pytest.approx(np.mean([v for vs in seen.values() for v in vs]))
        rep = [v for vs in seen.values() for v in vs[:represented_count(len(vs), 3)]]
        assert b == pytest.approx(np.mean(rep)) and c == pytest.approx(np.mean(rep))


# -- preset "tuned" (the default) ------------------------------------------------------

def test_tuned_defaults_noise_mechanism_and_validation():
    lap = MeanParams(1000, 64, 1.0, horizon=100)
    gau = MeanParams(1000, 64, 1.0, delta=1e-6, horizon=100)
    assert (lap.preset, lap.noise, lap.mechanism) == ("tuned", "laplace", "smooth_binary")
    assert (gau.noise, gau.mechanism) == ("gaussian", "blt")
    assert MeanParams(1000, 64, 1.0).mechanism == "tree"                 # Laplace, no horizon
    assert MeanParams(1000, 64, 1.0, preset="paper", delta=1e-6).mechanism == "tree"
    assert MeanParams(1000, 64, 1.0, neighbours="values").neighbours == "values"
    with pytest.raises(ValueError, match="preset"):
        MeanParams(1000, 64, 1.0, preset="fast")
    with pytest.raises(ValueError, match="delta"):
        MeanParams(1000, 64, 1.0, noise="laplace", delta=1e-6)


@pytest.mark.parametrize("noise,delta", [("laplace", None), ("gaussian", 1e-6)])
@pytest.mark.parametrize("neighbours", ["participation", "values"])
@pytest.mark.parametrize("dim", [1, 3])
def test_tuned_privacy_cost_is_exact_and_matches_the_trees(noise, delta, neighbours, dim):
    p = MeanParams(5000, 512, 0.7, delta=delta, neighbours=neighbours, dim=dim, horizon=50)
    cost = p.privacy_cost()
    assert cost["epsilon"] == pytest.approx(0.7, rel=1e-12)
    core = ContinualMeanCore(p, horizon=50, rng=ZeroNoise())
    trees = list(core.trees.values()) + ([core.count_tree] if core.count_tree is not None else [])
    # What the mechanisms actually built (their own calibration) adds up to the plan.
    assert len(trees) == p.n_trees
    if noise == "laplace":
        assert sum(tr.epsilon for tr in trees) == pytest.approx(cost["epsilon"], rel=1e-12)
    else:
        assert sum(tr.rho for tr in trees) == pytest.approx(cost["rho"], rel=1e-12)
    assert [core.trees[j].sensitivity for j in range(len(p.tree_groups))] == pytest.approx(
        [p.group_sensitivity(j) for j in range(len(p.tree_groups))])
    assert sorted(lv for g in p.tree_groups for lv in g) == p.levels      # each level in one tree
    assert sum(tr.sensitivity for tr in core.trees.values()) == pytest.approx(p.values_sensitivity())


def test_tuned_tight_range_and_trivial_levels():
    part = MeanParams(10_000, 512, 1.0)
    vals = MeanParams(10_000, 512, 1.0, neighbours="values")
    assert part.prior_levels == vals.prior_levels and part.median_levels == []
    for lv in part.levels:
        s = element_size(lv)
        if lv in part.prior_levels:
            # Truncation helps: the centred magnitude is Δ_ℓ < s/2, the width 2Δ_ℓ < s.
            assert part.element_bound[lv] == part.Delta[lv] < s / 2
            assert vals.element_bound[lv] == 2 * vals.Delta[lv] < s
        else:
            # Skipped (2Δ_ℓ >= s, or ℓ <= 1): the raw range, no prior needed.
            assert part.element_bound[lv] == s / 2 and vals.element_bound[lv] == s
    # Participation centring halves every level's sensitivity.
    assert part.values_sensitivity() == pytest.approx(vals.values_sensitivity() / 2)
    # Without truncation the single tree would need Σ s_ℓ/2 = 2^{L−1}.
    assert part.values_sensitivity() < 256


def _neighbour_tree_inputs(params, steps, drop_user, prior_index):
    """Inputs of the value and count trees for a stream, priors forced (conditioning on them)."""
    core = ContinualMeanCore(params, horizon=len(steps), rng=ZeroNoise())
    for lv in params.prior_levels:
        core.active[lv] = True
        core.prior[lv] = np.array([prior_index[lv]])
    seen = {key: [] for key in list(core.trees) + ["count"]}
    for key, tree in list(core.trees.items()) + [("count", core.count_tree)]:
        if tree is None:
            continue
        orig = tree.step
        tree.step = (lambda o, k: (lambda x: (seen[k].append(np.atleast_1d(np.asarray(x, float)).copy()),
                                               o(x))[1]))(orig, key)
    users = {}
    for t, batch in enumerate(steps, start=1):
        agg = MeanAggregate()
        for u, x in batch:
            if u == drop_user:
                continue
            st = users.setdefault(u, UserState(uhash=u))
            if st.count < params.m:
                agg = agg.merge(contribution(params, st, np.array([x]), step=t))
        core.step(agg)
    return {k: np.array(v) for k, v in seen.items()}


@pytest.mark.parametrize("neighbours", ["participation", "values"])
@pytest.mark.parametrize("delta,theta", [(None, 1.0), (1e-6, 1.0), (1e-6, math.inf)])
def test_tuned_sensitivity_audit_under_neighbours(neighbours, delta, theta):
    # Given the priors (the released outputs the trees condition on), removing
    # one user ("participation") or changing its values ("values") moves each
    # value tree's input sequence by at most group_sensitivity(j) in Σ_t ‖·‖₁
    # (which bounds the L2 form too) and the count tree's by count_sensitivity().
    # Laplace: one tree for all levels; Gaussian: one tree per level, so the
    # untruncated levels' samples, fed as they arrive, are audited level by level.
    rnd = np.random.default_rng(12)
    # θ = 1 fixed: 200 users alone would plan no prior, and the audit is about truncated levels.
    p = MeanParams(200, 512, 1.0, neighbours=neighbours, horizon=40, prior_ratio=theta, delta=delta)
    assert p.prior_levels == ([6, 7, 8, 9] if theta == 1.0 else [])
    assert p.immediate == frozenset(p.levels) - frozenset(p.prior_levels)
    n_users = 30
    counts = rnd.integers(1, 513, size=n_users)
    steps = [[] for _ in range(40)]
    for u in range(n_users):
        for t in np.sort(rnd.integers(0, 40, size=counts[u])):
            steps[t].append((u, float(rnd.random())))
    prior = {lv: int(rnd.integers(0, p.G[lv])) for lv in p.prior_levels}
    base = _neighbour_tree_inputs(p, steps, None, prior)
    for victim in range(0, n_users, 3):
        if neighbours == "participation":
            other = _neighbour_tree_inputs(p, steps, victim, prior)
        else:
            flipped = [[(u, 1.0 - x if u == victim else x) for u, x in b] for b in steps]
            other = _neighbour_tree_inputs(p, flipped, None, prior)
        for j in range(len(p.tree_groups)):
            assert np.abs(base[j] - other[j]).sum() <= p.group_sensitivity(j) + 1e-9
        if neighbours == "participation":
            moved = np.abs(base["count"] - other["count"]).sum(axis=0)
            assert np.all(moved <= p.count_weights + 1e-9)
            # Laplace: L1 over coordinates; Gaussian: a coordinate whose changes add
            # up to ≤ v_j moves C·Δ by ≤ v_j·(max column norm) in its own output
            # coordinate, so the L2 form √Σ moved_j² is what the count tree uses.
            size = moved.sum() if delta is None else np.sqrt((moved ** 2).sum())
            assert size <= p.count_sensitivity() + 1e-9


def test_tuned_prior_is_the_previous_release_rounded_to_the_grid():
    rnd = np.random.default_rng(13)
    n, m = 400, 256
    cm = ContinualMeanMechanism(0.0, 1.0, m, 5.0, max_users=n, delta=1e-6, horizon=m, rng=SeededNoise(14))
    p = cm.params
    assert p.prior_levels and cm.core.store == {}
    prev = None
    for t in range(1, m + 1):
        out = cm.step([(u, 0.2 + 0.2 * rnd.random()) for u in range(n)])
        for lv in p.prior_levels:
            if lv in cm.core.prior and cm.active[lv] and (prev is None or not prev[1][lv]):
                # Activated at step t from the release of step t−1 (post-processing only).
                assert prev is not None
                G = p.G[lv]
                want = min(int(np.floor(np.clip(prev[0], 0, 1) * G)), G - 1)
                assert cm.core.prior[lv].tolist() == [want]
        prev = (out.estimate, dict(cm.active))
    assert all(cm.active.values()) and out.diverse
    assert cm.core.store == {}                                            # no samples kept


def _covered(i, active, immediate):
    """0-based indices of a user's first i samples that the released sums cover."""
    out = []
    for lv in active:
        lo, hi = (0, 1) if lv == 0 else (1 << (lv - 1), 1 << lv)      # samples lo+1 … hi
        if lv in immediate:
            out.extend(range(lo, min(hi, i)))                          # fed as they arrive
        elif i >= hi:
            out.extend(range(lo, hi))                                  # withheld until complete
    return out


@pytest.mark.parametrize("neighbours", ["participation", "values"])
def test_tuned_noise_off_estimate_is_mean_of_covered_samples(neighbours):
    # Samples in [0.3, 0.4]: with the exact prior no level sum is clipped.
    rng = np.random.default_rng(15)
    n, m = 60, 128
    data, steps = _round_robin_steps(n, m, rng, 0.3, 0.4)
    # ZeroNoise draws zeros but states the calibrated std: ε = 50 lets the bound activate.
    cm = ContinualMeanMechanism(0.0, 1.0, m, 50.0, max_users=n, neighbours=neighbours, horizon=m, rng=ZeroNoise())
    assert cm.params.prior_levels == [6, 7]
    assert cm.params.immediate == frozenset(range(6))
    for i, batch in enumerate(steps, start=1):
        out = cm.step(batch)
        idx = _covered(i, out.active, cm.params.immediate)
        # Untruncated levels count every sample on arrival, not at powers of two.
        assert len(idx) == min(i, 32) + (32 if i >= 64 and 6 in out.active else 0) + \
            (64 if i >= 128 and 7 in out.active else 0)
        total, N = sum(data[u][idx].sum() for u in range(n)), n * len(idx)
        if out.denominator == pytest.approx(N, abs=1e-6):
            assert out.estimate == pytest.approx(total / N, abs=1e-9)
        else:
            # Participation, early steps: the denominator is floored at its noise's
            # public 95 % half-width, the missing mass filled at the centre ½.
            assert neighbours == "participation" and out.denominator > N
            den = out.denominator
            assert out.estimate == pytest.approx((total + 0.5 * (den - N)) / den, abs=1e-9)
    assert out.denominator == pytest.approx(n * m)
    assert all(cm.active.values()) and out.diverse


def test_tuned_participation_denominator_floor_is_the_count_noise_halfwidth():
    # One user, one sample: the noisy count (noise drawn as zeros) is far below
    # its noise, so the release shrinks toward ½ instead of dividing by noise.
    cm = ContinualMeanMechanism(0.0, 1.0, 64, 1.0, max_users=100, horizon=8, rng=ZeroNoise())
    out = cm.step([("a", 1.0)])
    p, core = cm.params, cm.core
    sd_den = core.count_tree.noise_std(1) / p.count_weights[0] * p.count_unit[0]
    assert p.count_groups[0] == tuple(p.levels) and len(p.count_groups) == 1
    assert out.denominator == pytest.approx(gaussian_halfwidth(sd_den)) and out.denominator > 100
    assert out.estimate == pytest.approx((1.0 + 0.5 * (out.denominator - 1)) / out.denominator)
    paper = ContinualMeanMechanism(0.0, 1.0, 64, 1.0, max_users=100, horizon=8, preset="paper", rng=ZeroNoise())
    assert paper.step([("a", 1.0)]).denominator == 1.0                   # the spec's max(N, 1)


def test_tuned_final_variance_matches_stated_noise_std():
    # Values relation, data fixed and never clipped (samples in [0.3, 0.4]): the
    # estimate's randomness is the value tree's Gaussian noise over the exact N,
    # so Var = noise_std² (stated by the core). The sample variance of R = 600
    # Gaussian draws has relative s.e. √(2/600) ≈ 0.058; 4 s.e. → 23 %.
    rng = np.random.default_rng(16)
    n, m = 40, 128
    data = {u: rng.uniform(0.3, 0.4, size=m) for u in range(n)}
    sizes = [1, 1, 2, 4, 8, 16, 32, 64]
    steps, pos = [], 0
    for k in sizes:
        steps.append([(u, data[u][i]) for u in range(n) for i in range(pos, pos + k)])
        pos += k
    exact = np.mean([data[u] for u in range(n)])
    params = MeanParams(n, m, 50.0, neighbours="values", delta=1e-6, horizon=len(steps))
    # The aggregates do not depend on the noise: build them once, rerun only the core.
    users, aggs = {}, []
    for t, b in enumerate(steps, start=1):
        agg = MeanAggregate()
        for u, x in b:
            agg = agg.merge(contribution(params, users.setdefault(u, UserState(uhash=u)), np.array([x]), t))
        aggs.append(agg)
    gen = np.random.default_rng(17)
    finals = []
    for _ in range(600):
        core = ContinualMeanCore(params, horizon=len(steps), rng=gen)
        for agg in aggs:
            out = core.step(agg)
        assert all(core.active.values())
        finals.append(out.estimate)
    finals = np.array(finals)
    assert abs(finals.mean() - exact) <= 5 * out.noise_std / math.sqrt(len(finals))
    assert finals.std() == pytest.approx(out.noise_std, rel=0.23)


def test_level_plan_picks_the_prior_ratio_from_public_inputs():
    # Many users: every level with a useful truncation takes a prior (θ = 1).
    many = MeanParams(10_000, 512, 1.0, horizon=365)
    assert many.prior_ratio_used == 1.0 and many.prior_levels == [6, 7, 8, 9]
    assert many.planned_error()[1] == many.levels
    # A few hundred users cannot make a release precise enough for any prior
    # at ε = 1 with Laplace noise: every level is plain (as Algorithm 2).
    few = MeanParams(200, 512, 1.0, horizon=365)
    assert few.prior_ratio_used == math.inf and few.prior_levels == []
    assert all(few.element_bound[lv] == element_size(lv) / 2 for lv in few.levels)
    # The plan is a function of the declared configuration only.
    again = MeanParams(200, 512, 1.0, horizon=365)
    assert (again.prior_ratio_used, again.eps_level) == (few.prior_ratio_used, few.eps_level)
    # Forced θ: used as given, and the planned activations shrink with the users.
    forced = MeanParams(200, 512, 1.0, horizon=365, prior_ratio=1.0)
    assert forced.prior_ratio_used == 1.0 and forced.prior_levels == [6, 7, 8, 9]
    assert forced.planned_error()[1] == [0, 1, 2, 3, 4, 5]
    assert forced.planned_error()[0] > few.planned_error()[0]
    assert MeanParams(200, 512, 1.0, prior_ratio=math.inf).prior_levels == []
    for bad in (0, -1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="prior_ratio"):
            MeanParams(200, 512, 1.0, prior_ratio=bad)
    with pytest.raises(ValueError, match="prior_ratio"):
        MeanParams(200, 512, 1.0, preset="paper", prior_ratio=1.0)
    with pytest.raises(ValueError, match="tuned"):
        MeanParams(200, 512, 1.0, preset="paper").planned_error()


@pytest.mark.parametrize("noise,delta", [("laplace", None), ("gaussian", 1e-6)])
@pytest.mark.parametrize("neighbours", ["participation", "values"])
def test_every_planned_layout_spends_exactly_epsilon(noise, delta, neighbours):
    # The plan only chooses among layouts; each one is calibrated to the whole budget.
    queries = (False, True) if neighbours == "values" else (False,)
    for theta, query in [(t, q) for t in PRIOR_RATIOS for q in queries if not (q and math.isinf(t))]:
        p = MeanParams(800, 1024, 0.8, delta=delta, neighbours=neighbours, horizon=64, prior_ratio=theta,
                       prior_query=query)
        assert p.privacy_cost()["epsilon"] == pytest.approx(0.8, rel=1e-12)
        assert p.query is query and ("query" in p.eps_level) is query
        if query:
            # The query takes its fixed share of ε (Laplace) or ρ (Gaussian).
            assert (p.eps_level["query"] == pytest.approx(QUERY_SHARE * 0.8) if delta is None else
                    p.rho_level["query"] == pytest.approx(QUERY_SHARE * p.rho_total))
        for lv in p.levels:
            s = element_size(lv)
            assert p.element_bound[lv] <= (s / 2 if neighbours == "participation" else s)


@pytest.mark.parametrize("noise,delta", [("laplace", None), ("gaussian", 1e-6)])
@pytest.mark.parametrize("n", [100, 3000])
def test_planned_activations_happen_under_the_plans_model(noise, delta, n):
    # The plan's model: n users, each with m samples. Under "values" with
    # noise drawn as zeros the core's activation bound is computed from the
    # same public stds, so every level the plan activates does activate (the
    # plan evaluates the counters' noise at the horizon, its largest value).
    m, T = 256, 16
    p = MeanParams(n, m, 1.0, neighbours="values", delta=delta, horizon=T, prior_ratio=1.0)
    planned = p.planned_error()[1]
    core = ContinualMeanCore(p, horizon=T, rng=ZeroNoise())
    users = {u: UserState(uhash=u) for u in range(n)}
    for t in range(1, T + 1):
        agg = MeanAggregate()
        for u in range(n):
            for _ in range(m // T):
                agg = agg.merge(contribution(p, users[u], np.array([0.3]), step=t))
        out = core.step(agg)
    assert set(planned) <= set(out.active)
    assert (len(planned) < len(p.levels)) == (n == 100)


# -- per-time-step baselines ------------------------------------------------------------

@pytest.mark.parametrize("neighbours", ["participation", "values"])
@pytest.mark.parametrize("noise,delta", [("laplace", None), ("gaussian", 1e-6)])
def test_step_naive_mean_noise_off_and_budget(neighbours, noise, delta):
    rnd = random.Random(4)
    m, T = 5, 12
    b = StepNaiveMean(-10.0, 10.0, m, 0.8, neighbours=neighbours, noise=noise, delta=delta,
                      horizon=T, rng=ZeroNoise())
    assert b.privacy_cost()["epsilon"] == pytest.approx(0.8, rel=1e-12)
    # Sensitivity: m per user (values); centred sum m/2 and count m (participation).
    want = [m] if neighbours == "values" else [m / 2, m]
    got = [b.sum_tree.sensitivity] + ([b.count_tree.sensitivity] if b.count_tree else [])
    assert got == want
    used = {}
    for _ in range(T):
        batch = [(rnd.randrange(6), rnd.uniform(-12, 12)) for _ in range(rnd.randrange(0, 5))]
        est = b.step(batch)
        for u, x in batch:
            if len(used.setdefault(u, [])) < m:
                used[u].append(min(max(x, -10.0), 10.0))
        flat = [x for xs in used.values() for x in xs]
        assert est == pytest.approx(np.mean(flat) if flat else 0.0, abs=1e-9)


@pytest.mark.parametrize("trees", ["single", "multi"])
def test_step_prior_mean_noise_off_and_calibration(trees):
    rnd = random.Random(5)
    n, m = 20, 8
    b = StepPriorMean(0.0, 1.0, m, 1.0, prior=0.5, max_users=n, trees=trees, horizon=40, rng=ZeroNoise())
    E, _, _, W = prior_truncation(n, m)
    if trees == "single":
        assert b.trees["all"].sensitivity == pytest.approx(E * max(W.values()))     # eq. (5)
    else:
        assert [b.trees[lv].sensitivity for lv in range(E)] == pytest.approx([W[lv] for lv in range(E)])
        assert all(t.epsilon == pytest.approx(1.0 / E) for t in b.trees.values())  # eq. (7)
    assert b.privacy_cost()["epsilon"] == pytest.approx(1.0)
    seen = {}
    for _ in range(40):
        batch = [(rnd.randrange(n), rnd.random()) for _ in range(rnd.randrange(1, 6))]
        est = b.step(batch)
        for u, x in batch:
            if len(seen.setdefault(u, [])) < m:
                seen[u].append(x)
        rep = [v for vs in seen.values() for v in vs[:represented_count(len(vs), 3)]]
        assert est == pytest.approx(np.mean(rep), abs=1e-9)     # Δ_ℓ >= 2^{ℓ−1}: nothing clipped


# -- prior query (tuned, values) --------------------------------------------------------

def test_plan_takes_the_prior_query_with_few_users_under_values_only():
    # 300 users: the release never gets precise enough for the top levels, a
    # one-off mean of user means does; 10,000 users: the release suffices.
    few = MeanParams(300, 512, 1.0, neighbours="values", horizon=366)
    assert few.query and few.prior_levels and few.query_target > 0
    assert few.planned_error()[0] < MeanParams(300, 512, 1.0, neighbours="values", horizon=366,
                                               prior_query=False).planned_error()[0]
    assert not MeanParams(10_000, 512, 1.0, neighbours="values", horizon=366).query
    assert not MeanParams(300, 512, 1.0, horizon=366).query                 # participation
    with pytest.raises(ValueError, match="prior_query"):
        MeanParams(300, 512, 1.0, horizon=366, prior_query=True)             # needs "values"
    with pytest.raises(ValueError, match="prior_query"):
        MeanParams(300, 512, 1.0, neighbours="values", preset="paper", prior_query=True)
    with pytest.raises(ValueError, match="prior_query"):
        MeanParams(300, 512, 1.0, neighbours="values", prior_query=1)
    with pytest.raises(ValueError, match="prior_query"):
        MeanParams(300, 512, 1.0, neighbours="values", prior_query=True, prior_ratio=math.inf)
    # Asked for the query with too few samples per user for any level to take a prior, at
    # every ratio the plan would try (it used to fail inside the plan's comparison).
    with pytest.raises(ValueError, match="prior_query=True needs a level with a prior"):
        MeanParams(40, 32, 5.0, neighbours="values", prior_query=True)
    assert MeanParams(40, 64, 5.0, neighbours="values", prior_query=True).prior_levels == [6]


def test_prior_query_answers_once_with_the_mean_of_user_means():
    rng = np.random.default_rng(21)
    n, m = 60, 128
    data, steps = _round_robin_steps(n, m, rng, 0.3, 0.4)
    cm = ContinualMeanMechanism(0.0, 1.0, m, 50.0, max_users=n, neighbours="values", horizon=m,
                       prior_ratio=1.0, prior_query=True, rng=ZeroNoise())
    p = cm.params
    assert p.prior_levels == [6, 7]
    fired = None
    for i, batch in enumerate(steps, start=1):
        release_bound = cm.core.last_bound
        out = cm.step(batch)
        k = represented_count(i, p.L)                   # every user's released samples
        bound = p.query_bound(n, n / k)
        if fired is None:
            # Fires at the first step whose public bound reaches the target, not before.
            assert (cm.core.query is not None) == (bound <= p.query_target)
            if cm.core.query is not None:
                fired = i
                est, qbound, t = cm.core.query
                assert t == i and qbound == pytest.approx(bound)
                # Noise off: the mean over users of each user's mean of its first k samples.
                assert est[0] == pytest.approx(np.mean([data[u][:k].mean() for u in range(n)]), abs=1e-12)
                for lv in p.prior_levels:
                    if p.gamma[lv] >= qbound and qbound < release_bound:
                        # The query's answer, rounded to the level's grid, is the prior.
                        assert lv in out.active
                        assert cm.core.prior[lv].tolist() == [min(int(est[0] * p.G[lv]), p.G[lv] - 1)]
        else:
            assert cm.core.query[2] == fired                    # answered once, kept
    assert fired is not None and all(cm.active.values())


def test_prior_query_sum_moves_by_at_most_one_per_user_under_values():
    # Changing one user's values moves the running Σ_u m_u by at most 1 at every
    # step (its mean lies in [0, 1]), and the trigger, a function of arrival
    # times only, fires at the same step.
    rnd = np.random.default_rng(22)
    p = MeanParams(300, 512, 1.0, neighbours="values", horizon=40, prior_query=True, prior_ratio=1.5)
    n_users = 30
    steps = [[] for _ in range(40)]
    for u in range(n_users):
        for t in np.sort(rnd.integers(0, 40, size=int(rnd.integers(1, 513)))):
            steps[t].append((u, float(rnd.random())))

    def trace(stream):
        core = ContinualMeanCore(p, horizon=len(stream), rng=ZeroNoise())
        users, sums, when = {}, [], None
        for t, batch in enumerate(stream, start=1):
            agg = MeanAggregate()
            for u, x in batch:
                st = users.setdefault(u, UserState(uhash=u))
                if st.count < p.m:
                    agg = agg.merge(contribution(p, st, np.array([x]), step=t))
            core.step(agg)
            sums.append(core.prefix_mean[0])
            if core.query is not None and when is None:
                when = core.query[2]
        return np.array(sums), when

    base, when = trace(steps)
    for victim in range(0, n_users, 3):
        flipped = [[(u, 1.0 - x if u == victim else x) for u, x in b] for b in steps]
        other, when_other = trace(flipped)
        assert np.max(np.abs(base - other)) <= 1.0 + 1e-9
        assert when_other == when


# -- user spread (tuned) ------------------------------------------------------------------

def test_user_spread_widens_every_truncated_level_and_keeps_the_budget():
    base = MeanParams(10_000, 4096, 1.0, horizon=64, prior_ratio=1.0)
    wide = MeanParams(10_000, 4096, 1.0, horizon=64, prior_ratio=1.0, user_spread=0.06)
    assert wide.prior_levels and set(wide.prior_levels) <= set(base.prior_levels)
    for lv in wide.prior_levels:
        s = element_size(lv)
        assert wide.Delta[lv] == pytest.approx(base.Delta[lv] + 0.06 * s)
        assert wide.element_bound[lv] == pytest.approx(wide.Delta[lv]) and wide.Delta[lv] < s / 2
    assert wide.privacy_cost()["epsilon"] == pytest.approx(1.0, rel=1e-12)
    # A level that the spread leaves no room to clip takes no prior.
    assert MeanParams(10_000, 4096, 1.0, horizon=64, prior_ratio=1.0, user_spread=0.5).prior_levels == []
    for bad in (-0.1, 1.0, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="user_spread"):
            MeanParams(100, 64, 1.0, user_spread=bad)
    with pytest.raises(ValueError, match="user_spread"):
        MeanParams(100, 64, 1.0, preset="paper", user_spread=0.1)


def test_user_spread_stops_clipping_users_whose_means_differ():
    # One user in eight has mean 0.536, the others 0.25 (samples ±0.1 around
    # them; noise drawn as zeros, ε large so every level activates at the
    # exact prior). The minority's level sums sit 0.25·s above the common
    # mean: beyond Δ_9 ≈ 45 of s = 256 without a spread, so they are clipped;
    # user_spread = 0.2 widens Δ_9 to ≈ 96 and Δ_8 to ≈ 58 (> 0.25·128).
    n, m = 160, 512
    rng = np.random.default_rng(23)
    means = np.where(np.arange(n) % 8 == 0, 0.25 + 2 / 7, 0.25)
    data = {u: means[u] + rng.uniform(-0.1, 0.1, size=m) for u in range(n)}
    steps = [[(u, data[u][i]) for u in range(n)] for i in range(m)]
    exact = np.mean([data[u] for u in range(n)])
    ends = {}
    for spread in (0.0, 0.2):
        cm = ContinualMeanMechanism(0.0, 1.0, m, 1e4, max_users=n, neighbours="values", horizon=m,
                           prior_ratio=1.0, prior_query=False, user_spread=spread, rng=ZeroNoise())
        assert {8, 9} <= set(cm.params.prior_levels)
        for batch in steps:
            out = cm.step(batch)
        assert all(cm.active.values())
        ends[spread] = out.estimate
    assert ends[0.0] < exact - 1e-3                                # the minority clipped down
    assert ends[0.2] == pytest.approx(exact, abs=1e-9)


def test_keyed_noise_runs_the_median_prior_and_replays_bit_for_bit():
    """The transforms run the mean with KeyedNoise; the paper preset's median
    prior (exponential mechanism) used to raise for that source. Two runs with
    one key release identical numbers (replay stability); another key differs."""
    from dp_beam.mechanisms import KeyedNoise, NoiseKey

    rng = np.random.default_rng(5)
    n, m = 120, 16
    _, steps = _round_robin_steps(n, m, rng, -3.0, 7.0)

    def run(key_bytes):
        cm = ContinualMeanMechanism(-3.0, 7.0, m, 200.0, max_users=n, neighbours="values", preset="paper",
                           rng=KeyedNoise(NoiseKey.from_bytes(key_bytes), ("mean", "k")))
        outs = [cm.step(batch).estimate for batch in steps]
        return outs, cm

    first, cm = run(bytes(32))
    assert any(len(v) for v in cm.core.prior.values())     # a prior was drawn
    assert first == run(bytes(32))[0]
    assert first != run(bytes(range(32)))[0]


@pytest.mark.parametrize("preset,noise", [("tuned", "laplace"), ("tuned", "gaussian"),
                                          ("paper", "laplace")])
def test_noise_source_swap_in_place_equals_state_round_trip(preset, noise):
    """The release DoFn gives every step its own keyed source by ``set_noise_source`` (no
    state round trip): the outputs must be those of ``from_state(to_state(), source)``."""
    from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

    key = NoiseKey.from_bytes(bytes(range(32)))
    rng = np.random.default_rng(12)
    _, steps = _round_robin_steps(60, 8, rng)
    delta = 1e-6 if noise == "gaussian" else None
    driver = ContinualMeanMechanism(0, 1, 8, 2.0, max_users=100, rng=ZeroNoise(), preset=preset,
                           noise=noise, delta=delta)
    params = driver.params
    aggregates = []
    for batch in steps:
        agg = None
        for u, x in batch:
            state = driver.users.setdefault(u, UserState())
            c = contribution(params, state, driver.rescale(x), step=len(aggregates) + 1)
            agg = c if agg is None else agg.merge(c)
        aggregates.append(agg if agg is not None else MeanAggregate())
    swapped = ContinualMeanCore(params, horizon=len(steps), rng=KeyedNoise(key, ("open",)))
    restored = ContinualMeanCore(params, horizon=len(steps), rng=KeyedNoise(key, ("open",)))
    assert swapped.can_swap_source()
    for t, agg in enumerate(aggregates):
        swapped.set_noise_source(KeyedNoise(key, ("step", t)))
        restored = ContinualMeanCore.from_state(params, restored.to_state(), rng=KeyedNoise(key, ("step", t)))
        a, b = swapped.step(agg), restored.step(agg)
        assert np.array_equal(np.atleast_1d(a.estimate), np.atleast_1d(b.estimate))
        assert (a.noise_std, a.diverse, a.t) == (b.noise_std, b.diverse, b.t)
    assert swapped.to_state() == restored.to_state()


# -- fast paths: floats for d = 1, the same bits as the array paths ---------------------------


def _hex(value):
    return [float(v).hex() for v in np.ravel(value)]


def _scalar_stream(params, users, steps, seed):
    """Per step, the users' samples in [0, 1] (a user sends 0 to 3 samples a step)."""
    rnd = random.Random(seed)
    means = {u: rnd.uniform(0.1, 0.9) for u in range(users)}
    return [[(u, min(max(rnd.gauss(means[u], 0.2), 0.0), 1.0))
             for u in range(users) for _ in range(rnd.choice((0, 1, 1, 2, 3)))]
            for _ in range(steps)]


@pytest.mark.parametrize("config", [
    dict(max_users=200, max_samples_per_user=256, epsilon=20.0),
    dict(max_users=200, max_samples_per_user=256, epsilon=20.0, neighbours="values"),
    dict(max_users=2000, max_samples_per_user=72, epsilon=1.0),
    dict(max_users=200, max_samples_per_user=64, epsilon=20.0, noise="gaussian", delta=1e-6),
    dict(max_users=150, max_samples_per_user=32, epsilon=40.0, preset="paper"),
    dict(max_users=150, max_samples_per_user=32, epsilon=40.0, preset="paper", neighbours="values"),
])
def test_float_samples_and_scalar_core_are_bit_for_bit_the_array_paths(config):
    """With d = 1 a sample given as a float takes the scalar schedule
    (``aggregate._contribution_scalar``) and the core computes on floats (``_scalar``); the
    aggregates, every released field, the states and the noise draws equal those of the array
    paths (1-element arrays) to the last bit, here with levels that activate mid-stream."""
    params = MeanParams(**config)
    stream = _scalar_stream(params, users=60, steps=40, seed=5)
    states = {"float": {}, "array": {}}
    cores = {"float": ContinualMeanCore(params, 0.0, 4.0, rng=SeededNoise(11)),
             "array": ContinualMeanCore(params, 0.0, 4.0, rng=SeededNoise(11))}
    cores["array"]._scalar = False
    activated = set()
    for t, samples in enumerate(stream):
        outs = {}
        for path, core in cores.items():
            agg = MeanAggregate()
            for u, x in samples:
                state = states[path].setdefault(u, UserState(uhash=1000 + u))
                sample = x if path == "float" else np.array([x])
                agg = agg.merge(contribution(params, state, sample, step=t))
            if path == "float":
                assert all(type(v) is float for v in agg.low.values())
                float_agg = agg
            else:
                assert sorted(agg.low) == sorted(float_agg.low)
                assert [_hex(agg.low[lv]) for lv in sorted(agg.low)] == \
                    [_hex(float_agg.low[lv]) for lv in sorted(agg.low)]
            outs[path] = core.step(agg)
        a, b = outs["float"], outs["array"]
        for field in MeanStep.__slots__:
            va, vb = getattr(a, field), getattr(b, field)
            if field in ("estimate", "noise_std", "ci95", "denominator"):
                assert type(va) is float and _hex(va) == _hex(vb), (t, field)
            else:
                assert va == vb, (t, field)
        activated.update(a.active)
        assert cores["float"].to_state().keys() == cores["array"].to_state().keys()
        assert repr(cores["float"].to_state()) == repr(cores["array"].to_state())
    assert {u: s.to_tuple() for u, s in states["float"].items()} == \
        {u: s.to_tuple() for u, s in states["array"].items()}
    if params.median_levels or config["max_users"] == 200:
        # Some level with a prior activates within the stream (its prior then applies).
        assert activated & set(params.prior_levels)


def test_public_noise_figures_are_the_counters_own():
    """The core's shared cache of noise stds and half-widths returns what each counter
    computes itself, for every step and mechanism (they are public functions of t)."""
    from dp_beam.mechanisms.continual_mean.core import _config_token, _public_noise
    from dp_beam.mechanisms.counting.registry import MECHANISMS

    for name, cls in MECHANISMS.items():
        for horizon in (40, None):
            kw = dict(epsilon=0.5, sensitivity=2.0, horizon=horizon, rng=3)
            if name != "tree" and name != "honaker" and name != "smooth_binary":
                kw.update(noise="gaussian", delta=1e-6)
            tree = cls(**kw)
            token = _config_token(tree)
            for t in range(1, 41):
                tree.step(1.0)
                assert _public_noise(tree, token, t, "std") == tree.noise_std(t)
                assert _public_noise(tree, token, t, "ci") == tree.ci_halfwidth(t)


def test_tuned_scalar_core_reads_its_last_counts_and_release_as_the_arrays_of_the_state():
    # The d = 1 participation core keeps the step's noisy counts (a list) and release (a
    # float) as they are and makes arrays only when read: the same arrays, the same state.
    rng = np.random.default_rng(5)
    _, steps = _round_robin_steps(40, 8, rng)
    a = ContinualMeanMechanism(0, 1, 8, 5.0, max_users=50, rng=SeededNoise(3))
    assert a.core._scalar and a.params.participation and a.core.noisy_counts is None
    for b in steps[:6]:
        out = a.step(b)
        core = a.core
        assert isinstance(core.noisy_counts, np.ndarray)
        assert core.noisy_counts.tolist() == core._nc
        assert core.last_est01.dtype == np.float64 and core.last_est01.shape == (1,)
        assert core.last_est01.tolist() == [out.estimate]      # bounds [0, 1]: the same units
        state = core.to_state()
        again = ContinualMeanCore.from_state(a.params, state, a.lower, a.upper, rng=SeededNoise(0))
        assert again.to_state().keys() == state.keys()
        assert np.array_equal(again.noisy_counts, core.noisy_counts)
        assert np.array_equal(again.last_est01, core.last_est01)
