"""The ERM solver: the regularised minimiser to a certified tolerance.

``docs/privacy/erm.md`` E-3, E-4, E-6 (seed
004: Watson et al., *Continual and Sliding Window Release for Private ERM*).
:func:`solve_erm` never raises on data and always lands within the radius
that the output-perturbation sensitivity ``2L/(λn)`` already covers.

Why the output θ̃ of :func:`solve_erm` is always within ``r = g/(2λ)``,
``g = tol_fraction·L/n``, of the exact minimiser θ*, whatever the data: it is
computed deterministically, by a first stage from θ_ref (damped Newton
steps, or L-BFGS above ``_NEWTON_MAX_PARAMS`` = 127 parameters) and then
gradient descent with step 1/β (β = ``loss.smoothness`` + 2λ bounds the
Hessian), which stops at the first of

* a certificate: ``‖∇F(θ̃)‖₂ <= g``, hence ``‖θ̃ − θ*‖ <= g/(2λ)`` by strong
  convexity; or
* ``K`` = :func:`_descent_steps` gradient steps, a public number. The
  descent starts at a point θ₀ with ``F(θ₀) <= F(θ_ref)`` (the first
  stage's result, or θ_ref itself if that result is worse or not finite), so
  ``‖θ₀ − θ*‖² <= 2(F(θ_ref) − F*)/(2λ) <= ‖∇F(θ_ref)‖²/(2λ)² <= (L/(2λ))²``
  (∇F(θ_ref) is the mean of per-record gradients, each of norm <= L).
  Each step contracts ‖θ − θ*‖ by ``q = 1 − 2λ/β``, so after K steps
  ``‖θ_K − θ*‖ <= q^K·L/(2λ) <= (tol_fraction/n)·L/(2λ) = r``.

The second exit is a proof in exact arithmetic; it is taken only when the
measured gradient does not certify, i.e. when the first stage failed and descent is
slow (2λ/β small) or rounding keeps ``‖∇F‖`` above a very small ``g``; the
rounding of those steps is what the room below ``2L/(λn)`` absorbs. So no
input makes the solver raise or release a model the sensitivity does not
cover: a non-converging solve is a fixed public amount of work (K steps of
O(n·p)), not a crash. (Raising here would kill the pipeline on one
stream's data: an observable, data-dependent outcome.)

Why Newton first: the objective is smooth and 2λ-strongly convex, so damped
Newton steps (Armijo backtracking) decrease F and converge quadratically;
on the problems a release solves (one block to a long history) one or two
steps certify. SciPy's L-BFGS-B costs about 0.8 ms a call, mostly set-up,
where these steps take 0.15–0.4 ms (d = 10 and 100, 8 to 144 points);
``benchmarks/scale.py`` (ERM cases) measures the difference in a pipeline.
Above ``_NEWTON_MAX_PARAMS`` parameters L-BFGS keeps the first stage (see
there). Either way, only the certificate or the public step bound decides
what is released within the radius.
"""

import contextlib
import math
import os
import threading
from typing import Optional, Tuple

import numpy as np
import scipy
from numpy.typing import ArrayLike
from scipy import optimize
from scipy.linalg.lapack import dposv as _posv

from ..checks import check_real
from .loss import LogisticLoss

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # optional: without it both libraries keep their threads (the bits of
    # solves of thousands of points then depend on the core count)
    ThreadpoolController = None

__all__ = ["solve_erm"]

#: L-BFGS-B on SciPy's bundled OpenBLAS runs its triangular solves on every thread
#: (``dtrtrs``, at any size): on problems this small the threads' hand-offs cost up to
#: ten times the solve; the Newton steps' Cholesky solves run on the same library.
#: NumPy's bundled OpenBLAS computes the losses' products, and on two threads it splits
#: ``Xᵀv`` over the points, with other bits, from a few thousand points on (measured: the
#: gradient and the solve's result at n = 4,608, d = 100 differ between one and two
#: threads). So a whole solve runs both libraries on one thread while every vector has at
#: most this many entries: OpenBLAS splits a dot product across threads (changing
#: its summation order) only above 10,000 entries, and the parallel triangular solve
#: splits its right-hand sides, each solved the same way on any thread. A retried step
#: then solves to the same bits on any core count (test_solver.py).
_ONE_THREAD_MAX_PARAMS = 10_000
#: The first stage takes Newton steps up to this many parameters, L-BFGS above. OpenBLAS
#: factorises a p × p matrix on one thread below p = 128 and splits it across threads from
#: there, with other bits (measured on SciPy's bundled OpenBLAS): below, a Newton step's
#: bits do not depend on the thread count, as L-BFGS-B's do not (test_solver.py).
_NEWTON_MAX_PARAMS = 127
#: Newton steps, and halvings of one step, before the first stage hands over to the descent.
_NEWTON_STEPS, _NEWTON_HALVINGS = 100, 60
#: Armijo's sufficient-decrease fraction.
_ARMIJO = 1e-4
_THREADS_LOCK = threading.Lock()
_THREADS = {"libs": None, "controls": None, "active": 0, "saved": ()}


def _bundled_openblas():
    """The lib controllers of the OpenBLAS builds bundled with SciPy's and NumPy's wheels
    (``scipy.libs``, ``numpy.libs``), found once; empty without threadpoolctl. A BLAS of
    the system or of another distribution is left with its own threads."""
    if _THREADS["libs"] is None:
        libs = []
        if ThreadpoolController is not None:
            # Real paths: the loader reports a library's resolved path, so a venv reached
            # through a symlink would otherwise never match.
            bundled = {os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(module.__file__))),
                                    module.__name__ + ".libs") for module in (scipy, np)}
            try:
                controllers = ThreadpoolController().lib_controllers
            except Exception:  # an unexpected platform: keep the default threads
                controllers = []
            libs = [lib for lib in controllers if lib.internal_api == "openblas"
                    and os.path.dirname(os.path.realpath(lib.filepath)) in bundled]
        _THREADS["libs"] = libs
    return _THREADS["libs"]


def _thread_controls():
    """``[(get, set)]``: each bundled OpenBLAS's own functions reading and setting its thread
    count (:func:`_bundled_openblas`), found once.

    Not threadpoolctl's ``set_num_threads``: in the pinned 3.8 it lets only the first
    Python thread that ever called it (its "controlling thread", while alive) change
    OpenBLAS's process-wide count, and does nothing when called on any other thread. A Beam
    worker solves on many threads; a solve on one of the others would keep the default
    threads (measured: two, on a worker thread after the main thread had solved)."""
    if _THREADS["controls"] is None:
        _THREADS["controls"] = [
            (lib.get_num_threads, getattr(lib, "_real_set_num_threads", lib.set_num_threads))
            for lib in _bundled_openblas()]
    return _THREADS["controls"]


@contextlib.contextmanager
def _one_blas_thread(n_params):
    """SciPy's and NumPy's bundled OpenBLAS on one thread while a solve runs (see
    _ONE_THREAD_MAX_PARAMS).

    Counted across threads: the first solve to enter saves the thread counts, the last
    to leave restores them, so concurrent solves never restore each other's setting."""
    controls = _thread_controls() if n_params <= _ONE_THREAD_MAX_PARAMS else []
    if not controls:
        yield
        return
    with _THREADS_LOCK:
        if _THREADS["active"] == 0:
            _THREADS["saved"] = tuple(get() for get, _ in controls)
            for _, set_threads in controls:
                set_threads(1)
        _THREADS["active"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS["active"] -= 1
            if _THREADS["active"] == 0:
                for (_, set_threads), threads in zip(controls, _THREADS["saved"]):
                    set_threads(threads)


def _descent_steps(loss, lam, n, tol_fraction=0.5):
    """Gradient steps that provably bring any start no worse than θ_ref within ``g/(2λ)`` of θ*.

    The bound of :func:`solve_erm`: ``K = ⌈ln(n/tol_fraction) / −ln(1 − 2λ/β)⌉``
    with ``β = loss.smoothness + 2λ``. Public: it depends on public parameters
    and the (public, count-triggered) number of points only.
    """
    mu = 2.0 * lam
    beta = loss.smoothness + mu
    ratio = n / tol_fraction
    if ratio <= 1.0:
        return 0
    return int(math.ceil(math.log(ratio) / -math.log1p(-mu / beta)))


def solve_erm(loss: LogisticLoss, X: ArrayLike, y: ArrayLike, lam: float,
              theta_ref: Optional[ArrayLike] = None,
              tol_fraction: float = 0.5) -> Tuple[np.ndarray, float]:
    """Minimise ``F(θ) = (1/n)Σℓ(θ; z_i) + λ‖θ − θ_ref‖²`` to a certified tolerance; never raises on data.

    erm.md E-3, E-4, E-6. F is 2λ-strongly convex, so the exact minimiser
    moves by at most ``2L/(n·2λ) = L/(λn)`` when one of the n records is
    replaced (Chaudhuri et al. 2011); the paper's ``2L/(λn)`` is twice that.
    The output θ̃ is always within ``r = g/(2λ)`` of the exact minimiser θ*,
    with ``g = tol_fraction·L/n``; then for neighbours D, D′

        ‖θ̃(D) − θ̃(D′)‖ <= r + L/(λn) + r = (1 + tol_fraction)·L/(λn) <= 2L/(λn),

    so the paper's sensitivity (the one the noise is calibrated to) covers the
    optimisation error as long as ``tol_fraction <= 1`` (0.5 leaves room for
    rounding).

    Why ``‖θ̃ − θ*‖ <= r`` holds whatever the data: see the module docstring.

    X must already be clipped (:meth:`LogisticLoss.clip`); ``y`` holds class
    indices. Returns ``(θ̃, ‖∇F(θ̃)‖)``, the measured gradient norm (above
    ``g`` only on the second exit).
    """
    lam = check_real("lam", lam, positive=True)
    tol_fraction = check_real("tol_fraction", tol_fraction, positive=True)
    if tol_fraction > 1.0:
        raise ValueError(f"tol_fraction must be <= 1 for the sensitivity bound to hold, got {tol_fraction!r}")
    n = X.shape[0]
    if n < 1:
        raise ValueError("X must hold at least one point")
    ref = np.zeros(loss.n_params) if theta_ref is None else np.asarray(theta_ref, dtype=np.float64)
    Xa = loss.augment(X)
    yi = np.asarray(y, dtype=np.int64)
    gtol = tol_fraction * loss.lipschitz / n

    value_grad = loss.value_grad_on(Xa, yi)

    def objective(theta):
        value, grad = value_grad(theta)
        diff = theta - ref
        return value + lam * float(diff @ diff), grad + 2.0 * lam * diff

    fun = _Remembered(objective)
    step = 1.0 / (loss.smoothness + 2.0 * lam)
    with _one_blas_thread(loss.n_params):
        theta, grad = _start_point(fun, ref, _first_stage(loss, fun, Xa, yi, lam, ref, gtol))
        return _descend(fun, theta, grad, step, _descent_steps(loss, lam, n, tol_fraction), gtol)


class _Remembered:
    """``fun`` that answers again, without recomputing, at θ_ref and at the last point evaluated.

    :func:`_start_point` asks for F at θ_ref (where the first stage started) and
    at the first stage's result (normally the last point it evaluated): both
    were computed already. A point is recognised by its exact bytes, so an answer is the one
    ``fun`` gave for the same input; gradients are handed out as copies, so no
    caller can change a remembered one.
    """

    def __init__(self, fun):
        self._fun = fun
        self._first = self._last = None

    def __call__(self, theta):
        key = np.asarray(theta, dtype=np.float64).tobytes()
        for known in (self._last, self._first):
            if known is not None and known[0] == key:
                return known[1], known[2].copy()
        value, grad = self._fun(theta)
        entry = (key, value, grad.copy())
        if self._first is None:
            self._first = entry
        self._last = entry
        return value, grad


def _lbfgsb(fun, x0, pgtol):
    """The L-BFGS-B result from ``x0`` (``fun`` gives F and ∇F; max-norm gradient tolerance
    ``pgtol``, no F-decrease test)."""
    result = optimize.minimize(
        fun, x0.copy(), jac=True, method="L-BFGS-B",
        options={"gtol": pgtol, "ftol": 0.0, "maxiter": 10_000, "maxcor": 20},
    )
    return result.x


def _first_stage(loss, fun, Xa, yi, lam, ref, gtol):
    """A point that is normally within the certificate: Newton steps from θ_ref up to
    ``_NEWTON_MAX_PARAMS`` parameters, L-BFGS-B above (the module docstring)."""
    if loss.n_params <= _NEWTON_MAX_PARAMS:
        return _newton(fun, loss.hessian_on(Xa, yi), lam, ref, gtol)
    # L-BFGS-B's gtol bounds the max-norm; ‖·‖₂ <= √p·‖·‖_∞ makes it imply ours.
    return _lbfgsb(fun, ref, gtol / math.sqrt(loss.n_params))


def _newton(fun, hessian, lam, ref, gtol):
    """The first stage's point: damped Newton steps from θ_ref on ``F`` (``fun`` gives F and
    ∇F, ``hessian`` the loss's Hessian, to which the regulariser's 2λI is added).

    Stops at the certificate ``‖∇F‖ <= gtol``, after ``_NEWTON_STEPS`` steps, or when a
    step is not finite or no halving of it either decreases F by Armijo's rule or
    certifies (rounding near the minimiser); the descent of :func:`solve_erm` takes
    over from what is returned. Every other accepted step decreases F.
    """
    # A copy: the caller's θ_ref is never handed back as the result.
    theta = ref.copy()
    value, grad = fun(theta)
    for _ in range(_NEWTON_STEPS):
        if not float(np.linalg.norm(grad)) > gtol:
            break
        H = hessian(theta)
        H.flat[::H.shape[0] + 1] += 2.0 * lam
        if not np.isfinite(H).all():     # overflowing data
            break
        # H is symmetric positive definite (>= 2λI): a Cholesky solve, by SciPy's LAPACK
        # (on one thread, as L-BFGS-B's: solve_erm). ≈ 4 µs at p = 11 against ≈ 14 µs
        # for numpy.linalg.solve's LU, whose call overhead dominates at these sizes.
        _, direction, info = _posv(H, grad)
        if info != 0:
            break
        slope = float(grad @ direction)
        if not (math.isfinite(slope) and slope > 0.0):
            break
        size = 1.0
        for _ in range(_NEWTON_HALVINGS):
            candidate = theta - size * direction
            new_value, new_grad = fun(candidate)
            # Near θ* the decrease falls below the rounding of F; a step whose gradient
            # certifies is taken anyway (the certificate needs no decrease, and
            # _start_point still compares the result with θ_ref).
            if (new_value <= value - _ARMIJO * size * slope
                    or float(np.linalg.norm(new_grad)) <= gtol):
                break
            size *= 0.5
        else:
            break
        theta, value, grad = candidate, new_value, new_grad
    return theta


def _start_point(fun, ref, theta):
    """``(θ₀, ∇F(θ₀))``: the first stage's result ``theta``, or θ_ref itself when that result
    is worse or not finite (the descent bound of :func:`solve_erm` needs F(θ₀) <= F(θ_ref))."""
    theta = np.asarray(theta, dtype=np.float64)
    value, grad = fun(theta) if np.isfinite(theta).all() else (math.inf, None)
    if not value <= fun(ref)[0]:
        theta = ref.copy()
        _, grad = fun(theta)
    return theta, grad


def _descend(fun, theta, grad, step, steps, gtol):
    """``(θ, ‖∇F(θ)‖)`` after gradient steps of size ``step`` until the gradient certifies
    (``‖∇F‖ <= gtol``) or the public number ``steps`` is spent (:func:`solve_erm`)."""
    gnorm = float(np.linalg.norm(grad))
    for _ in range(steps):
        if gnorm <= gtol:
            break
        theta = theta - step * grad
        _, grad = fun(theta)
        gnorm = float(np.linalg.norm(grad))
    return theta, gnorm
