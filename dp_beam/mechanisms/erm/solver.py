"""The ERM solver: the regularised minimiser to a certified tolerance.

``docs/privacy/erm.md`` E-3, E-4, E-6 (seed
004: Watson et al., *Continual and Sliding Window Release for Private ERM*).
:func:`solve_erm` never raises on data and always lands within the radius
that the output-perturbation sensitivity ``2L/(λn)`` already covers.

Why the output θ̃ of :func:`solve_erm` is always within ``r = g/(2λ)``,
``g = tol_fraction·L/n``, of the exact minimiser θ*, whatever the data: it is
computed deterministically, by L-BFGS from θ_ref and then gradient descent
with step 1/β (β = ``loss.smoothness`` + 2λ bounds the Hessian), which
stops at the first of

* a certificate: ``‖∇F(θ̃)‖₂ <= g``, hence ``‖θ̃ − θ*‖ <= g/(2λ)`` by strong
  convexity; or
* ``K`` = :func:`_descent_steps` gradient steps, a public number. The
  descent starts at a point θ₀ with ``F(θ₀) <= F(θ_ref)`` (the L-BFGS
  result, or θ_ref itself if that result is worse or not finite), so
  ``‖θ₀ − θ*‖² <= 2(F(θ_ref) − F*)/(2λ) <= ‖∇F(θ_ref)‖²/(2λ)² <= (L/(2λ))²``
  (∇F(θ_ref) is the mean of per-record gradients, each of norm <= L).
  Each step contracts ‖θ − θ*‖ by ``q = 1 − 2λ/β``, so after K steps
  ``‖θ_K − θ*‖ <= q^K·L/(2λ) <= (tol_fraction/n)·L/(2λ) = r``.

The second exit is a proof in exact arithmetic; it is taken only when the
measured gradient does not certify, i.e. when L-BFGS failed and descent is
slow (2λ/β small) or rounding keeps ``‖∇F‖`` above a very small ``g``; the
rounding of those steps is what the room below ``2L/(λn)`` absorbs. So no
input makes the solver raise or release a model the sensitivity does not
cover: a non-converging solve is a fixed public amount of work (K steps of
O(n·p)), not a crash. (Raising here would kill the pipeline on one
stream's data: an observable, data-dependent outcome.)
"""

import math
from typing import Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from ..checks import check_real
from .loss import LogisticLoss

__all__ = ["solve_erm"]


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

    def fun(theta):
        value, grad = loss.value_grad(theta, Xa, yi)
        diff = theta - ref
        return value + lam * float(diff @ diff), grad + 2.0 * lam * diff

    # L-BFGS-B's gtol bounds the max-norm; ‖·‖₂ <= √p·‖·‖_∞ makes it imply ours.
    theta, grad = _start_point(fun, ref, gtol / math.sqrt(loss.n_params))
    step = 1.0 / (loss.smoothness + 2.0 * lam)
    return _descend(fun, theta, grad, step, _descent_steps(loss, lam, n, tol_fraction), gtol)


def _start_point(fun, ref, max_norm_gtol):
    """``(θ₀, ∇F(θ₀))``: the L-BFGS result from θ_ref, or θ_ref itself when that result is
    worse or not finite (the descent bound of :func:`solve_erm` needs F(θ₀) <= F(θ_ref))."""
    result = optimize.minimize(
        fun, ref.copy(), jac=True, method="L-BFGS-B",
        options={"gtol": max_norm_gtol, "ftol": 0.0, "maxiter": 10_000, "maxcor": 20},
    )
    theta = np.asarray(result.x, dtype=np.float64)
    value, grad = fun(theta) if np.all(np.isfinite(theta)) else (math.inf, None)
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
