"""Private empirical risk minimisation with continual and sliding-window release.

Spec private_erm_and_incremental_regression.md §1 (seed 004: Watson et al.,
*Continual and Sliding Window Release for Private ERM*), with the fixes of §5:

* :func:`l2_laplace_noise` — the ε-DP noise for an L2 sensitivity (§1.1, §5.1);
* :class:`LogisticLoss` and :func:`solve_erm` — L2-regularised binary/softmax
  logistic regression on clipped features, solved to a certified tolerance
  (§1.2, §5.3–5.5);
* :class:`OutputPerturbation` — Algorithm 1 (PSGD, output perturbation) and
  Algorithm 3 (PBERM, regularised toward a released model, §1.4);
* :class:`MultiResolutionERM` (Algorithm 2, §1.3), :class:`ContinualERM`
  (Algorithms 2 + 4, §1.5) and :class:`SlidingWindowERM` (Algorithm 5 with the
  bucket / dependency-chain rule of §1.7) — engine-free streams that consume
  blocks of points and return :class:`ModelRelease` records.

Time is record count (§0): a stream's ``t`` is the number of points consumed,
and intervals ``(a, b]`` are half-open record ranges. Privacy is event-level
under *replace one record* (§0); all guarantees are pure ε-DP (δ = 0) unless
Gaussian noise is chosen.

The schedule (which data each model is trained on, its regulariser, its noise
scale) depends only on record counts and public parameters (§3), so the whole
release sequence is a composition of output-perturbation calls whose per-record
costs are summed in the docstrings below (§1.9).
"""

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from .calibration import rho_from_eps, rho_from_eps_delta
from .noise import ZeroNoise, make_noise
from .noise_key import grid_padded_scale, round_to_grid

__all__ = [
    "NOISE_KINDS",
    "WINDOW_POLICIES",
    "l2_laplace_noise",
    "alg2_noise_scale",
    "alg3_noise_scale",
    "alg5_base_noise_scale",
    "alg5_finetune_noise_scale",
    "LogisticLoss",
    "solve_erm",
    "OutputPerturbation",
    "ModelRelease",
    "BlockLog",
    "MemoryBlockLog",
    "MultiResolutionERM",
    "ContinualERM",
    "SlidingWindowERM",
    "sliding_buckets",
    "predict_proba",
    "predict",
]

#: Output-perturbation noise (spec §1.1): ``"l2_laplace"`` (default, ε-DP for the
#: L2 sensitivity), ``"coord_laplace_l1"`` (i.i.d. Laplace calibrated to the L1
#: bound √p·Δ₂, ε-DP) and ``"gaussian"`` (ρ-zCDP, hence (ε, δ)-DP).
NOISE_KINDS = ("l2_laplace", "coord_laplace_l1", "gaussian")

#: How :class:`SlidingWindowERM` treats a window that is not (2^k − 1) blocks (§1.7).
WINDOW_POLICIES = ("exact", "round_down", "general")


# -- validation helpers -----------------------------------------------------------


def _real(name, value, *, positive=False, nonnegative=False, finite=True):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _is_pow2(n):
    return n >= 1 and n & (n - 1) == 0


# -- noise ------------------------------------------------------------------------


def l2_laplace_noise(source, scale, dim):
    """Draw ν ∈ R^dim with density ∝ exp(−‖ν‖₂/scale) (spec §1.1, §5.1).

    ν = R·U with R ~ Gamma(dim, scale) and U uniform on the unit sphere,
    independent. Why this is exact: in polar coordinates the density of ν at
    radius r is f_R(r)/(r^{dim−1}·|S^{dim−1}|) ∝ r^{dim−1}e^{−r/scale}/r^{dim−1}
    = e^{−r/scale}, a function of ‖ν‖ only.

    Both parts come from the injected :class:`~dp_beam.mechanisms.noise.NoiseSource`,
    which offers only Laplace and Gaussian draws, so:

    * R = Σ_{i=1}^{dim} |Z_i| with Z_i ~ Lap(scale). Lap(b) is symmetric with
      density e^{−|z|/b}/(2b), so |Z| has density e^{−z/b}/b on z ≥ 0, i.e.
      |Z| ~ Exp(b); a sum of dim independent Exp(b) is Gamma(dim, b) exactly.
    * U = g/‖g‖ with g ~ N(0, I_dim): the standard normal vector is rotation
      invariant, so its direction is uniform on the sphere and independent of
      its norm. A zero g (probability 0, possible only through rounding) is
      redrawn, which does not change the law of the direction.

    A zero radius (only a source that is switched off gives one) returns the
    zero vector without drawing a direction. The number of draws is fixed
    (dim Laplace + dim Gaussian), independent of the data.

    Caveat: ν is a float computation on grid draws. With the keyed source
    :meth:`OutputPerturbation.train` rounds ν and the minimiser to the noise
    grid, so the release is an exact grid sum and shows no data through its
    low-order bits; the law of the rounded ν is the rounded float L2-Laplace,
    not an exactly specified discrete distribution (no exact sampler for a
    discrete L2-Laplace is known to us), which is the one place where the
    released law is that of a float computation. The coordinate noises
    (``"coord_laplace_l1"``, ``"gaussian"``) are exact discrete laws.
    """
    scale = _real("scale", scale, nonnegative=True)
    dim = _int("dim", dim, 1)
    radius = float(np.sum(np.abs(source.laplace(scale, dim))))
    if radius == 0.0:
        return np.zeros(dim, dtype=np.float64)
    for _ in range(64):
        g = source.gaussian(1.0, dim)
        norm = float(np.linalg.norm(g))
        if norm > 0.0:
            return radius * (g / norm)
    raise RuntimeError("noise source returned 64 zero Gaussian vectors; it cannot supply a direction")


def alg2_noise_scale(lipschitz, lam, base_size, epsilon):
    """Alg. 2 noise scale ``b = 4L/(λBε)``, constant over scales k (spec §1.2, §4.1 item 1)."""
    return 4.0 * lipschitz / (lam * base_size * epsilon)


def alg3_noise_scale(lipschitz, lam, block_size, epsilon):
    """Alg. 3 / Alg. 4 update noise ``b = 4L/(λ b0 ε)`` (spec §1.2, §4.1 item 2)."""
    return 4.0 * lipschitz / (lam * block_size * epsilon)


def alg5_base_noise_scale(lipschitz, lam, base_blocks, block_size, epsilon):
    """Alg. 5 base-model noise ``b = 6L/(λ ε P w0)`` (spec §1.2, §4.1 item 3)."""
    return 6.0 * lipschitz / (lam * epsilon * base_blocks * block_size)


def alg5_finetune_noise_scale(lipschitz, lam, block_size, epsilon):
    """Alg. 5 fine-tune noise ``b = 12L/(λ w0 ε)``, constant over levels (spec §1.2, §5.10)."""
    return 12.0 * lipschitz / (lam * block_size * epsilon)


# -- the loss -----------------------------------------------------------------------


class LogisticLoss:
    """Logistic loss, binary (2 classes) or softmax (K ≥ 3), on clipped features.

    Features are clipped to ``‖x‖₂ <= feature_bound`` (contribution bounding,
    spec §5.5); with ``fit_intercept`` a constant 1 is appended, so the
    augmented x̃ has ``‖x̃‖ <= R̃ = √(R_x² + 1)`` and the intercept is part of
    the regularised parameter vector (strong convexity must hold in every
    coordinate). The Lipschitz constant comes from these public bounds only:

    * binary: ∇ℓ = −s·σ(−s⟨θ, x̃⟩)·x̃ with s = ±1, so ``L = R̃``;
    * softmax: ∇ℓ = (p − e_y)x̃ᵀ with ‖p − e_y‖₂ <= √2, so ``L = √2·R̃``.

    Parameter count p: d + 1 (binary, with intercept) or K·(d + 1) (softmax);
    without intercept drop the +1. The flat parameter vector is
    ``[w, b]`` (binary) or ``[W (K×d) row-major, b (K)]`` (softmax).
    """

    def __init__(self, n_features, classes, feature_bound, fit_intercept=True):
        self.n_features = _int("n_features", n_features, 1)
        classes = tuple(classes) if classes is not None else ()
        if len(classes) < 2:
            raise ValueError(f"classes must list at least 2 distinct labels, got {classes!r}")
        if len(set(classes)) != len(classes):
            raise ValueError(f"classes must be distinct, got {classes!r}")
        self.classes = classes
        self._index = {c: i for i, c in enumerate(classes)}
        self.feature_bound = _real("feature_bound", feature_bound, positive=True)
        if not isinstance(fit_intercept, bool):
            raise ValueError(f"fit_intercept must be a bool, got {fit_intercept!r}")
        self.fit_intercept = fit_intercept
        self.binary = len(classes) == 2
        self.n_outputs = 1 if self.binary else len(classes)
        self.n_params = self.n_outputs * (self.n_features + int(fit_intercept))
        self.augmented_bound = math.sqrt(self.feature_bound**2 + (1.0 if fit_intercept else 0.0))
        self.lipschitz = self.augmented_bound * (1.0 if self.binary else math.sqrt(2.0))
        # Hessian of the per-example loss: σ(1−σ)x̃x̃ᵀ <= x̃x̃ᵀ/4 (binary);
        # (diag(p) − ppᵀ) ⊗ x̃x̃ᵀ with ‖diag(p) − ppᵀ‖ <= 1/2 (softmax).
        self.smoothness = self.augmented_bound**2 * (0.25 if self.binary else 0.5)

    def labels(self, y):
        """Class indices of the labels ``y``; ValueError naming ``y`` for an unknown label."""
        try:
            return np.array([self._index[v] for v in np.asarray(y, dtype=object).ravel()], dtype=np.int64)
        except (KeyError, TypeError):
            bad = [v for v in np.asarray(y, dtype=object).ravel() if v not in self._index]
            raise ValueError(f"y must hold labels from classes {self.classes!r}, got {bad[:3]!r}") from None

    def clip(self, X):
        """Rows of X scaled down to norm ``feature_bound``; ValueError naming ``X`` if not finite."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X must be finite")
        norms = np.linalg.norm(X, axis=1)
        factor = np.minimum(1.0, self.feature_bound / np.maximum(norms, 1e-300))
        return X * factor[:, None]

    def augment(self, X):
        if self.fit_intercept:
            return np.hstack([X, np.ones((X.shape[0], 1))])
        return X

    def unpack(self, theta):
        """``(weights, intercept)``: shapes ``(d,)``, scalar (binary) or ``(K, d)``, ``(K,)``."""
        theta = np.asarray(theta, dtype=np.float64)
        d = self.n_features
        if self.binary:
            return theta[:d].copy(), float(theta[d]) if self.fit_intercept else 0.0
        K = self.n_outputs
        mat = theta.reshape(K, d + int(self.fit_intercept))
        intercept = mat[:, d].copy() if self.fit_intercept else np.zeros(K)
        return mat[:, :d].copy(), intercept

    def value_grad(self, theta, Xa, yi):
        """Mean loss and gradient over augmented rows ``Xa`` with class indices ``yi``."""
        n = Xa.shape[0]
        if self.binary:
            s = 2.0 * yi - 1.0
            m = s * (Xa @ theta)
            value = float(np.mean(np.logaddexp(0.0, -m)))
            coef = -s * _sigmoid(-m)
            return value, Xa.T @ coef / n
        K = self.n_outputs
        Th = theta.reshape(K, Xa.shape[1])
        Z = Xa @ Th.T
        zmax = Z.max(axis=1, keepdims=True)
        lse = zmax[:, 0] + np.log(np.exp(Z - zmax).sum(axis=1))
        value = float(np.mean(lse - Z[np.arange(n), yi]))
        P = np.exp(Z - lse[:, None])
        P[np.arange(n), yi] -= 1.0
        return value, (P.T @ Xa).ravel() / n

    def decision(self, theta, X):
        Xa = self.augment(self.clip(X))
        if self.binary:
            return Xa @ np.asarray(theta, dtype=np.float64)
        return Xa @ np.asarray(theta, dtype=np.float64).reshape(self.n_outputs, Xa.shape[1]).T


def _sigmoid(z):
    return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


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


def solve_erm(loss, X, y, lam, theta_ref=None, tol_fraction=0.5):
    """Minimise ``F(θ) = (1/n)Σℓ(θ; z_i) + λ‖θ − θ_ref‖²`` to a certified tolerance; never raises on data.

    Spec §1.2, §1.4, §5.3–5.4. F is 2λ-strongly convex, so the exact minimiser
    moves by at most ``2L/(n·2λ) = L/(λn)`` when one of the n records is
    replaced (Chaudhuri et al. 2011); the paper's ``2L/(λn)`` is twice that.
    The output θ̃ is always within ``r = g/(2λ)`` of the exact minimiser θ*,
    with ``g = tol_fraction·L/n``; then for neighbours D, D′

        ‖θ̃(D) − θ̃(D′)‖ <= r + L/(λn) + r = (1 + tol_fraction)·L/(λn) <= 2L/(λn),

    so the paper's sensitivity (the one the noise is calibrated to) covers the
    optimisation error as long as ``tol_fraction <= 1`` (0.5 leaves room for
    rounding).

    Why ``‖θ̃ − θ*‖ <= r`` always holds, whatever the data: the minimiser is
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

    X must already be clipped (:meth:`LogisticLoss.clip`); ``y`` holds class
    indices. Returns ``(θ̃, ‖∇F(θ̃)‖)``, the measured gradient norm (above
    ``g`` only on the second exit).
    """
    lam = _real("lam", lam, positive=True)
    tol_fraction = _real("tol_fraction", tol_fraction, positive=True)
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
    result = optimize.minimize(
        fun, ref.copy(), jac=True, method="L-BFGS-B",
        options={"gtol": gtol / math.sqrt(loss.n_params), "ftol": 0.0, "maxiter": 10_000, "maxcor": 20},
    )
    theta = np.asarray(result.x, dtype=np.float64)
    value, grad = fun(theta) if np.all(np.isfinite(theta)) else (math.inf, None)
    if not value <= fun(ref)[0]:
        # The descent bound needs a start no worse than θ_ref.
        theta = ref.copy()
        _, grad = fun(theta)
    gnorm = float(np.linalg.norm(grad))
    step = 1.0 / (loss.smoothness + 2.0 * lam)
    for _ in range(_descent_steps(loss, lam, n, tol_fraction)):
        if gnorm <= gtol:
            break
        theta = theta - step * grad
        _, grad = fun(theta)
        gnorm = float(np.linalg.norm(grad))
    return theta, gnorm


# -- output perturbation (Alg. 1 and Alg. 3) -------------------------------------------


class OutputPerturbation:
    """Algorithm 1 (PSGD output perturbation) and Algorithm 3 (PBERM), spec §1.2, §1.4.

    ``train(X, y, theta_ref, fraction)`` minimises
    ``(1/n)Σℓ + λ‖θ − θ_ref‖²`` over the n given points (normalised by the
    actual n, the §5.6 fix) with :func:`solve_erm`, then adds noise calibrated
    so that the call costs ``fraction`` of this component's budget:

    * ``"l2_laplace"``: L2-Laplace with ``b = Δ₂/(fraction·ε)``, Δ₂ = 2L/(λn);
      the call is (fraction·ε)-DP (Lemma A.1 of 004). Per-coordinate std
      ``√(p+1)·b``.
    * ``"coord_laplace_l1"``: i.i.d. Lap(√p·Δ₂/(fraction·ε)) per coordinate;
      ‖·‖₁ <= √p‖·‖₂ makes it (fraction·ε)-DP. Std ``√2·√p·Δ₂/(fraction·ε)``.
    * ``"gaussian"`` [CHOICE]: N(0, σ²I) with ``σ = Δ₂/√(2·fraction·ρ)``, so the
      call is (fraction·ρ)-zCDP; ρ = ρ(ε, δ) by the simple conversion. Fractions
      that sum to <= 1 per record then compose to ρ-zCDP, hence (ε, δ)-DP.

    θ_ref is 0 for a model trained from scratch, or a previously **released**
    (noisy) model for PBERM: it is public, so using it is post-processing.
    """

    def __init__(self, loss, lam, epsilon, noise="l2_laplace", delta=None, rng=None, tol_fraction=0.5):
        self.loss = loss
        self.lam = _real("lam", lam, positive=True)
        self.epsilon = _real("epsilon", epsilon, positive=True)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        self.noise = noise
        if noise == "gaussian":
            if delta is None:
                raise ValueError("delta must be in (0, 1) for Gaussian noise, got None")
            self.delta = _real("delta", delta)
            if not 0.0 < self.delta < 1.0:
                raise ValueError(f"delta must be in (0, 1) for Gaussian noise, got {delta!r}")
            self.rho = rho_from_eps_delta(self.epsilon, self.delta)
        else:
            if delta not in (None, 0, 0.0):
                raise ValueError(f"delta must be None or 0 for {noise!r} noise (pure epsilon-DP), got {delta!r}")
            self.delta = 0.0
            self.rho = rho_from_eps(self.epsilon)
        self.tol_fraction = _real("tol_fraction", tol_fraction, positive=True)
        if self.tol_fraction > 1.0:
            raise ValueError(f"tol_fraction must be <= 1, got {tol_fraction!r}")
        self.source = make_noise(rng)

    def sensitivity(self, n):
        """Paper-conservative L2 sensitivity ``2L/(λn)`` of the minimiser (§1.2, §5.3)."""
        return 2.0 * self.loss.lipschitz / (self.lam * n)

    def call_noise(self, n, fraction):
        """``{"kind", "scale", "std"}`` of a call on n points costing ``fraction`` of the budget.

        The scale is calibrated for the L2 sensitivity plus ``√p`` noise-grid
        steps: :meth:`train` rounds the minimiser to the grid of its noise
        (see there), which can move it by half a step per coordinate
        (:func:`~dp_beam.mechanisms.noise_key.grid_padded_scale`).
        """
        delta2 = self.sensitivity(n)
        p = self.loss.n_params
        if self.noise == "l2_laplace":
            def scale_of(s):
                return s / (fraction * self.epsilon)
        elif self.noise == "coord_laplace_l1":
            def scale_of(s):
                return math.sqrt(p) * s / (fraction * self.epsilon)
        else:
            def scale_of(s):
                return s / math.sqrt(2.0 * fraction * self.rho)
        scale = grid_padded_scale(delta2, scale_of, spread=math.sqrt(p))
        if self.noise == "l2_laplace":
            std = math.sqrt(p + 1.0) * scale
        elif self.noise == "coord_laplace_l1":
            std = math.sqrt(2.0) * scale
        else:
            std = scale
        return {"kind": self.noise, "scale": scale, "std": std}

    def draw(self, scale):
        p = self.loss.n_params
        if self.noise == "l2_laplace":
            return l2_laplace_noise(self.source, scale, p)
        if self.noise == "coord_laplace_l1":
            return self.source.laplace(scale, p)
        return self.source.gaussian(scale, p)

    def train(self, X, yi, theta_ref, fraction):
        """Noisy minimiser and its noise description (``X`` clipped, ``yi`` indices)."""
        theta, _ = solve_erm(self.loss, X, yi, self.lam, theta_ref, self.tol_fraction)
        noise = self.call_noise(X.shape[0], fraction)
        draw = self.draw(noise["scale"])
        if self.source.exact_grid:
            # Keyed production noise: θ and the noise on one grid, so the
            # sum is exact and its low-order bits carry nothing about the
            # data (Mironov 2012). Coordinate noise is already on the grid;
            # the L2-Laplace vector is a float computation on grid draws and
            # is rounded to it here (post-processing of data-free noise).
            theta = round_to_grid(theta, noise["scale"])
            draw = round_to_grid(draw, noise["scale"])
        return theta + draw, noise


# -- releases ----------------------------------------------------------------------------


def _merge(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


@dataclass(frozen=True)
class ModelRelease:
    """One released model (spec §1.3–1.7). Intervals are half-open record ranges ``(a, b]``.

    ``kind``/``level``: ``"scale"`` k (Alg. 2); ``"base"`` k, ``"doubling"`` j,
    ``"single"`` 0 (Alg. 4); ``"base"`` ⌊log₂P⌋, ``"right"``/``"left"`` bucket
    level i (Alg. 5). ``t``: points consumed when it was released.
    ``trained_on``: the data of this training call; ``regulariser``: the
    ``trained_on`` of the model it was regularised toward (None: from scratch);
    ``depends_on``: every record the model is a function of, through its
    regulariser chain (the lineage, §1.5 and §4.2 item 12); ``window``: the data
    window the release stands for. ``noise_scale``/``noise_std`` describe the
    noise of this call; ``fraction`` is the share of the component's budget the
    call costs for each of its records and ``call_epsilon``/``call_rho`` the
    resulting cost. Releasing the same model again (a reused bucket) costs
    nothing: it is post-processing.
    """

    t: int
    kind: str
    level: int
    trained_on: tuple
    regulariser: object
    depends_on: tuple
    window: tuple
    params: np.ndarray = field(repr=False, compare=False)
    classes: tuple
    n_features: int
    fit_intercept: bool
    noise: str
    noise_scale: float
    noise_std: float
    fraction: float
    call_epsilon: float
    call_rho: float

    @property
    def weights(self):
        """``(d,)`` (binary: the weight of ``classes[1]``) or ``(K, d)`` (softmax)."""
        return self._shape().unpack(self.params)[0]

    @property
    def intercept(self):
        """A float (binary) or ``(K,)``; 0 without ``fit_intercept``."""
        return self._shape().unpack(self.params)[1]

    def _shape(self):
        # Only the shape matters for unpacking; the bound is not used.
        return LogisticLoss(self.n_features, self.classes, 1.0, self.fit_intercept)

    def to_dict(self):
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["params"] = [float(v) for v in self.params]
        out["trained_on"] = list(self.trained_on)
        out["regulariser"] = None if self.regulariser is None else list(self.regulariser)
        out["depends_on"] = [list(iv) for iv in self.depends_on]
        out["window"] = list(self.window)
        out["classes"] = list(self.classes)
        return out

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["params"] = np.asarray(d["params"], dtype=np.float64)
        d["trained_on"] = tuple(d["trained_on"])
        d["regulariser"] = None if d["regulariser"] is None else tuple(d["regulariser"])
        d["depends_on"] = tuple(tuple(iv) for iv in d["depends_on"])
        d["window"] = tuple(d["window"])
        d["classes"] = tuple(d["classes"])
        return cls(**d)


def predict_proba(release, X):
    """Class probabilities of a released model on X (post-processing, free).

    ``release`` is anything with ``weights``, ``intercept`` and ``classes``
    (a :class:`ModelRelease`, or the ``ModelRecord`` of the Beam transforms).
    Rows of X are used as given (clipping is a training-time contribution
    bound, not part of the model). Returns shape ``(n, K)`` in the order of
    ``classes``.
    """
    W = np.asarray(release.weights, dtype=np.float64)
    b = np.asarray(release.intercept, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    d = W.shape[-1]
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"X must have shape (n, {d}), got {X.shape}")
    if W.ndim == 1:
        p1 = _sigmoid(X @ W + float(b))
        return np.column_stack([1.0 - p1, p1])
    Z = X @ W.T + b
    Z = Z - Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


def predict(release, X):
    """Most probable class label for each row of X (post-processing, free)."""
    idx = np.argmax(predict_proba(release, X), axis=1)
    return [release.classes[i] for i in idx]


# -- the block log ------------------------------------------------------------------------


class BlockLog:
    """Where an ERM stream keeps its complete blocks of raw points (spec §3, per-key state).

    Spec §3, notes of the per-key state table: Alg. 4 and Alg. 2 need the
    history, "store it in a durable per-key log, not in memory". The stream
    splits its state in two: the *small state* of :meth:`_ERMStream.to_state`
    (the partial block, the O(log t) models, counters) that an engine rewrites
    at every firing, and this log of full blocks, which only grows by appends
    and is read back only by the trainings that use old blocks.

    The stream talks to it through three calls:

    * :meth:`append` — block ``index`` (1-based count) is complete;
    * :meth:`read` — the blocks of the block interval ``(lo, hi]``, in order,
      when a model trains on them (the newest block is read back too, so a log
      may answer from what it has not yet written);
    * :meth:`release_before` — blocks below ``keep`` are never read again
      (the stream's retention bound); a log may drop them at once or later.

    A block is ``(X, y)``: clipped features ``(block_size, d)`` and class
    indices ``(block_size,)``. Engines provide their own implementation (the
    Beam transforms: a ``BagState``, see ``dp_beam.transforms.release.BagLog``;
    any object with these three methods will do); :class:`MemoryBlockLog` is
    the default.
    """

    def append(self, index, block):
        raise NotImplementedError

    def read(self, lo, hi):
        raise NotImplementedError

    def release_before(self, keep):
        raise NotImplementedError


class MemoryBlockLog(BlockLog):
    """The default, in-memory :class:`BlockLog`: drops released blocks at once.

    Its blocks are part of the stream's :meth:`~_ERMStream.to_state` (that is
    the engine-free behaviour: one self-contained state).

    >>> import numpy as np
    >>> log = MemoryBlockLog()
    >>> for i in (1, 2, 3):
    ...     log.append(i, (np.full((2, 1), float(i)), np.zeros(2, dtype=np.int64)))
    >>> [float(X[0, 0]) for X, _ in log.read(1, 3)]
    [2.0, 3.0]
    >>> log.release_before(3); sorted(log.blocks)
    [3]
    """

    def __init__(self, blocks=None):
        self.blocks = dict(blocks or {})

    def append(self, index, block):
        self.blocks[index] = block

    def read(self, lo, hi):
        return [self.blocks[b] for b in range(lo + 1, hi + 1)]

    def release_before(self, keep):
        for b in [b for b in self.blocks if b < keep]:
            del self.blocks[b]


# -- streams -----------------------------------------------------------------------------


class _ERMStream:
    """Shared machinery: configuration, block buffering, retained blocks, state."""

    name = None
    STATE_VERSION = 1

    def __init__(self, *, epsilon, block_size, n_features, classes, feature_bound, lam,
                 fit_intercept, noise, delta, rng, tol_fraction, log=None):
        if log is not None and not all(callable(getattr(log, m, None)) for m in ("append", "read", "release_before")):
            raise ValueError(f"log must be a BlockLog (append, read, release_before) or None, got {log!r}")
        self.block_size = _int("block_size", block_size, 1)
        self.loss = LogisticLoss(n_features, classes, feature_bound, fit_intercept)
        self.epsilon = _real("epsilon", epsilon, positive=True)
        self.lam = _real("lam", lam, positive=True)
        # Validate noise/delta once, on the whole budget, so errors name them.
        OutputPerturbation(self.loss, lam, epsilon, noise, delta, rng=ZeroNoise(), tol_fraction=tol_fraction)
        self.noise = noise
        self.delta = None if noise != "gaussian" else float(delta)
        self.tol_fraction = float(tol_fraction)
        self._source = make_noise(rng)
        # Complete blocks: index (1-based count) -> (X clipped, class indices).
        self._log = MemoryBlockLog() if log is None else log
        self._keep = 1             # first block a future training may read
        self._buffer_X, self._buffer_y = [], []
        self._count = 0            # complete blocks consumed
        self._trained = []         # models trained by the last block, in training order

    def _component(self, share):
        """Output perturbation with ``share`` of the budget (ε·share, or ρ·share for Gaussian)."""
        if self.noise == "gaussian":
            # ρ(ε, δ)·share as a ρ-budget: build with the total and scale ρ.
            op = OutputPerturbation(self.loss, self.lam, self.epsilon, self.noise, self.delta,
                                    rng=self._source, tol_fraction=self.tol_fraction)
            op.rho = op.rho * share
            return op
        return OutputPerturbation(self.loss, self.lam, self.epsilon * share, self.noise, None,
                                  rng=self._source, tol_fraction=self.tol_fraction)

    @property
    def t(self):
        """Number of points consumed in complete blocks."""
        return self._count * self.block_size

    def _config(self):
        return {
            "epsilon": self.epsilon, "block_size": self.block_size,
            "n_features": self.loss.n_features, "classes": list(self.loss.classes),
            "feature_bound": self.loss.feature_bound, "lam": self.lam,
            "fit_intercept": self.loss.fit_intercept, "noise": self.noise, "delta": self.delta,
            "tol_fraction": self.tol_fraction,
        }

    def privacy_cost(self):
        """``{"epsilon", "delta", "rho"}`` of the whole release sequence, per record (§1.9)."""
        if self.noise == "gaussian":
            return {"epsilon": self.epsilon, "delta": self.delta,
                    "rho": rho_from_eps_delta(self.epsilon, self.delta)}
        return {"epsilon": self.epsilon, "delta": 0.0, "rho": rho_from_eps(self.epsilon)}

    # -- input --------------------------------------------------------------------

    def push(self, x, y):
        """Buffer one point; when a block completes, run :meth:`step` and return its releases."""
        x = np.asarray(x, dtype=np.float64).reshape(1, -1)
        X = self.loss.clip(x)
        yi = self.loss.labels([y])
        self._buffer_X.append(X[0])
        self._buffer_y.append(int(yi[0]))
        if len(self._buffer_y) < self.block_size:
            return []
        Xb, yb = np.array(self._buffer_X), np.array(self._buffer_y, dtype=np.int64)
        self._buffer_X, self._buffer_y = [], []
        return self._consume(Xb, yb)

    def extend(self, X, y):
        """Push many points in order; returns all releases they complete."""
        out = []
        for xi, yi in zip(np.asarray(X, dtype=np.float64), list(y)):
            out.extend(self.push(xi, yi))
        return out

    def step(self, X, y):
        """Consume one block of exactly ``block_size`` points; returns its releases (maybe none)."""
        if self._buffer_y:
            raise ValueError("step needs an empty point buffer; finish the block with push()")
        X = self.loss.clip(X)
        yi = self.loss.labels(y)
        if X.shape[0] != self.block_size or yi.shape[0] != self.block_size:
            raise ValueError(f"X and y must hold exactly block_size={self.block_size} points, "
                             f"got {X.shape[0]} and {yi.shape[0]}")
        return self._consume(X, yi)

    @property
    def trained_last_step(self):
        """Models trained (noise drawn) by the last block, in training order.

        Each costs its ``fraction`` of the budget for every record of its
        ``trained_on``; a release of an older model costs nothing. Summing
        these per record is the exact privacy accounting of §1.9.
        """
        return list(self._trained)

    def _consume(self, X, yi):
        self._count += 1
        self._trained = []
        self._log.append(self._count, (X, yi))
        releases = self._schedule(self._count)
        self._keep = max(self._keep, self._retain_from(self._count))
        self._log.release_before(self._keep)
        return releases

    @property
    def log(self):
        """The :class:`BlockLog` holding the complete blocks."""
        return self._log

    @property
    def retained_blocks(self):
        """``(first, last)``: the blocks a future training may read (empty if first > last)."""
        return self._keep, self._count

    def _data(self, lo, hi):
        """Points of blocks lo+1..hi (block interval (lo, hi]), read from the log."""
        blocks = self._log.read(lo, hi)
        return np.vstack([X for X, _ in blocks]), np.concatenate([y for _, y in blocks])

    def _release(self, op, kind, level, blocks, ref, fraction, depends_on, window):
        """Train on block interval ``blocks`` regularised toward release ``ref``; wrap the result."""
        X, yi = self._data(*blocks)
        theta_ref = None if ref is None else ref.params
        theta, noise = op.train(X, yi, theta_ref, fraction)
        bs = self.block_size
        rec = lambda iv: (iv[0] * bs, iv[1] * bs)  # noqa: E731
        release = ModelRelease(
            t=self.t, kind=kind, level=level, trained_on=rec(blocks),
            regulariser=None if ref is None else ref.trained_on,
            depends_on=_merge([rec(iv) for iv in depends_on]), window=rec(window),
            params=theta, classes=self.loss.classes, n_features=self.loss.n_features,
            fit_intercept=self.loss.fit_intercept, noise=self.noise,
            noise_scale=noise["scale"], noise_std=noise["std"], fraction=fraction,
            call_epsilon=fraction * op.epsilon if self.noise != "gaussian" else None,
            call_rho=fraction * op.rho,
        )
        self._trained.append(release)
        return release

    # -- state ------------------------------------------------------------------------

    def to_state(self):
        """Plain dict (JSON-friendly): configuration, buffer, models, counters — and the blocks
        if the stream keeps them in memory.

        With the default :class:`MemoryBlockLog` the state is self-contained:
        it includes the retained blocks. With an engine's log (``log=`` at
        construction) it is only the *small state* — the partial block
        (< block_size points), the models (the class docstrings bound their
        number by O(log t)) and counters — and the blocks stay in that log; the
        state then says ``"log": "external"`` and :meth:`from_state` needs the
        same log. The noise source is not included; :meth:`from_state` takes
        its own. The state (like the log) holds raw clipped points and must be
        stored like the data.
        """
        state = {
            "mechanism": self.name, "version": self.STATE_VERSION, "config": self._config(),
            "count": self._count, "keep": self._keep,
            "buffer": {"X": [list(map(float, r)) for r in self._buffer_X], "y": list(self._buffer_y)},
            "dynamic": self._dynamic_state(),
        }
        if isinstance(self._log, MemoryBlockLog):
            state["blocks"] = {str(b): {"X": X.tolist(), "y": y.tolist()}
                               for b, (X, y) in sorted(self._log.blocks.items())}
        else:
            state["log"] = "external"
        return state

    @classmethod
    def from_state(cls, state, rng=None, log=None):
        """Rebuild a stream from :meth:`to_state`; ``rng`` as in the constructor.

        ``log``: the :class:`BlockLog` that holds the blocks of a small state
        (``"log": "external"``); required for such a state. Given with a
        self-contained state, the state's blocks are appended to it (moving a
        stream's history into a durable log).
        """
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        external = state.get("log") == "external"
        if external and log is None:
            raise ValueError("log is required: this state keeps its blocks in an external log")
        try:
            obj = cls(**state["config"], rng=rng, log=log)
            obj._count = int(state["count"])
            obj._buffer_X = [np.asarray(r, dtype=np.float64) for r in state["buffer"]["X"]]
            obj._buffer_y = [int(v) for v in state["buffer"]["y"]]
            if not external:
                blocks = {int(b): (np.asarray(v["X"], dtype=np.float64).reshape(-1, obj.loss.n_features),
                                   np.asarray(v["y"], dtype=np.int64)) for b, v in state["blocks"].items()}
                for b in sorted(blocks):
                    obj._log.append(b, blocks[b])
            default_keep = min(blocks, default=obj._count + 1) if not external else 1
            obj._keep = int(state.get("keep", default_keep))
            obj._log.release_before(obj._keep)
            obj._load_dynamic(state["dynamic"])
        except KeyError as err:
            raise ValueError(f"state is missing field {err.args[0]!r}") from None
        return obj

    def state_size(self):
        """``(points held, models held)``: the quantities the class docstring bounds.

        Points are the partial block plus the retained blocks
        (:attr:`retained_blocks`), wherever the log keeps them.
        """
        first, last = self.retained_blocks
        points = len(self._buffer_y) + max(0, last - first + 1) * self.block_size
        return points, self._model_count()


def _model_to(m):
    return None if m is None else m.to_dict()


def _model_from(d):
    return None if d is None else ModelRelease.from_dict(d)


class MultiResolutionERM(_ERMStream):
    """Algorithm 2, private multi-resolution release (spec §1.3).

    ``block_size`` is B. After the q-th block (t = q·B) it releases, for every
    scale k >= 0 with 2^k | q (and k <= ``max_scale`` if given), a model trained
    from scratch on the records (t − 2^k·B, t], with L2-Laplace scale
    ``b = 4L/(λBε)`` for every k: sensitivity 2L/(λ2^kB) over b gives a per-call
    cost of ε/2^{k+1}. At a fixed scale the intervals are aligned and disjoint,
    so each record pays Σ_k ε/2^{k+1} < ε (Thm 1; with a cap,
    ε(1 − 2^{−(max_scale+1)})). :meth:`privacy_cost` reports ε.

    State (spec §3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< B points) and counters — no models, each is
    released at once — so O(B·d) numbers whatever t. The :class:`BlockLog`
    retains, with ``max_scale`` = K, only the blocks of the current aligned
    interval of 2^K blocks (< 2^K·B points; everything is released when the
    interval completes), and without a cap the whole history (inherent: the
    scale-k model at t = 2^k·B needs all of (0, t]). Every even block reads
    old blocks back (the scale-1 model and up).
    """

    name = "erm_multires"

    def __init__(self, epsilon, block_size, n_features, classes, feature_bound, lam,
                 fit_intercept=True, noise="l2_laplace", delta=None, max_scale=None, rng=None,
                 tol_fraction=0.5, log=None):
        super().__init__(epsilon=epsilon, block_size=block_size, n_features=n_features, classes=classes,
                         feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept, noise=noise,
                         delta=delta, rng=rng, tol_fraction=tol_fraction, log=log)
        self.max_scale = None if max_scale is None else _int("max_scale", max_scale, 0)
        self._op = self._component(1.0)

    def _config(self):
        return {**super()._config(), "max_scale": self.max_scale}

    def noise_scale(self):
        """Laplace scale ``4L/(λBε)`` shared by every scale (for Gaussian noise σ
        varies with k: see :meth:`call_noise`)."""
        return self._op.call_noise(self.block_size, 0.5)["scale"]

    def call_noise(self, k):
        """Noise of the scale-k call: n = 2^k·B, fraction 2^{−(k+1)}."""
        return self._op.call_noise((1 << k) * self.block_size, 2.0 ** -(k + 1))

    @staticmethod
    def schedule(q, max_scale=None):
        """Block intervals ``(k, (lo, hi])`` released after block q (public)."""
        out, k = [], 0
        while q % (1 << k) == 0 and (max_scale is None or k <= max_scale):
            out.append((k, (q - (1 << k), q)))
            k += 1
        return out

    def _schedule(self, q):
        releases = []
        for k, blocks in self.schedule(q, self.max_scale):
            releases.append(self._release(self._op, "scale", k, blocks, None, 2.0 ** -(k + 1),
                                          [blocks], blocks))
        return releases

    def _retain_from(self, q):
        if self.max_scale is None:
            return 1
        span = 1 << self.max_scale
        return (q // span) * span + 1

    def _dynamic_state(self):
        return {}

    def _load_dynamic(self, d):
        pass

    def _model_count(self):
        return 0


class ContinualERM(_ERMStream):
    """Private continual cumulative release: Algorithm 4 with Alg. 2 base models (spec §1.5).

    ``block_size`` is b0, ``base_size`` is B (a multiple of b0, §5.7). The
    budget ε is split [CHOICE, §1.9 "Alg. 2+4 alone → ε/2 each"]: the base
    models (Alg. 2's cumulative q = 1 outputs) get ε/2 and the Alg. 4 updates
    ε/2. Releases start at t = B, one per block of b0 points:

    * t = 2^k·B (base): from scratch on (0, t], ``b = 4L/(λB·ε/2)``, per-call
      ε/2 · 2^{−(k+1)}; becomes f_g and f_c.
    * t = t_g + 2^j·b0 (doubling): PBERM toward f_g on (t_g, t], normalised by
      its 2^j·b0 points (§5.6), ``b = 4L/(λ b0·ε/2)``, per-call ε/2 · 2^{−(j+1)};
      becomes f_c.
    * otherwise (single): PBERM toward f_c on (t − b0, t], same b, per-call ε/2 · 1/2.

    Per record: the bases sum to < ε/2 (geometric series); a b0-batch enters at
    most one single step and doubling steps of distinct j, < ε/2 (Thm 4). So
    the release sequence is ε-DP (:meth:`privacy_cost`); with Gaussian noise
    ρ(ε, δ) is split the same way.

    Lineage: a base or doubling release depends on (0, t]; a single release on
    (0, t_c] ∪ (t − b0, t] (t_c = the last base/doubling time).

    State (spec §3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< b0 points), at most 2 models (f_g, f_c) and the
    counters t, t_g — O(b0·d + p) numbers whatever t. The :class:`BlockLog`
    retains the whole history of blocks (inherent: the base at 2^k·B trains on
    (0, t]); only base and doubling releases read old blocks back (single
    steps train on the block just completed).

    Example (``ZeroNoise`` switches noise off to show the schedule; it is not
    private, and production code leaves ``rng=None``). b0 = 2, B = 4 and L = 1:

    >>> import numpy as np
    >>> from dp_beam.mechanisms import ZeroNoise
    >>> s = ContinualERM(epsilon=1.0, block_size=2, base_size=4, n_features=1, classes=[0, 1],
    ...                  feature_bound=1.0, lam=1.0, fit_intercept=False, rng=ZeroNoise())
    >>> for r in s.extend(np.array([[1.0], [-1.0]] * 7), [1, 0] * 7):
    ...     print(r.t, r.kind, r.level, r.trained_on, r.regulariser, r.fraction)
    4 base 0 (0, 4) None 0.5
    6 doubling 0 (4, 6) (0, 4) 0.5
    8 base 1 (0, 8) None 0.25
    10 doubling 0 (8, 10) (0, 8) 0.5
    12 doubling 1 (8, 12) (0, 8) 0.25
    14 single 0 (12, 14) (8, 12) 0.5
    >>> round(s.base_noise_scale(), 6), round(s.update_noise_scale(), 6)    # 4L/(λB·ε/2), 4L/(λb0·ε/2)
    (2.0, 4.0)
    >>> s.privacy_cost()
    {'epsilon': 1.0, 'delta': 0.0, 'rho': 0.5}
    """

    name = "erm_continual"

    def __init__(self, epsilon, block_size, base_size, n_features, classes, feature_bound, lam,
                 fit_intercept=True, noise="l2_laplace", delta=None, rng=None, tol_fraction=0.5, log=None):
        super().__init__(epsilon=epsilon, block_size=block_size, n_features=n_features, classes=classes,
                         feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept, noise=noise,
                         delta=delta, rng=rng, tol_fraction=tol_fraction, log=log)
        base_size = _int("base_size", base_size, 1)
        if base_size % self.block_size:
            raise ValueError(f"base_size must be a multiple of block_size={self.block_size}, got {base_size}")
        self.base_size = base_size
        self.base_blocks = base_size // self.block_size
        self._base_op = self._component(0.5)
        self._update_op = self._component(0.5)
        self._fg = self._fc = None
        self._tg = None

    def _config(self):
        return {**super()._config(), "base_size": self.base_size}

    def base_noise_scale(self):
        """``4L/(λB·ε/2)`` (Laplace kinds; every base)."""
        return self._base_op.call_noise(self.base_size, 0.5)["scale"]

    def update_noise_scale(self):
        """``4L/(λ b0·ε/2)`` (Laplace kinds; every doubling and single step)."""
        return self._update_op.call_noise(self.block_size, 0.5)["scale"]

    @staticmethod
    def schedule(c, base_blocks, tg):
        """Kind of the release after block c: ``("base", k)``, ``("doubling", j)``,
        ``("single", 0)`` or None before the first base. ``tg`` is the last base block."""
        if c < base_blocks:
            return None
        if c % base_blocks == 0 and _is_pow2(c // base_blocks):
            return ("base", (c // base_blocks).bit_length() - 1)
        i = c - tg
        if _is_pow2(i):
            return ("doubling", i.bit_length() - 1)
        return ("single", 0)

    def _schedule(self, c):
        kind = self.schedule(c, self.base_blocks, self._tg)
        if kind is None:
            return []
        what, level = kind
        if what == "base":
            rel = self._release(self._base_op, "base", level, (0, c), None, 2.0 ** -(level + 1),
                                [(0, c)], (0, c))
            self._fg = self._fc = rel
            self._tg = c
        elif what == "doubling":
            rel = self._release(self._update_op, "doubling", level, (self._tg, c), self._fg,
                                2.0 ** -(level + 1), [(0, c)], (0, c))
            self._fc = rel
        else:
            lineage = [(a // self.block_size, b // self.block_size) for a, b in self._fc.depends_on]
            rel = self._release(self._update_op, "single", 0, (c - 1, c), self._fc, 0.5,
                                lineage + [(c - 1, c)], (0, c))
        return [rel]

    def _retain_from(self, c):
        return 1

    def _dynamic_state(self):
        return {"fg": _model_to(self._fg), "fc": _model_to(self._fc), "tg": self._tg}

    def _load_dynamic(self, d):
        self._fg, self._fc, self._tg = _model_from(d["fg"]), _model_from(d["fc"]), d["tg"]

    def _model_count(self):
        return len({id(m) for m in (self._fg, self._fc) if m is not None})


def _right_buckets(b_e, r):
    out, start = [], b_e + 1
    for i in reversed(range(r.bit_length())):
        if r >> i & 1:
            out.append(("R", start, start + (1 << i) - 1, i))
            start += 1 << i
    return out


def _left_buckets(b_s, left):
    out, u = [], 0
    for i in reversed(range(left.bit_length())):
        if left >> i & 1:
            hi = b_s - 1 - u
            out.append(("L", hi - (1 << i) + 1, hi, i))
            u += 1 << i
    return out


def sliding_buckets(s, W, P):
    """Bucket decomposition of the window ending at block s (0-based blocks), spec §1.7.

    Returns ``(j, r, ℓ, buckets)`` with buckets ``(side, lo, hi, level)`` over
    inclusive block indices: the base ``("B", b_s, b_e, None)``, RIGHT(r) and
    LEFT(ℓ). Requires s >= W − 1.
    """
    j = (s - (W - 1)) // P
    b_e = W - 1 + j * P
    b_s = b_e - P + 1
    r = s - b_e
    left = (W - P) - r
    return j, r, left, [("B", b_s, b_e, None)] + _right_buckets(b_e, r) + _left_buckets(b_s, left)


class SlidingWindowERM(_ERMStream):
    """Private sliding-window ERM, Algorithm 5 with the bucket / chain rule of spec §1.7.

    ``block_size`` is w0, ``window`` is w records, W = w/w0 blocks. Exact mode
    needs W = 2^k − 1 (base P = 2^{k−1} blocks); ``window_policy``:
    ``"exact"`` (default) rejects other W, ``"round_down"`` uses
    W′ = 2^{⌊log₂(W+1)⌋} − 1 (see :attr:`effective_window`), ``"general"``
    uses P = ⌊(W+1)/2⌋ with the expiry-ordered chain of §1.7 (c) (exact for any
    W ≥ 1 in privacy and coverage, not chain-consistent). A window that is not
    a multiple of w0 is rounded down to one (§1.7 (a)), except in exact mode,
    where it is rejected.

    From the W-th block on (t >= w) every block yields one release. At step s
    (newest block) the window is LEFT(ℓ) ∪ base ∪ RIGHT(r) (:func:`sliding_buckets`).
    Models whose bucket left the window are discarded (all of them when r = 0,
    the refresh); the chain is the bucket set sorted by (expiry desc, size desc,
    base < left < right) — size-descending in exact mode — and every bucket
    without a model is trained in chain order:

    * base: from scratch, ``b = 6L/(λ ε P w0)``, per-call ε/3;
    * a bucket of 2^i blocks: PBERM toward its chain predecessor's released
      model, ``b = 12L/(λ w0 ε)``, per-call ε/(6·2^i) (the §5.10 fix: 12, not 6).

    The release is the last model of the chain (size w0 in exact mode; the
    newest block when r is odd, the oldest when r is even). Per record:
    base ε/3, plus < ε/3 as a right bucket and < ε/3 as a left bucket, so the
    sequence is ε-DP (Thm 7; exact maxima e.g. 7/12·ε for W = 7).

    State (spec §3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< w0 points) and one model per bucket (k =
    log₂(W + 1) models in exact mode; at most 1 + ⌈log₂P⌉ + ⌈log₂(ℓ_max+1)⌉
    in general mode) — O(w0·d + k·p) numbers whatever t. The
    :class:`BlockLog` retains the W − 1 newest blocks, the part of the next
    window already seen (< w points); releases at even offsets r and at
    refreshes read them back, at odd r the release trains on the new block only.
    """

    name = "erm_sliding"

    def __init__(self, epsilon, block_size, window, n_features, classes, feature_bound, lam,
                 fit_intercept=True, noise="l2_laplace", delta=None, window_policy="exact", rng=None,
                 tol_fraction=0.5, log=None):
        super().__init__(epsilon=epsilon, block_size=block_size, n_features=n_features, classes=classes,
                         feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept, noise=noise,
                         delta=delta, rng=rng, tol_fraction=tol_fraction, log=log)
        if window_policy not in WINDOW_POLICIES:
            raise ValueError(f"window_policy must be one of {WINDOW_POLICIES}, got {window_policy!r}")
        window = _int("window", window, self.block_size)
        self.window = window
        self.window_policy = window_policy
        if window_policy == "exact" and window % self.block_size:
            raise ValueError(f"window must be a multiple of block_size={self.block_size} in exact mode, got {window}")
        W = window // self.block_size
        if window_policy == "exact":
            if not _is_pow2(W + 1):
                raise ValueError(f"window must be (2^k - 1)·block_size in exact mode, got {W} blocks "
                                 f"(use window_policy='round_down' or 'general')")
        elif window_policy == "round_down":
            W = (1 << ((W + 1).bit_length() - 1)) - 1
        self.W = W
        self.P = (W + 1) // 2
        self.left_capacity = W - self.P
        self._base_op = self._component(1.0)
        self._models = {}

    @property
    def effective_window(self):
        """Records in the window actually used (w rounded as the policy says); must be logged."""
        return self.W * self.block_size

    def _config(self):
        return {**super()._config(), "window": self.window, "window_policy": self.window_policy}

    def base_noise_scale(self):
        return self._base_op.call_noise(self.P * self.block_size, 1.0 / 3.0)["scale"]

    def finetune_noise_scale(self, level=0):
        return self._base_op.call_noise((1 << level) * self.block_size, 1.0 / (6.0 * (1 << level)))["scale"]

    def _expiry(self, side, lo, hi, i, b_s, b_e, r):
        P = self.P
        if side == "B":
            return b_e + P
        if side == "R":
            return b_e + min(((r >> (i + 1)) + 1) << (i + 1), P)
        a = b_s - 1 - hi
        return b_e + min(self.left_capacity - (a + (1 << i) - 1), P)

    def plan(self, s):
        """Public schedule at step s: ``(r, chain, new)`` with chain keys ``(side, lo, hi)``
        ordered from the base (first) to the released bucket (last). Does not train."""
        _, r, _, buckets = sliding_buckets(s, self.W, self.P)
        b_e = buckets[0][2]
        b_s = buckets[0][1]
        models = {} if r == 0 else self._models
        items = []
        for side, lo, hi, i in buckets:
            key = (side, lo, hi)
            exp = models[key]["expiry"] if key in models else self._expiry(side, lo, hi, i, b_s, b_e, r)
            rank = {"B": 0, "L": 1, "R": 2}[side]
            items.append(((-exp, -(hi - lo + 1), rank), key, i, exp))
        items.sort()
        chain = [(key, i, exp) for _, key, i, exp in items]
        new = [key for key, _, _ in chain if key not in models]
        return r, chain, new

    def _schedule(self, c):
        s = c - 1
        if s < self.W - 1:
            return []
        r, chain, _ = self.plan(s)
        keys = {key for key, _, _ in chain}
        if r == 0:
            self._models = {}
        self._models = {k: v for k, v in self._models.items() if k in keys}
        window = (s - self.W + 1, s + 1)   # block interval (lo, hi] in 1-based counts
        prev = None
        for key, level, exp in chain:
            if key not in self._models:
                side, lo, hi = key
                blocks = (lo, hi + 1)
                if side == "B":
                    rel = self._release(self._base_op, "base", self.P.bit_length() - 1, blocks, None,
                                        1.0 / 3.0, [blocks], window)
                else:
                    parent = self._models[prev]["release"]
                    lineage = [(a // self.block_size, b // self.block_size) for a, b in parent.depends_on]
                    rel = self._release(self._base_op, "right" if side == "R" else "left", level, blocks,
                                        parent, 1.0 / (6.0 * (1 << level)), lineage + [blocks], window)
                self._models[key] = {"release": rel, "parent": prev, "expiry": exp}
            prev = key
        released = self._models[prev]["release"]
        if released.window != (window[0] * self.block_size, window[1] * self.block_size):
            # A reused model is released again for the new window: same
            # parameters and noise (post-processing), only the label changes.
            released = ModelRelease(**{**released.__dict__, "t": self.t,
                                       "window": (window[0] * self.block_size, window[1] * self.block_size)})
        return [released]

    def _retain_from(self, c):
        # Every bucket lies in its step's window (lineage closure, §1.7), and
        # the next window is blocks c − W + 2 .. c + 1.
        return c - self.W + 2

    def _dynamic_state(self):
        return {"models": [{"key": list(k), "release": v["release"].to_dict(),
                            "parent": None if v["parent"] is None else list(v["parent"]),
                            "expiry": v["expiry"]} for k, v in self._models.items()]}

    def _load_dynamic(self, d):
        self._models = {tuple(m["key"]): {"release": ModelRelease.from_dict(m["release"]),
                                          "parent": None if m["parent"] is None else tuple(m["parent"]),
                                          "expiry": m["expiry"]} for m in d["models"]}

    def _model_count(self):
        return len(self._models)
