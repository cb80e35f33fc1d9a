"""The regression solvers (dp_beam.mechanisms.regression.solvers): exact constrained least
squares, NoisyProjGrad and the lift (spec §4.6).
"""

import math

import numpy as np
import pytest
from scipy import optimize

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.regression import (
    L1Ball,
    L2Ball,
    PrivIncReg1,
    PrivIncReg1Params,
    encode_point,
    lift,
    noisy_proj_grad,
    npg_schedule,
    psd_part,
    quadratic_value,
    solve_quadratic,
)

from .helpers import unit_points


def test_gradient_and_exact_solution_without_noise():
    rng = np.random.default_rng(2)
    d = 4
    theta_true = np.array([0.5, -0.3, 0.2, 0.1])
    for C in (L2Ball(0.4), L1Ball(0.6), L2Ball(5.0)):
        mech = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6, constraint=C,
                                             horizon=16), rng=ZeroNoise())
        X_all, y_all = [], []
        for _ in range(16):
            X = unit_points(rng, 20, d)
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
    X = unit_points(rng, T, d)
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


def test_exact_solver_when_the_psd_part_vanishes():
    # A step of pure noise can leave Q₊ = 0: the minimiser is q scaled to the boundary
    # (the root bracket of the trust-region multiplier is then degenerate).
    rng = np.random.default_rng(5)
    for _ in range(300):
        q = rng.normal(size=5) * rng.uniform(0.1, 100.0)
        radius = rng.uniform(0.5, 5.0)
        theta, _ = solve_quadratic(-np.eye(5) * rng.uniform(0, 3), q, L2Ball(radius))
        np.testing.assert_allclose(theta, q / np.linalg.norm(q) * radius, rtol=1e-12, atol=1e-12)
