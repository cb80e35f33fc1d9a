"""Solvers of the noisy least-squares problem: NoisyProjGrad, an exact QP, and the lift.

Everything here is post-processing of the released noisy moments (Q_t, q_t):
it costs no privacy, whatever it computes (``docs/privacy/regression.md``
R-9; the solver is our choice among post-processings, and R-7's lift is one too).

* :func:`noisy_proj_grad` — Algorithm NoisyProjGrad of seed 002
  (arXiv:1701.01093, App. B): projected gradient
  with a constant step and the averaged iterate. :func:`npg_schedule` gives
  the ``r_t = ⌈((L_t + α_t)/α_t)²⌉`` and ``η_t = 2‖C‖/((L_t + α_t)√r_t)``
  that we derived from Cor. B.2 of the paper, :func:`gradient_error_bound` the α_t of R-2 to R-5.
* :func:`solve_quadratic` — the exact minimiser of ``θᵀQθ − 2qᵀθ`` over C
  after projecting Q onto the PSD cone (regression.md R-9: the noisy Q is not PSD):
  the trust-region subproblem solved through the eigendecomposition (L2
  ball), or accelerated projected gradient to a certified tolerance followed
  by a Newton step on the active face (L1 ball).
* :func:`lift` — PrivIncReg2's lift back into C (R-7): the preimage of
  ``Φθ = target`` of least Minkowski norm: minimum L2 norm (L2 ball) or basis
  pursuit with ``scipy.optimize.linprog`` (L1 ball).

Example:

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import L2Ball, npg_schedule, solve_quadratic
>>> theta, _ = solve_quadratic(np.eye(2), np.array([3.0, 4.0]), L2Ball(1.0))
>>> theta.round(6).tolist()
[0.6, 0.8]
>>> npg_schedule(n=10, radius=1.0, alpha=40.0)       # L = 2·10·(1 + 1) = 40: r = ((40 + 40)/40)² = 4
(4, 0.0125)
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from .constraints import Constraint, L1Ball, L2Ball

__all__ = [
    "psd_part",
    "npg_schedule",
    "gradient_error_bound",
    "noisy_proj_grad",
    "solve_quadratic",
    "lift",
    "quadratic_value",
]


def psd_part(matrix: ArrayLike) -> np.ndarray:
    """The nearest PSD matrix (Frobenius) to the symmetric part of ``matrix``: eigenvalues clipped at 0."""
    sym = 0.5 * (np.asarray(matrix, dtype=np.float64) + np.asarray(matrix, dtype=np.float64).T)
    lam, vec = np.linalg.eigh(sym)
    return (vec * np.maximum(lam, 0.0)) @ vec.T


def quadratic_value(Q: ArrayLike, q: ArrayLike, theta: ArrayLike) -> float:
    """``θᵀQθ − 2qᵀθ`` (the loss J minus the constant Σy²)."""
    theta = np.asarray(theta, dtype=np.float64)
    return float(theta @ (Q @ theta) - 2.0 * (q @ theta))


def npg_schedule(n: int, radius: float, alpha: float, max_iterations: Optional[int] = None,
                 lipschitz: Optional[float] = None) -> Tuple[int, float]:
    """``(r, η)`` of NoisyProjGrad at a prefix of n records (regression.md R-9; derived by us from Cor. B.2).

    ``L = 2n(‖C‖ + 1)`` bounds the gradient of the sum loss on C (‖x‖, |y| <= 1),
    ``r = ⌈((L + α)/α)²⌉``, ``η = 2‖C‖/((L + α)√r)``; then the averaged iterate
    is within ``2‖C‖(L + α)/√r + 2α‖C‖ <= 4α‖C‖`` of the optimum (Prop. B.1).
    ``max_iterations`` caps r (r grows like n²; regression.md R-9): η is then set by
    the same formula for the capped r, and Prop. B.1 still bounds the excess by
    ``2‖C‖(L + α)/√r + 2α‖C‖``. Public: n is the (public) record count.
    ``lipschitz`` replaces L (PrivIncReg2's objective over C has its own).
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    lip = 2.0 * n * (radius + 1.0) if lipschitz is None else float(lipschitz)
    r = max(1, int(math.ceil(((lip + alpha) / alpha) ** 2)))
    if max_iterations is not None:
        r = min(r, int(max_iterations))
    return r, 2.0 * radius / ((lip + alpha) * math.sqrt(r))


def gradient_error_bound(std_gram: float, std_xy: float, d: int, radius: float, t: int,
                         horizon: Optional[int], beta: float, gram_scale: float = 1.0,
                         xy_scale: float = 1.0) -> float:
    """α_t with ``‖g_t(θ) − ∇J(θ)‖ <= α_t`` for all θ ∈ C, w.p. >= 1 − β over all t
    (regression.md R-2 to R-5).

    ``α_t = 2(‖N_Q‖·‖C‖ + ‖N_q‖)`` with, for the Gaussian noises of the
    release at step t (std ``std_gram`` per svec coordinate, ``std_xy`` per
    coordinate): the symmetric noise matrix has the law of ``(G + Gᵀ)/2`` for
    G with i.i.d. N(0, std²) entries, so ``‖N_Q‖ <= ‖G‖ <= std·(2√d + s)``, and
    ``‖N_q‖ <= std·(√d + s)``, each w.p. >= 1 − e^{−s²/2} (002 Prop. A.1).
    ``s = √(2 ln(4T/β))`` unions over T steps and both sums; without a horizon,
    step t gets ``β_t = 6β/(π² t²)``, ``s = √(2 ln(4/β_t))``. ``gram_scale`` and
    ``xy_scale`` multiply the two norms (PrivIncReg2 maps them through Φ).
    """
    if horizon is not None:
        s = math.sqrt(2.0 * math.log(4.0 * horizon / beta))
    else:
        beta_t = 6.0 * beta / (math.pi ** 2 * t * t)
        s = math.sqrt(2.0 * math.log(4.0 / beta_t))
    op_gram = std_gram * (2.0 * math.sqrt(d) + s)
    norm_xy = std_xy * (math.sqrt(d) + s)
    return 2.0 * (gram_scale * op_gram * radius + xy_scale * norm_xy)


def noisy_proj_grad(constraint: Constraint, grad: Callable[[np.ndarray], np.ndarray], r: int,
                    eta: float, theta1: np.ndarray) -> np.ndarray:
    """Algorithm NoisyProjGrad (002 App. B): ``θ_{k+1} = Π_C(θ_k − η g(θ_k))``, returns ``(1/r)Σ_{k<=r} θ_k``.

    Every iterate lies in C (θ_1 must), so the average does too (C is convex).
    """
    theta = constraint.project(theta1)
    total = np.zeros_like(theta)
    for _ in range(r):
        total += theta
        theta = constraint.project(theta - eta * grad(theta))
    return constraint.project(total / r)


def _norm(v: np.ndarray) -> float:
    """``np.linalg.norm`` of a float vector, the same bits (it is ``sqrt(v·v)``) without its
    dispatch, which cost more than the arithmetic in the solver's loop."""
    return math.sqrt(v.dot(v))


def _trust_region(Q, q, radius, eig=None) -> Tuple[np.ndarray, int]:
    """Exact minimiser of θᵀQθ − 2qᵀθ over ‖θ‖ <= radius for PSD Q (Moré–Sorensen via eigh).

    ``eig``: Q's ``(eigenvalues, eigenvectors)`` if already known (then Q is not read)."""
    lam, vec = np.linalg.eigh(Q) if eig is None else eig
    lam = np.maximum(lam, 0.0)
    b = vec.T @ q
    scale = max(float(lam.max()), 1.0)
    positive = lam > 1e-12 * scale
    bnorm = _norm(b)
    if bnorm == 0.0:
        return np.zeros_like(q), 0
    if np.all(np.abs(b[~positive]) <= 1e-12 * bnorm):
        inner = np.zeros_like(b)
        inner[positive] = b[positive] / lam[positive]
        if _norm(inner) <= radius:
            return vec @ inner, 0

    def excess(mu):
        return _norm(b / (lam + mu)) - radius

    hi = bnorm / radius
    lo = hi
    evaluations = 0
    for _ in range(2100):
        lo *= 0.5
        evaluations += 1
        if lo == 0.0 or excess(lo) > 0.0:
            break
    if excess(hi) >= 0.0:
        # Only where Q₊ vanishes on b (a step of pure noise): then excess(hi) is 0
        # up to rounding and hi is the multiplier; brentq would reject the bracket.
        mu = hi
    elif lo == 0.0 or excess(lo) <= 0.0:
        mu = hi if lo == 0.0 else lo
    else:
        mu = optimize.brentq(excess, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)
    theta = vec @ (b / (lam + mu))
    norm = _norm(theta)
    if norm > radius:
        theta *= radius / norm
    return theta, evaluations


def _l1_qp(Q, q, ball: L1Ball, theta0=None, tol=1e-10, max_iter=20000) -> Tuple[np.ndarray, int]:
    """Minimiser of θᵀQθ − 2qᵀθ over the L1 ball: FISTA with restarts, then a Newton polish.

    FISTA (step 1/(2λ_max)) stops when the gradient mapping
    ``‖θ − Π_C(θ − ∇f/L)‖·L`` is below ``tol·(L·radius + 2‖q‖)`` (or when a
    step without momentum no longer descends: stationary up to rounding). The polish solves the
    KKT system on the support (with ``sign·θ = radius`` if the ball is
    active) and is kept only if it stays feasible, keeps the signs and does
    not raise the objective: the projected-Newton step that makes the
    result exact when the support is right.
    """
    d = q.size
    theta = ball.project(np.zeros(d) if theta0 is None else np.asarray(theta0, dtype=np.float64))
    theta, value, it = _l1_fista(Q, q, ball, theta, tol, max_iter)
    return _l1_polish(Q, q, ball, theta, value), it


def _l1_fista(Q, q, ball: L1Ball, theta, tol, max_iter) -> Tuple[np.ndarray, float, int]:
    """``(θ, f(θ), iterations)`` of FISTA with restarts from the feasible θ (:func:`_l1_qp`)."""
    # Any L >= 2λ_max is a valid step bound; the floor 2‖q‖/radius keeps a nearly
    # linear objective's first step within a few radii (no cancellation in Π_C).
    lip = max(2.0 * float(np.linalg.eigvalsh(Q).max()), 2.0 * float(np.linalg.norm(q)) / ball.radius, 1e-300)
    y, t_k = theta.copy(), 1.0
    f_old = quadratic_value(Q, q, theta)
    # Float evaluation of the gradient mapping cannot go much below this.
    threshold = tol * (lip * ball.radius + 2.0 * float(np.linalg.norm(q)))
    it = 0
    restarted = False
    for it in range(1, max_iter + 1):
        new = ball.project(y - 2.0 * (Q @ y - q) / lip)
        f_new = quadratic_value(Q, q, new)
        if f_new > f_old:
            if restarted:  # no descent even without momentum: stationary up to rounding
                break
            y, t_k, restarted = theta.copy(), 1.0, True
            continue
        restarted = False
        t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t_k * t_k))
        y = new + ((t_k - 1.0) / t_next) * (new - theta)
        theta, t_k, f_old = new, t_next, f_new
        mapping = lip * np.linalg.norm(theta - ball.project(theta - 2.0 * (Q @ theta - q) / lip))
        if mapping <= threshold:
            break
    return theta, f_old, it


def _l1_polish(Q, q, ball: L1Ball, theta, value) -> np.ndarray:
    """The projected-Newton polish of :func:`_l1_qp`: the KKT solution on θ's support where it
    is feasible, keeps the signs and does not raise the objective ``value`` of θ."""
    d = q.size
    support = np.abs(theta) > 1e-12 * max(1.0, ball.radius)
    if support.any():
        signs = np.sign(theta[support])
        Qs, qs = Q[np.ix_(support, support)], q[support]
        k = int(support.sum())
        kkt = np.zeros((k + 1, k + 1))
        kkt[:k, :k] = 2.0 * Qs
        kkt[:k, k] = signs
        kkt[k, :k] = signs
        systems = ((Qs, qs, None), (kkt, np.concatenate([2.0 * qs, [ball.radius]]), k))
        best, best_value = theta, value
        for matrix, rhs, keep in systems:  # interior stationary point, then the active face
            try:
                sol = np.linalg.solve(matrix, rhs)
            except np.linalg.LinAlgError:
                continue
            candidate = np.zeros(d)
            candidate[support] = sol if keep is None else sol[:keep]
            if (np.all(np.isfinite(candidate)) and np.all(np.sign(candidate[support]) == signs)
                    and np.abs(candidate).sum() <= ball.radius * (1.0 + 1e-12)):
                candidate_value = quadratic_value(Q, q, candidate)
                if candidate_value <= best_value:
                    best, best_value = candidate, candidate_value
        theta = ball.project(best)
    return theta


def solve_quadratic(Q: ArrayLike, q: ArrayLike, constraint: Constraint,
                    theta0: Optional[ArrayLike] = None, psd: bool = True) -> Tuple[np.ndarray, int]:
    """``(θ, work)``: the minimiser over C of ``θᵀQ₊θ − 2qᵀθ``, Q₊ the PSD part of Q.

    ``work`` counts bisection evaluations (L2) or FISTA iterations (L1). With
    ``psd=False`` Q must already be PSD. The result lies in C.
    """
    q = np.asarray(q, dtype=np.float64)
    if isinstance(constraint, L2Ball):
        # One eigendecomposition serves both the PSD projection and the solve.
        Q = np.asarray(Q, dtype=np.float64)
        eig = np.linalg.eigh(0.5 * (Q + Q.T) if psd else Q)
        theta, work = _trust_region(None, q, constraint.radius, eig=eig)
        return constraint.project(theta), work
    Q = psd_part(Q) if psd else np.asarray(Q, dtype=np.float64)
    theta, work = _l1_qp(Q, q, constraint, theta0)
    return constraint.project(theta), work


def lift(phi: ArrayLike, target: ArrayLike, constraint: Constraint) -> np.ndarray:
    """``argmin ‖θ‖_C subject to Φθ = target`` (PrivIncReg2's lift, regression.md R-7).

    L2 ball: the minimum-norm solution ``Φᵀ(ΦΦᵀ)⁻¹·target`` (by least squares,
    which is that when Φ has full row rank). L1 ball: basis pursuit, the LP
    ``min 1ᵀ(u + w)`` s.t. ``Φ(u − w) = target``, ``u, w >= 0`` (HiGHS). When
    ``target = Φθ*`` for some θ* ∈ C, the lift has ``‖θ‖_C <= ‖θ*‖_C <= 1`` and so
    lies in C; the final projection only removes solver rounding.
    """
    phi = np.asarray(phi, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    if isinstance(constraint, L2Ball):
        theta = np.linalg.lstsq(phi, target, rcond=None)[0]
        return constraint.project(theta)
    m, d = phi.shape
    res = optimize.linprog(np.ones(2 * d), A_eq=np.hstack([phi, -phi]), b_eq=target,
                           bounds=[(0, None)] * (2 * d), method="highs")
    if res.status != 0 or res.x is None:
        theta = np.linalg.lstsq(phi, target, rcond=None)[0]
    else:
        theta = res.x[:d] - res.x[d:]
    return constraint.project(theta)
