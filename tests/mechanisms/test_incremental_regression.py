"""Private incremental regression (seed 002): the testable properties of spec
private_erm_and_incremental_regression.md §4.5 (TreeMech) and §4.6 (PrivIncReg1,
NoisyProjGrad, PrivIncERM, PrivIncReg2), plus the solvers, states and validation."""

import math

import numpy as np
import pytest
from scipy import optimize

from dp_beam.mechanisms import BinaryTreeMechanism, NoiseSource, ZeroNoise
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
from dp_beam.mechanisms.regression import (L1Ball, L2Ball, NoisyMoments, PrivIncERM,
                                           PrivIncERMParams, PrivIncReg1, PrivIncReg1Params,
                                           PrivIncReg2, PrivIncReg2Params, advanced_composition,
                                           default_tau, encode_point, gram_sensitivity, lift,
                                           noisy_proj_grad, npg_schedule, per_run_budget,
                                           project_features, psd_part, quadratic_value,
                                           solve_quadratic, svec, svec_dim, upper_triangle,
                                           xy_sensitivity)
from dp_beam.mechanisms.regression.moments import treemech_sigma

TEST_SEED = 0   # a test seed: SeededNoise, not private


def _unit_points(rng, n, d, radius=1.0):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0, radius, size=(n, 1))


class _CallIndex(NoiseSource):
    """Draw j (1-based) is the constant vector j: shows which nodes a release sums."""

    def __init__(self):
        self.calls = 0

    def _gaussian(self, sigma, size):
        self.calls += 1
        return np.full(size, float(self.calls))


# -- §4.5 TreeMech ---------------------------------------------------------------------------


def test_tree_node_sets_are_the_dyadic_decomposition():
    tree = BinaryTreeMechanism(epsilon=1.0, noise="gaussian", delta=1e-6, horizon=16)
    as_intervals = lambda t: {(first - 1, last) for first, last, _ in tree.release_nodes(t)}  # noqa: E731
    assert as_intervals(7) == {(0, 4), (4, 6), (6, 7)}
    assert as_intervals(11) == {(0, 8), (8, 10), (10, 11)}
    for t in range(1, 17):
        assert len(tree.release_nodes(t)) == bin(t).count("1") <= tree.levels
    # Each step lies in at most h nodes over the whole horizon.
    nodes = {(f, l) for t in range(1, 17) for f, l, _ in tree.release_nodes(t)}
    assert max(sum(f <= s <= l for f, l in nodes) for s in range(1, 17)) <= 16 .bit_length()


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_without_noise_the_sums_are_the_exact_prefix_sums(counter):
    rng = np.random.default_rng(0)
    mom = NoisyMoments(dim=3, epsilon=1.0, delta=1e-6, horizon=32, counter=counter, rng=ZeroNoise())
    gram, xy = np.zeros((3, 3)), np.zeros(3)
    for t in range(1, 33):
        X = _unit_points(rng, 5, 3)
        y = rng.uniform(-1, 1, size=5)
        enc = [encode_point(x, v) for x, v in zip(X, y)]
        Q, q = mom.step(sum(e[0] for e in enc), sum(e[1] for e in enc))
        gram += X.T @ X
        xy += X.T @ y
        np.testing.assert_allclose(Q, gram, atol=1e-7)
        np.testing.assert_allclose(q, xy, atol=1e-7)


def test_tree_noise_is_drawn_once_per_node_and_reused():
    source = _CallIndex()
    mom = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=16, counter="tree", rng=source)
    d_gram = svec_dim(2)
    releases = []
    for _ in range(8):
        mom.step(np.zeros(d_gram), np.zeros(2))
        releases.append(mom._gram.current())
    # The gram counter makes the odd draws: its node ending at step s carries 2s − 1.
    for t, value in enumerate(releases, start=1):
        expected = sum(2 * last - 1 for _, last, _ in mom._gram.release_nodes(t))
        np.testing.assert_array_equal(value, np.full(d_gram, float(expected)))
    # s_3 − s_2 is node (2, 3]'s noise alone; (0, 2]'s noise is shared by both.
    np.testing.assert_array_equal(releases[2] - releases[1], np.full(d_gram, 5.0))
    assert source.calls == 16   # one draw per step and counter, never a redraw


def test_treemech_sigma_matches_the_spec_and_the_project_calibration_is_within_a_permille():
    for horizon, want in ((1024, 72.0111), (4096, 78.2843), (2 ** 20, 99.4976)):
        assert treemech_sigma(2.0, horizon, 0.5, 5e-7) == pytest.approx(want, abs=1e-4)
        tree = BinaryTreeMechanism(epsilon=0.5, sensitivity=2.0, noise="gaussian", delta=5e-7,
                                   horizon=horizon)
        node_sigma = tree.noise_scales(1)[0]
        assert node_sigma / want == pytest.approx(1.0, abs=2e-3)
        analytic = BinaryTreeMechanism(epsilon=0.5, sensitivity=2.0, noise="gaussian", delta=5e-7,
                                       horizon=horizon, calibration="analytic")
        assert analytic.noise_scales(1)[0] < want


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_released_noise_matches_the_stated_std(counter):
    # R repetitions × D coordinates of i.i.d. Gaussian noise: the sample variance of
    # N = R·D draws has relative standard deviation √(2/N); 5 of them is the tolerance.
    reps, steps, d = 300, 6, 3
    dims = svec_dim(d) + d
    samples = {t: [] for t in range(1, steps + 1)}
    rng = np.random.default_rng(5)
    for r in range(reps):
        mom = NoisyMoments(dim=d, epsilon=1.0, delta=1e-6, horizon=8, counter=counter,
                           rng=np.random.default_rng(1000 + r))
        for t in range(1, steps + 1):
            mom.step(np.zeros(svec_dim(d)), np.zeros(d))
            std_gram, std_xy = mom.noise_std(t)
            samples[t].append(np.concatenate([mom._gram.current() / std_gram,
                                              mom._xy.current() / std_xy]))
    tol = 5 * math.sqrt(2.0 / (reps * dims))
    for t, rows in samples.items():
        z = np.array(rows)
        assert abs(float(np.mean(z * z)) - 1.0) < tol, (t, float(np.mean(z * z)))
        assert abs(float(np.mean(z))) < 5 / math.sqrt(reps * dims)
    del rng
    if counter == "tree":
        # spec §4.5 item 27: the variance is popcount(t)·σ² per coordinate.
        mom = NoisyMoments(dim=d, epsilon=1.0, delta=1e-6, horizon=8, counter="tree", rng=TEST_SEED)
        node = mom._gram.noise_scales(1)[0]
        for t in range(1, 8):
            assert mom.noise_std(t)[0] == pytest.approx(node * math.sqrt(bin(t).count("1")))


# -- sensitivities of the two streams ---------------------------------------------------------


def _worst_pairs(d, rng, n=4000):
    a = _unit_points(rng, n, d)
    b = _unit_points(rng, n, d)
    a[:d], b[:d] = np.eye(d), np.roll(np.eye(d), 1, axis=0)    # orthogonal unit vectors
    a[d:2 * d], b[d:2 * d] = np.eye(d), -np.eye(d)              # antipodal
    return a, b


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_gram_and_xy_replace_sensitivities_by_brute_force(d):
    rng = np.random.default_rng(d)
    a, b = _worst_pairs(d, rng)
    ya, yb = rng.uniform(-1, 1, len(a)), rng.uniform(-1, 1, len(b))
    ya[: 2 * d], yb[: 2 * d] = 1.0, 1.0
    gram = [np.linalg.norm(svec(np.outer(x, x)) - svec(np.outer(z, z))) for x, z in zip(a, b)]
    plain = [np.linalg.norm(upper_triangle(np.outer(x, x)) - upper_triangle(np.outer(z, z)))
             for x, z in zip(a, b)]
    xy = [np.linalg.norm(x * u - z * v) for x, z, u, v in zip(a, b, ya, yb)]
    assert max(gram) <= math.sqrt(2) + 1e-12 and max(plain) <= math.sqrt(2) + 1e-12
    assert max(xy) <= 2.0 + 1e-12
    assert max(xy) == pytest.approx(2.0)                      # x' = −x
    if d >= 2:
        assert max(gram) == pytest.approx(math.sqrt(2))       # orthogonal unit vectors
        assert max(plain) == pytest.approx(math.sqrt(2))
    # svec keeps the Frobenius norm; the encoded (grid-rounded) stream stays within the pad.
    for x, z, u, v in zip(a[:200], b[:200], ya, yb):
        assert np.linalg.norm(svec(np.outer(x, x))) == pytest.approx(np.linalg.norm(np.outer(x, x)))
        (ga, ba), (gb, bb) = encode_point(x, u), encode_point(z, v)
        assert np.linalg.norm(ga - gb) <= gram_sensitivity(d)
        assert np.linalg.norm(ba - bb) <= xy_sensitivity(d)


def test_gram_sensitivity_supremum_by_optimisation():
    # Maximise ‖svec(xxᵀ) − svec(zzᵀ)‖ over the unit ball from random starts: √2, never more.
    rng = np.random.default_rng(1)
    d = 3

    def neg(v):
        x, z = v[:d], v[d:]
        x = x / max(1.0, np.linalg.norm(x))
        z = z / max(1.0, np.linalg.norm(z))
        return -np.linalg.norm(upper_triangle(np.outer(x, x)) - upper_triangle(np.outer(z, z)))

    best = max(-optimize.minimize(neg, rng.normal(size=2 * d), method="Nelder-Mead",
                                  options={"maxiter": 4000, "xatol": 1e-10, "fatol": 1e-12}).fun
               for _ in range(20))
    assert best == pytest.approx(math.sqrt(2), abs=1e-6)


# -- §4.6 PrivIncReg1 ------------------------------------------------------------------------


def test_budget_split_basic_is_two_halves_and_zcdp_is_half_rho_each():
    basic = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=64, counter="tree", split="basic",
                         rng=ZeroNoise())
    assert basic._gram.epsilon == basic._xy.epsilon == 0.5
    assert basic._gram.delta == basic._xy.delta == 5e-7
    assert basic._xy.sensitivity == pytest.approx(2.0) and basic._gram.sensitivity == pytest.approx(math.sqrt(2))
    zcdp = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=64, counter="tree", rng=ZeroNoise())
    # Each counter is ρ/2-zCDP for its true sensitivity: calibrated at (ε, δ) for √2 times it.
    assert zcdp._xy.sensitivity == pytest.approx(2.0 * math.sqrt(2))
    cost = zcdp.privacy_cost()
    assert cost["epsilon"] == 1.0 and cost["delta"] == 1e-6
    assert zcdp._gram.rho == pytest.approx(cost["rho"])
    # The zCDP split adds less noise than the spec's basic split.
    assert zcdp.noise_std(5)[1] < basic.noise_std(5)[1]


def test_gradient_and_exact_solution_without_noise():
    rng = np.random.default_rng(2)
    d = 4
    theta_true = np.array([0.5, -0.3, 0.2, 0.1])
    for C in (L2Ball(0.4), L1Ball(0.6), L2Ball(5.0)):
        mech = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6, constraint=C,
                                             horizon=16), rng=ZeroNoise())
        X_all, y_all = [], []
        for _ in range(16):
            X = _unit_points(rng, 20, d)
            y = np.clip(X @ theta_true + 0.05 * rng.normal(size=20), -1, 1)
            rel = mech.step_points(X, y)
            X_all.append(X)
            y_all.append(y)
        X, y = np.vstack(X_all), np.concatenate(y_all)
        Q, q = mech.statistics()
        th = np.linspace(-1, 1, d)
        # g_t(θ) = 2(Q_tθ − q_t) is the exact gradient of J without noise.
        np.testing.assert_allclose(2 * (Q @ th - q), -2 * X.T @ (y - X @ th), atol=1e-6)
        ref = _reference_constrained_ls(X, y, C)
        J = lambda v: float(np.sum((y - X @ v) ** 2))  # noqa: E731
        assert C.contains(rel.theta)
        assert J(rel.theta) <= J(ref) + 1e-7 * (1 + J(ref))
        # NoisyProjGrad with a large r converges to the same minimum: Prop. B.1 with α = 0
        # bounds the excess by 2‖C‖L/√r.
        r = 40000
        lip = 2 * len(y) * (C.max_norm + 1)
        npg = noisy_proj_grad(C, lambda v: 2 * (Q @ v - q), r, 2 * C.max_norm / (lip * math.sqrt(r)),
                              np.zeros(d))
        assert C.contains(npg)
        assert J(npg) - J(ref) <= 2 * C.max_norm * lip / math.sqrt(r)


def _reference_constrained_ls(X, y, C):
    """An independent QP: SLSQP on the split variables (L1) or with the ball constraint (L2)."""
    d = X.shape[1]
    J = lambda v: float(np.sum((y - X @ v) ** 2))  # noqa: E731
    if isinstance(C, L2Ball):
        res = optimize.minimize(J, np.zeros(d), method="SLSQP",
                                constraints=[{"type": "ineq", "fun": lambda v: C.radius ** 2 - v @ v}],
                                options={"ftol": 1e-14, "maxiter": 2000})
        return C.project(res.x)
    res = optimize.minimize(lambda z: J(z[:d] - z[d:]), np.zeros(2 * d), method="SLSQP",
                            bounds=[(0, None)] * (2 * d),
                            constraints=[{"type": "ineq", "fun": lambda z: C.radius - z.sum()}],
                            options={"ftol": 1e-14, "maxiter": 2000})
    return C.project(res.x[:d] - res.x[d:])


def test_exact_solver_beats_an_independent_qp_on_noisy_indefinite_matrices():
    rng = np.random.default_rng(3)
    for _ in range(40):
        d = int(rng.integers(1, 7))
        A = rng.normal(size=(d, d))
        Q = A @ A.T * rng.uniform(0.1, 50) + rng.normal(size=(d, d)) * 3
        Q = 0.5 * (Q + Q.T)
        q = rng.normal(size=d) * rng.uniform(0.1, 20)
        Qp = psd_part(Q)
        assert np.linalg.eigvalsh(Qp).min() >= -1e-9
        for C in (L2Ball(rng.uniform(0.2, 3)), L1Ball(rng.uniform(0.2, 3))):
            theta, _ = solve_quadratic(Q, q, C)
            assert C.contains(theta)
            start = np.zeros(d)
            ref = optimize.minimize(lambda v: quadratic_value(Qp, q, C.project(v)), start,
                                    method="Nelder-Mead",
                                    options={"maxiter": 20000, "xatol": 1e-10, "fatol": 1e-12})
            assert quadratic_value(Qp, q, theta) <= quadratic_value(Qp, q, C.project(ref.x)) + 1e-7


def test_npg_iterates_and_output_stay_in_the_constraint():
    rng = np.random.default_rng(4)
    Q = rng.normal(size=(3, 3)) * 40      # neither symmetric nor PSD: the noisy case
    q = rng.normal(size=3) * 40
    for C in (L2Ball(0.7), L1Ball(0.7)):
        seen = []

        def grad(v):
            seen.append(v.copy())
            return 2 * (Q @ v - q)
        out = noisy_proj_grad(C, grad, 500, 0.01, np.array([5.0, 5.0, 5.0]))
        assert len(seen) == 500 and all(C.contains(v) for v in seen) and C.contains(out)


def test_npg_schedule_is_the_spec_formula():
    for n, radius, alpha in ((1, 1.0, 0.3), (256, 1.0, 500.0), (4096, 2.0, 1e3)):
        lip = 2 * n * (radius + 1)
        r, eta = npg_schedule(n, radius, alpha)
        assert r == math.ceil(((lip + alpha) / alpha) ** 2)
        assert eta == pytest.approx(2 * radius / ((lip + alpha) * math.sqrt(r)))
    assert npg_schedule(10 ** 6, 1.0, 10.0, max_iterations=1000)[0] == 1000


def test_noisy_proj_grad_meets_the_derived_guarantee_on_simulated_data():
    # spec §2.5, Cor. B.2: excess_t <= 4‖C‖α_t (one record per step, as in the paper).
    rng = np.random.default_rng(7)
    d, T = 3, 256
    C = L2Ball(1.0)
    theta_true = np.array([0.6, -0.4, 0.3])
    X = _unit_points(rng, T, d)
    y = np.clip(X @ theta_true + 0.1 * rng.normal(size=T), -1, 1)
    for counter in ("tree", "blt"):
        mech = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6, constraint=C, horizon=T,
                                             counter=counter, solver="noisy_proj_grad"), rng=11)
        for t in range(1, T + 1):
            mech.update(*encode_point(X[t - 1], y[t - 1]), 1)
            if t in (16, 64, 256):
                rel = mech.model()
                J = lambda v: float(np.sum((y[:t] - X[:t] @ v) ** 2))  # noqa: E731
                best = J(_reference_constrained_ls(X[:t], y[:t], C))
                assert C.contains(rel.theta)
                assert rel.iterations == npg_schedule(t, 1.0, rel.alpha)[0]
                assert J(rel.theta) - best <= 4 * C.max_norm * rel.alpha


# -- §4.6 PrivIncERM ------------------------------------------------------------------------


def test_privincerm_budget_table():
    eps_run, delta_run = per_run_budget(1.0, 1e-6, 100)
    assert eps_run == pytest.approx(0.0092820, abs=5e-8) and delta_run == pytest.approx(5e-9)
    total, total_delta = advanced_composition(eps_run, delta_run, 100, 0.5e-6)
    assert total == pytest.approx(0.517, abs=1e-3) and total <= 1.0
    assert total_delta == pytest.approx(1e-6)
    params = PrivIncERMParams(dim=3, epsilon=1.0, delta=1e-6, horizon=10_000, tau=100)
    assert params.runs == 100 and params.run_epsilon == pytest.approx(eps_run)
    cost = PrivIncERM(params, rng=ZeroNoise()).privacy_cost()
    assert cost["epsilon"] <= 1.0 and cost["delta"] <= 1e-6
    assert default_tau(3, 10_000, 1.0) == math.ceil(30_000 ** (1 / 3))


def test_privincerm_runs_exactly_at_multiples_of_tau_and_repeats_in_between():
    rng = np.random.default_rng(8)
    params = PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=40, tau=10)
    mech = PrivIncERM(params, rng=3)
    thetas, covers = [], []
    for t in range(1, 41):
        rel = mech.step_points(_unit_points(rng, 5, 2), rng.uniform(-1, 1, 5))
        thetas.append(rel.theta)
        covers.append(rel.covers)
    assert covers[:9] == [(0, 0)] * 9 and all(not th.any() for th in thetas[:9])
    for j in range(1, 4):
        block = thetas[10 * j - 1: 10 * j + 9]
        assert covers[10 * j - 1] == (1, 10 * j)
        assert all(np.array_equal(th, block[0]) for th in block)
    assert len({tuple(th) for th in thetas}) == 5
    with pytest.raises(ValueError, match="horizon"):
        mech.step(np.zeros(3), np.zeros(2), 0)


# -- §4.6 PrivIncReg2 -----------------------------------------------------------------------


def test_lift_lands_in_the_constraint_and_satisfies_the_equation():
    rng = np.random.default_rng(9)
    for d, m in ((20, 5), (50, 10)):
        phi = rng.normal(size=(m, d))
        for C in (L2Ball(1.5), L1Ball(1.5)):
            theta_star = C.project(rng.normal(size=d) * (rng.random(d) < 0.2))
            v = phi @ theta_star / math.sqrt(m)
            theta = lift(phi, math.sqrt(m) * v, C)
            assert C.contains(theta)
            np.testing.assert_allclose(phi @ theta, math.sqrt(m) * v, atol=1e-7)
            assert C.minkowski(theta) <= C.minkowski(theta_star) + 1e-9
            if isinstance(C, L2Ball):
                np.testing.assert_allclose(theta, phi.T @ np.linalg.solve(phi @ phi.T, phi @ theta_star),
                                           atol=1e-10)


def test_privincreg2_projection_clipping_restarts_and_space():
    params = PrivIncReg2Params(dim=12, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=64,
                               projection_dim=4)
    mech = PrivIncReg2(params, rng=5)
    phi = mech.projection
    # Drawn at construction, before any record; the same seed gives the same Φ.
    np.testing.assert_array_equal(PrivIncReg2(params, rng=5).projection, phi)
    rng = np.random.default_rng(10)
    sizes = set()
    for t in range(1, 65):
        x = rng.normal(size=12) * (10 ** rng.integers(0, 6))      # adversarial norms
        assert np.linalg.norm(project_features(phi, x)) <= 1.0 + 1e-12
        rel = mech.push(x, rng.normal() * 5)
        assert params.constraint.contains(rel.theta)
        # The release is the lift of its own projection (Φθ = √m·v with v = Φθ/√m ∈ K).
        np.testing.assert_allclose(phi @ rel.theta, phi @ lift(phi, phi @ rel.theta, params.constraint),
                                   atol=1e-8)
        sizes.add(mech.state_size())
    assert len(sizes) == 1                         # BLT: the state does not grow with t
    restored = PrivIncReg2.from_state(mech.to_state(), rng=1)
    np.testing.assert_array_equal(restored.projection, phi)
    with pytest.raises(ValueError, match="projection"):
        PrivIncReg2(params, rng=ZeroNoise())


def test_projection_dim_rule_is_capped_and_grows_with_the_stream():
    small = PrivIncReg2Params(dim=200, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=256,
                              feature_width=3.0, expected_records=1000)
    large = PrivIncReg2Params(dim=200, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=256,
                              feature_width=3.0, expected_records=10 ** 6)
    assert 1 <= small.resolved_projection_dim() < large.resolved_projection_dim() <= 200


# -- every mechanism: lineage, state, validation ----------------------------------------------

MAKERS = {
    "reg1": lambda rng: PrivIncReg1(PrivIncReg1Params(dim=3, epsilon=1.0, delta=1e-6, horizon=24),
                                    rng=rng),
    "reg1-tree-npg": lambda rng: PrivIncReg1(PrivIncReg1Params(
        dim=3, epsilon=1.0, delta=1e-6, horizon=24, counter="tree", solver="noisy_proj_grad"), rng=rng),
    "reg2": lambda rng: PrivIncReg2(PrivIncReg2Params(dim=3, epsilon=1.0, delta=1e-6, horizon=24,
                                                      projection_dim=2, constraint=L1Ball(1.0)),
                                    rng=rng, projection=np.array([[1.0, 0.5, -0.2], [0.1, -1.0, 0.4]])),
    "erm": lambda rng: PrivIncERM(PrivIncERMParams(dim=3, epsilon=1.0, delta=1e-6, horizon=24, tau=4),
                                  rng=rng),
}


def _steps(rng, perturb_from=None):
    data = []
    for t in range(24):
        X = _unit_points(rng, 4, 3)
        y = rng.uniform(-1, 1, 4)
        if perturb_from is not None and t >= perturb_from:
            X, y = -X[::-1], -y[::-1] * 0.3
        data.append((X, y))
    return data


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_models_depend_only_on_data_up_to_their_step(name):
    base = _steps(np.random.default_rng(12))
    later = _steps(np.random.default_rng(12), perturb_from=15)
    a, b = MAKERS[name](np.random.default_rng(99)), MAKERS[name](np.random.default_rng(99))
    ra = [a.step_points(X, y) for X, y in base]
    rb = [b.step_points(X, y) for X, y in later]
    for t in range(15):
        np.testing.assert_array_equal(ra[t].theta, rb[t].theta)
    assert any(not np.array_equal(ra[t].theta, rb[t].theta) for t in range(15, 24))


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_state_round_trip_with_per_step_keyed_noise_is_replay_stable(name):
    # As the release DoFn runs it: restore from the state cell with the step's keyed source.
    key = NoiseKey.from_bytes(bytes(range(32)))
    data = _steps(np.random.default_rng(13))

    def chain():
        state, out = MAKERS[name](KeyedNoise(key, ("open",))).to_state(), []
        for t, (X, y) in enumerate(data):
            mech = type(MAKERS[name](ZeroNoise() if name != "reg2" else 0)).from_state(
                state, rng=KeyedNoise(key, ("step", t)))
            out.append(mech.step_points(X, y))
            state = mech.to_state()
        return out

    first, replay = chain(), chain()
    live = MAKERS[name](KeyedNoise(key, ("step", 0))).step_points(*data[0])
    np.testing.assert_array_equal(live.theta, first[0].theta)
    for a, b in zip(first, replay):
        np.testing.assert_array_equal(a.theta, b.theta)
        assert a.covers == b.covers and a.n == b.n and a.t == b.t
    assert any(np.any(r.theta) for r in first)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_swapping_the_noise_source_in_place_equals_the_state_round_trip(name):
    # The release DoFn swaps each step's keyed source in place instead of restoring the state.
    key = NoiseKey.from_bytes(bytes(range(32)))
    data = _steps(np.random.default_rng(17))
    if not hasattr(MAKERS[name](ZeroNoise() if name != "reg2" else 0), "set_noise_source"):
        pytest.skip("no in-place swap: the transform falls back to the round trip")
    swapped = MAKERS[name](KeyedNoise(key, ("open",)))
    state = MAKERS[name](KeyedNoise(key, ("open",))).to_state()
    for t, (X, y) in enumerate(data):
        restored = type(swapped).from_state(state, rng=KeyedNoise(key, ("step", t)))
        swapped.set_noise_source(KeyedNoise(key, ("step", t)))
        a, b = swapped.step_points(X, y), restored.step_points(X, y)
        np.testing.assert_array_equal(a.theta, b.theta)
        assert (a.t, a.n, a.noise_std_gram, a.alpha) == (b.t, b.n, b.noise_std_gram, b.alpha)
        state = restored.to_state()
    assert swapped.to_state() == state


def test_exact_solver_when_the_psd_part_vanishes():
    # A step of pure noise can leave Q₊ = 0: the minimiser is q scaled to the boundary
    # (the root bracket of the trust-region multiplier is then degenerate).
    rng = np.random.default_rng(5)
    for _ in range(300):
        q = rng.normal(size=5) * rng.uniform(0.1, 100.0)
        radius = rng.uniform(0.5, 5.0)
        theta, _ = solve_quadratic(-np.eye(5) * rng.uniform(0, 3), q, L2Ball(radius))
        np.testing.assert_allclose(theta, q / np.linalg.norm(q) * radius, rtol=1e-12, atol=1e-12)


def test_state_is_bounded_by_the_counters():
    d = 4
    D = svec_dim(d) + d
    blt = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6), rng=TEST_SEED)   # unbounded
    tree = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6, horizon=1024, counter="tree"),
                       rng=TEST_SEED)
    for t in range(1, 600):
        blt.step(np.zeros(svec_dim(d)), np.zeros(d), 0)
        tree.step(np.zeros(svec_dim(d)), np.zeros(d), 0)
        # BLT: (2b + 1) numbers per coordinate and epoch (b <= 5 buffers) plus the running roots.
        assert blt.state_size() <= 12 * D
        assert tree.state_size() <= 1024 .bit_length() * D


def test_parameters_are_validated_naming_the_parameter():
    ok = dict(dim=2, epsilon=1.0, delta=1e-6)
    for bad, name in ((dict(dim=0), "dim"), (dict(epsilon=-1.0), "epsilon"), (dict(delta=None), "delta"),
                      (dict(delta=1.5), "delta"), (dict(constraint="l2"), "constraint"),
                      (dict(counter="honaker"), "counter"), (dict(solver="sgd"), "solver"),
                      (dict(horizon=0), "horizon"), (dict(split="x"), "split"),
                      (dict(beta=1.0), "beta")):
        with pytest.raises(ValueError, match=name):
            PrivIncReg1Params(**{**ok, **bad})
    with pytest.raises(ValueError, match="radius"):
        L2Ball(-1.0)
    with pytest.raises(ValueError, match="radius"):
        L1Ball(float("inf"))
    with pytest.raises(ValueError, match="horizon"):
        PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=None)
    with pytest.raises(ValueError, match="noise"):
        PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=5, noise="coord")
    with pytest.raises(ValueError, match="projection_dim"):
        PrivIncReg2Params(dim=3, epsilon=1.0, delta=1e-6, projection_dim=0)
    mech = PrivIncReg1(PrivIncReg1Params(**ok, horizon=2), rng=TEST_SEED)
    with pytest.raises(ValueError, match="x must have shape"):
        mech.push([1.0, 2.0, 3.0], 0.0)
    mech.push([0.1, 0.2], 0.0)
    mech.push([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="horizon"):
        mech.push([0.1, 0.2], 0.0)
