"""The certified ERM solver (dp_beam.mechanisms.erm.solver).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms.erm import LogisticLoss, solve_erm

from .helpers import UNIT, data


@pytest.mark.parametrize("k,intercept", [(2, True), (2, False), (4, True)])
def test_solver_reaches_certified_gradient_tolerance(k, intercept):
    loss = LogisticLoss(3, list(range(k)), 2.0, intercept)
    X, y = data(200, d=3, k=k, seed=k)
    X = loss.clip(X)
    assert np.all(np.linalg.norm(X, axis=1) <= 2.0 + 1e-12)
    lam = 0.05
    ref = np.random.default_rng(1).normal(size=loss.n_params)
    theta, gnorm = solve_erm(loss, X, y, lam, ref)
    _, grad = loss.value_grad(theta, loss.augment(X), y)
    full = grad + 2 * lam * (theta - ref)
    assert np.linalg.norm(full) == pytest.approx(gnorm)
    assert gnorm <= 0.5 * loss.lipschitz / 200
    # Cross-check against a much tighter independent solve.
    tight, _ = solve_erm(loss, X, y, lam, ref, tol_fraction=1e-8)
    assert np.linalg.norm(theta - tight) <= gnorm / (2 * lam) + 1e-9


def test_replacing_one_record_moves_the_solution_by_at_most_the_sensitivity():
    loss = LogisticLoss(**UNIT)
    lam, n = 0.1, 50
    X, y = data(n, seed=5)
    X = loss.clip(X)
    theta, _ = solve_erm(loss, X, y, lam)
    bound = 2 * loss.lipschitz / (lam * n)
    for i, (x_new, y_new) in enumerate([([1.0, 0.0], 1 - y[0]), ([-0.6, 0.8], 1 - y[3])]):
        X2, y2 = X.copy(), y.copy()
        X2[i * 3], y2[i * 3] = x_new, y_new
        theta2, _ = solve_erm(loss, X2, y2, lam)
        assert np.linalg.norm(theta - theta2) <= bound


class _FailedSolve:
    """Stands for an L-BFGS run that returns a useless point (``x``: x0 ↦ its result)."""

    def __init__(self, x):
        self.x_of = x

    def __call__(self, fun, x0, pgtol):
        return self.x_of(x0.copy())


@pytest.mark.parametrize("failure", [
    lambda x0: x0,                          # no progress at all
    lambda x0: x0 + 1e6,                    # a far worse point: the descent restarts at θ_ref
    lambda x0: np.full_like(x0, np.nan),    # not finite
])
@pytest.mark.parametrize("k,lam", [(2, 0.5), (2, 0.005), (3, 0.02)])
def test_solver_never_raises_and_stays_within_the_certified_radius_when_lbfgs_fails(
        monkeypatch, failure, k, lam):
    # Pathological input for the solver: L-BFGS gives nothing usable. The descent
    # must still end (after at most the public K steps) within r = g/(2λ) of the
    # exact minimiser: the radius the sensitivity 2L/(λn) already covers.
    from dp_beam.mechanisms import erm as erm_module
    loss = LogisticLoss(2, list(range(k)), 1.5, True)
    n = 120
    X, y = data(n, k=k, seed=11)
    X = loss.clip(X * 3.0)                      # many points on the clipping sphere
    ref = np.random.default_rng(2).normal(size=loss.n_params)
    exact, _ = solve_erm(loss, X, y, lam, ref, tol_fraction=1e-9)
    calls = []
    original = loss.value_grad_on

    def counted(Xa, yi):      # the solver evaluates F through value_grad_on's function
        evaluate = original(Xa, yi)
        return lambda theta: calls.append(1) or evaluate(theta)

    monkeypatch.setattr(loss, "value_grad_on", counted)
    monkeypatch.setattr(erm_module.solver, "_lbfgsb", _FailedSolve(failure))
    theta, gnorm = solve_erm(loss, X, y, lam, ref)
    steps = erm_module._descent_steps(loss, lam, n)
    assert 0 < len(calls) <= steps + 3          # the L-BFGS point, θ_ref, the start, K steps
    assert np.all(np.isfinite(theta))
    radius = 0.5 * loss.lipschitz / n / (2 * lam)
    assert np.linalg.norm(theta - exact) <= radius + 1e-9


def test_solver_returns_after_the_public_step_bound_where_the_certificate_is_out_of_reach():
    # tol_fraction = 1e-300 asks for a gradient below rounding: the solver used to
    # run 100 000 steps and raise RuntimeError (a crashed pipeline). Now it stops
    # after at most K gradient steps, and the proven bound places it within
    # r = g/(2λ) of the minimiser (here r is below rounding: it is the minimiser).
    loss = LogisticLoss(n_features=2, classes=[0, 1], feature_bound=1.0, fit_intercept=True)
    X, y = data(64, seed=4)
    X = loss.clip(X)
    theta, gnorm = solve_erm(loss, X, y, 0.3, tol_fraction=1e-300)
    assert gnorm > 1e-300 * loss.lipschitz / 64          # the certificate was not reached
    tight, _ = solve_erm(loss, X, y, 0.3, tol_fraction=1e-10)
    np.testing.assert_allclose(theta, tight, atol=1e-9)
    from dp_beam.mechanisms.erm import _descent_steps
    # K = ⌈ln(n/tol)/−ln(1 − 2λ/β)⌉, β = R̃²/4 + 2λ (binary, R̃² = 1 + 1 with the intercept).
    beta = 0.5 + 0.6
    assert _descent_steps(loss, 0.3, 64, 1e-300) == math.ceil(math.log(64 / 1e-300) / -math.log(1 - 0.6 / beta))
    assert _descent_steps(loss, 0.3, 1, 1.0) == 0


def test_the_descent_bound_holds_from_theta_ref_without_any_certificate():
    # The proof behind the second exit, checked: plain gradient descent from θ_ref
    # (step 1/β) for K steps lands within r of the minimiser, for strong and weak
    # regularisation and a softmax loss.
    from dp_beam.mechanisms.erm import _descent_steps
    for k, lam in ((2, 0.4), (2, 0.01), (3, 0.05)):
        loss = LogisticLoss(2, list(range(k)), 2.0, True)
        n = 80
        X, y = data(n, k=k, seed=k)
        X = loss.clip(X * 2.0)
        Xa = loss.augment(X)
        ref = np.zeros(loss.n_params)
        exact, _ = solve_erm(loss, X, y, lam, ref, tol_fraction=1e-10)
        theta, step = ref.copy(), 1.0 / (loss.smoothness + 2 * lam)
        for _ in range(_descent_steps(loss, lam, n)):
            _, g = loss.value_grad(theta, Xa, y)
            theta = theta - step * (g + 2 * lam * (theta - ref))
        assert np.linalg.norm(theta - exact) <= 0.5 * loss.lipschitz / n / (2 * lam)


def _solves(k, seed):
    # (loss, X, y, lam, ref, tol_fraction) over shapes from one block to a long history.
    rng = np.random.default_rng(seed)
    for d, n, lam, tol in ((2, 4, 0.5, 0.5), (10, 8, 0.1, 0.5), (10, 128, 0.01, 0.5),
                           (100, 64, 0.1, 0.5), (3, 300, 0.05, 1e-6)):
        loss = LogisticLoss(d, list(range(k)), 1.0, fit_intercept=bool(n % 3))
        X = loss.clip(rng.normal(size=(n, d)) * 1.5)
        y = rng.integers(0, k, size=n)
        ref = None if n % 2 else rng.normal(size=loss.n_params) * 0.5
        yield loss, X, y, lam, ref, tol


@pytest.mark.parametrize("k", [2, 3])
def test_remembered_evaluations_give_the_bits_of_recomputing_them(monkeypatch, k):
    from dp_beam.mechanisms.erm import solver
    remembered = [solve_erm(*case) for case in _solves(k, 3)]
    monkeypatch.setattr(solver, "_Remembered", lambda fun: fun)
    for (theta, gnorm), case in zip(remembered, _solves(k, 3)):
        want_theta, want_gnorm = solve_erm(*case)
        assert theta.tobytes() == want_theta.tobytes() and gnorm == want_gnorm


def test_remembered_answers_at_the_first_and_the_last_point_only():
    from dp_beam.mechanisms.erm.solver import _Remembered
    calls = []

    def fun(theta):
        calls.append(theta.copy())
        return float(theta.sum()), theta * 2.0

    f = _Remembered(fun)
    a, b, c = np.zeros(3), np.ones(3), np.full(3, 2.0)
    for theta in (a, b, a, b, c, a, b):
        value, grad = f(theta.copy())
        assert value == float(theta.sum()) and np.array_equal(grad, theta * 2.0)
        grad[:] = -1.0        # a caller changing its gradient changes nothing remembered
    assert [float(t[0]) for t in calls] == [0.0, 1.0, 2.0, 1.0]
    assert f(np.array([-0.0, 0.0, 0.0]))[0] == 0.0 and len(calls) == 5   # bytes, not values


@pytest.mark.parametrize("k", [2, 3])
def test_one_blas_thread_for_lbfgs_gives_the_bits_of_the_default_threads(monkeypatch, k):
    from dp_beam.mechanisms.erm import solver
    libs = solver._scipy_openblas()
    if not libs:
        pytest.skip("SciPy's OpenBLAS is not separately controllable here (threadpoolctl, wheel)")
    before = [lib.num_threads for lib in libs]
    seen = []
    original = solver._lbfgsb

    def lbfgsb(*args):
        seen.append([lib.num_threads for lib in libs])
        return original(*args)

    monkeypatch.setattr(solver, "_lbfgsb", lbfgsb)
    one_thread = [solve_erm(*case) for case in _solves(k, 5)]
    assert seen and all(threads == [1] * len(libs) for threads in seen)
    assert [lib.num_threads for lib in libs] == before       # restored after every solve
    monkeypatch.setattr(solver, "_ONE_THREAD_MAX_PARAMS", 0)
    for (theta, gnorm), case in zip(one_thread, _solves(k, 5)):
        want_theta, want_gnorm = solve_erm(*case)
        assert theta.tobytes() == want_theta.tobytes() and gnorm == want_gnorm
    assert seen[-1] == before


def test_one_blas_thread_is_counted_across_concurrent_solves():
    from dp_beam.mechanisms.erm import solver
    libs = solver._scipy_openblas()
    if not libs:
        pytest.skip("SciPy's OpenBLAS is not separately controllable here (threadpoolctl, wheel)")
    before = [lib.num_threads for lib in libs]
    with solver._one_blas_thread(10):
        with solver._one_blas_thread(10):
            assert [lib.num_threads for lib in libs] == [1] * len(libs)
        assert [lib.num_threads for lib in libs] == [1] * len(libs)   # the outer solve still runs
        with solver._one_blas_thread(solver._ONE_THREAD_MAX_PARAMS + 1):
            assert [lib.num_threads for lib in libs] == [1] * len(libs)
    assert [lib.num_threads for lib in libs] == before
