"""The certified ERM solver (dp_beam.mechanisms.erm.solver).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import math
import os

import numpy as np
import pytest

from dp_beam.mechanisms.erm import LogisticLoss, solve_erm

from .helpers import UNIT, data


@pytest.mark.parametrize("newton", [True, False], ids=["newton", "lbfgs"])
@pytest.mark.parametrize("k,intercept", [(2, True), (2, False), (4, True)])
def test_solver_reaches_certified_gradient_tolerance(monkeypatch, k, intercept, newton):
    from dp_beam.mechanisms.erm import solver
    if not newton:    # the first stage of problems above _NEWTON_MAX_PARAMS parameters
        monkeypatch.setattr(solver, "_NEWTON_MAX_PARAMS", 0)
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
    """Stands for a first stage that returns a useless point (``x``: θ_ref ↦ its result)."""

    def __init__(self, x):
        self.x_of = x

    def __call__(self, loss, fun, Xa, yi, lam, ref, gtol):
        return self.x_of(ref.copy())


@pytest.mark.parametrize("failure", [
    lambda x0: x0,                          # no progress at all
    lambda x0: x0 + 1e6,                    # a far worse point: the descent restarts at θ_ref
    lambda x0: np.full_like(x0, np.nan),    # not finite
])
@pytest.mark.parametrize("k,lam", [(2, 0.5), (2, 0.005), (3, 0.02)])
def test_solver_never_raises_and_stays_within_the_certified_radius_when_the_first_stage_fails(
        monkeypatch, failure, k, lam):
    # Pathological input for the solver: the first stage gives nothing usable. The descent
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
    monkeypatch.setattr(erm_module.solver, "_first_stage", _FailedSolve(failure))
    theta, gnorm = solve_erm(loss, X, y, lam, ref)
    steps = erm_module._descent_steps(loss, lam, n)
    assert 0 < len(calls) <= steps + 3          # the first stage's point, θ_ref, the start, K steps
    assert np.all(np.isfinite(theta))
    radius = 0.5 * loss.lipschitz / n / (2 * lam)
    assert np.linalg.norm(theta - exact) <= radius + 1e-9


def test_solver_returns_after_the_public_step_bound_where_the_certificate_is_out_of_reach(
        monkeypatch):
    # tol_fraction = 1e-300 asks for a gradient below rounding: the solver used to
    # run 100 000 steps and raise RuntimeError (a crashed pipeline). Now it stops
    # after at most K gradient steps, and the proven bound places it within
    # r = g/(2λ) of the minimiser (here r is below rounding: it is the minimiser).
    # Newton steps can land on a gradient of exactly 0 here, so the first stage is
    # the one of large problems, which stops short of it.
    from dp_beam.mechanisms.erm import solver
    loss = LogisticLoss(n_features=2, classes=[0, 1], feature_bound=1.0, fit_intercept=True)
    X, y = data(64, seed=4)
    X = loss.clip(X)
    tight, _ = solve_erm(loss, X, y, 0.3, tol_fraction=1e-10)
    monkeypatch.setattr(solver, "_NEWTON_MAX_PARAMS", 0)
    theta, gnorm = solve_erm(loss, X, y, 0.3, tol_fraction=1e-300)
    assert gnorm > 1e-300 * loss.lipschitz / 64          # the certificate was not reached
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


def _bundled_libs():
    """The solver's controllers of the bundled OpenBLAS; skips the test where there are none."""
    from dp_beam.mechanisms.erm import solver
    libs = solver._bundled_openblas()
    if not libs:
        pytest.skip("the bundled OpenBLAS is not separately controllable here (threadpoolctl, wheel)")
    return libs


@pytest.mark.parametrize("newton", [True, False], ids=["newton", "lbfgs"])
@pytest.mark.parametrize("k", [2, 3])
def test_one_blas_thread_for_the_solve_gives_the_bits_of_the_default_threads(
        monkeypatch, k, newton):
    from dp_beam.mechanisms.erm import solver
    libs = _bundled_libs()
    if not newton:
        monkeypatch.setattr(solver, "_NEWTON_MAX_PARAMS", 0)     # L-BFGS for every size
    before = [lib.num_threads for lib in libs]
    seen = []
    name = "_posv" if newton else "_lbfgsb"
    original = getattr(solver, name)

    def stage(*args):
        seen.append([lib.num_threads for lib in libs])
        return original(*args)

    monkeypatch.setattr(solver, name, stage)
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
    libs = _bundled_libs()
    before = [lib.num_threads for lib in libs]
    with solver._one_blas_thread(10):
        with solver._one_blas_thread(10):
            assert [lib.num_threads for lib in libs] == [1] * len(libs)
        assert [lib.num_threads for lib in libs] == [1] * len(libs)   # the outer solve still runs
        with solver._one_blas_thread(solver._ONE_THREAD_MAX_PARAMS + 1):
            assert [lib.num_threads for lib in libs] == [1] * len(libs)
    assert [lib.num_threads for lib in libs] == before


def test_the_bundled_openblas_of_numpy_and_scipy_is_controlled():
    import scipy
    libs = _bundled_libs()
    owners = {os.path.basename(os.path.dirname(os.path.realpath(lib.filepath))) for lib in libs}
    # Wheels bundle their OpenBLAS next to the package: both are found when both are there.
    for module in (np, scipy):
        folder = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(module.__file__))),
                              module.__name__ + ".libs")
        assert (module.__name__ + ".libs" in owners) == os.path.isdir(folder)


def test_a_long_history_solves_to_the_same_bits_on_one_and_two_blas_threads():
    # n = 4,608 points of d = 100 (72 steps of 64 points): NumPy's OpenBLAS on two threads
    # computes the gradient Xᵀv with other bits than on one (measured), so without the
    # solve's one-thread guard the result differs with the core count of the machine.
    from threadpoolctl import threadpool_limits
    _bundled_libs()          # skips where the libraries cannot be set
    rng = np.random.default_rng(11)
    loss = LogisticLoss(100, [0, 1], 1.0)
    X = loss.clip(rng.normal(size=(4608, 100)) * 0.2)
    y = (X[:, 0] + 0.1 * rng.normal(size=4608) > 0).astype(np.int64)
    ref = rng.normal(size=loss.n_params) * 0.1
    results = []
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            # On another thread than the one that set the limit, as a Beam worker's solves.
            _on_a_new_thread(lambda: results.append(solve_erm(loss, X, y, 0.01, ref)))
    assert [(theta.tobytes(), gnorm) for theta, gnorm in results[:1]] == \
        [(theta.tobytes(), gnorm) for theta, gnorm in results[1:]]


def _on_a_new_thread(fn):
    import threading
    errors = []

    def run():
        try:
            fn()
        except BaseException as error:  # re-raised on the test's thread
            errors.append(error)
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


def test_a_solve_on_any_thread_runs_on_one_blas_thread(monkeypatch):
    # threadpoolctl (3.8) lets only the first thread that set a count set it again; the
    # guard calls the libraries' own functions, so a solve on another thread is guarded too.
    from dp_beam.mechanisms.erm import solver
    libs = _bundled_libs()
    for lib in libs:
        lib.set_num_threads(lib.num_threads)        # this thread takes threadpoolctl's control
    before = [lib.num_threads for lib in libs]
    seen = []
    original = solver._posv

    def stage(*args):
        seen.append([lib.num_threads for lib in libs])
        return original(*args)

    monkeypatch.setattr(solver, "_posv", stage)
    for case in _solves(2, 5):
        _on_a_new_thread(lambda: solve_erm(*case))
    assert seen and all(threads == [1] * len(libs) for threads in seen)
    assert [lib.num_threads for lib in libs] == before


@pytest.mark.parametrize("k,intercept", [(2, True), (2, False), (3, True), (4, False)])
def test_hessian_is_the_derivative_of_the_gradient(k, intercept):
    # Central differences of the analytic gradient: error O(h²·third derivative) plus
    # rounding O(ε_mach/h); with h = 1e-5 both are below 1e-8 on these unit-scale data.
    loss = LogisticLoss(3, list(range(k)), 1.5, intercept)
    X, y = data(40, d=3, k=k, seed=7)
    Xa = loss.augment(loss.clip(X * 2.0))
    theta = np.random.default_rng(3).normal(size=loss.n_params)
    H = loss.hessian_on(Xa, y)(theta)
    h = 1e-5
    numeric = np.empty_like(H)
    for j in range(loss.n_params):
        e = np.zeros(loss.n_params)
        e[j] = h
        numeric[:, j] = (loss.value_grad(theta + e, Xa, y)[1]
                         - loss.value_grad(theta - e, Xa, y)[1]) / (2 * h)
    np.testing.assert_allclose(H, numeric, atol=1e-8)
    np.testing.assert_allclose(H, H.T, atol=1e-15)


@pytest.mark.parametrize("k", [2, 3])
def test_newton_and_lbfgs_first_stages_land_within_the_radius_of_each_other(monkeypatch, k):
    # Both results are within r = g/(2λ) of the exact minimiser (the certificate), so
    # within 2r of each other, on every shape the releases solve.
    from dp_beam.mechanisms.erm import solver
    newton = [solve_erm(*case) for case in _solves(k, 9)]
    monkeypatch.setattr(solver, "_NEWTON_MAX_PARAMS", 0)
    for (theta, gnorm), case in zip(newton, _solves(k, 9)):
        loss, X, _, lam, _, tol = case
        radius = tol * loss.lipschitz / X.shape[0] / (2 * lam)
        other, other_gnorm = solve_erm(*case)
        assert gnorm <= tol * loss.lipschitz / X.shape[0]
        assert np.linalg.norm(theta - other) <= 2 * radius + 1e-12


def test_newton_never_returns_a_point_worse_than_theta_ref_or_the_callers_array():
    # A Hessian that points the wrong way (a planted bug) makes no step decrease F:
    # the first stage then returns θ_ref's values in a new array.
    from dp_beam.mechanisms.erm import solver
    loss = LogisticLoss(2, [0, 1], 1.0, True)
    X, y = data(30, seed=2)
    Xa = loss.augment(loss.clip(X))
    ref = np.array([0.3, -0.2, 0.1])
    value_grad = loss.value_grad_on(Xa, y)

    def fun(theta):
        value, grad = value_grad(theta)
        return value + 0.1 * float((theta - ref) @ (theta - ref)), grad + 0.2 * (theta - ref)

    out = solver._newton(fun, lambda theta: -np.eye(3) * 1e3, 0.1, ref, 1e-12)
    assert out is not ref and np.array_equal(out, ref)
    # With the true Hessian it reaches a certificate far below the releases' (g >= 1e-6).
    good = solver._newton(fun, loss.hessian_on(Xa, y), 0.1, ref, 1e-12)
    assert fun(good)[0] < fun(ref)[0] and np.linalg.norm(fun(good)[1]) <= 1e-12
