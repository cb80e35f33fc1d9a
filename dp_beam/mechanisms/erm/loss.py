"""The loss of private ERM: L2-regularisable logistic loss on clipped features.

``docs/privacy/erm.md`` E-3, E-4 and E-2 (seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*):
binary or softmax logistic regression whose Lipschitz and smoothness
constants come from the public feature bound only, which is what the
sensitivity of every release is calibrated to.
"""

import math
from typing import Any, Callable, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

from ..checks import check_int, check_real

__all__ = ["LogisticLoss"]

#: Labels that ``np.asarray([y], dtype=object).ravel()`` keeps as the one object ``y``, so a
#: dict lookup finds what :meth:`LogisticLoss.labels` would.
_SCALAR_LABELS = frozenset((int, float, str, bool, bytes, type(None)))


class LogisticLoss:
    """Logistic loss, binary (2 classes) or softmax (K ≥ 3), on clipped features.

    Features are clipped to ``‖x‖₂ <= feature_bound`` (contribution bounding,
    erm.md E-2); with ``fit_intercept`` a constant 1 is appended, so the
    augmented x̃ has ``‖x̃‖ <= R̃ = √(R_x² + 1)`` and the intercept is part of
    the regularised parameter vector (strong convexity must hold in every
    coordinate). The Lipschitz constant comes from these public bounds only:

    * binary: ∇ℓ = −s·σ(−s⟨θ, x̃⟩)·x̃ with s = ±1, so ``L = R̃``;
    * softmax: ∇ℓ = (p − e_y)x̃ᵀ with ‖p − e_y‖₂ <= √2, so ``L = √2·R̃``.

    Parameter count p: d + 1 (binary, with intercept) or K·(d + 1) (softmax);
    without intercept drop the +1. The flat parameter vector is
    ``[w, b]`` (binary) or ``[W (K×d) row-major, b (K)]`` (softmax).
    """

    def __init__(self, n_features: int, classes: Sequence, feature_bound: float,
                 fit_intercept: bool = True) -> None:
        self.n_features = check_int("n_features", n_features, 1)
        classes = tuple(classes) if classes is not None else ()
        if len(classes) < 2:
            raise ValueError(f"classes must list at least 2 distinct labels, got {classes!r}")
        if len(set(classes)) != len(classes):
            raise ValueError(f"classes must be distinct, got {classes!r}")
        self.classes = classes
        self._index = {c: i for i, c in enumerate(classes)}
        self.feature_bound = check_real("feature_bound", feature_bound, positive=True)
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

    def labels(self, y: ArrayLike) -> np.ndarray:
        """Class indices of the labels ``y``; ValueError naming ``y`` for an unknown label."""
        try:
            return np.array([self._index[v] for v in np.asarray(y, dtype=object).ravel()], dtype=np.int64)
        except (KeyError, TypeError):
            bad = [v for v in np.asarray(y, dtype=object).ravel() if v not in self._index]
            raise ValueError(f"y must hold labels from classes {self.classes!r}, got {bad[:3]!r}") from None

    def clip(self, X: ArrayLike) -> np.ndarray:
        """Rows of X scaled down to norm ``feature_bound``; ValueError naming ``X`` if not finite."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X must be finite")
        norms = np.linalg.norm(X, axis=1)
        factor = np.minimum(1.0, self.feature_bound / np.maximum(norms, 1e-300))
        return X * factor[:, None]

    def clip_point(self, x: ArrayLike) -> np.ndarray:
        """One point: ``clip(x.reshape(1, -1))[0]``, the same values and errors, without the
        batch set-up that dominates for a single row (erm.md E-2).

        ``np.linalg.norm(X, axis=1)`` is ``sqrt(add.reduce(X·X, axis=1))``; on one
        contiguous row that is the same pairwise sum as ``add.reduce`` of the row.
        """
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.shape[0] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {(1,) + x.shape}")
        square = float(np.add.reduce(x * x))
        # A non-finite entry makes the sum non-finite; only then is the check per entry needed.
        if not math.isfinite(square) and not np.isfinite(x).all():
            raise ValueError("X must be finite")
        factor = min(1.0, self.feature_bound / max(math.sqrt(square), 1e-300))
        return x * factor

    def label_index(self, y: Any) -> int:
        """The class index of one label (erm.md E-3): ``int(labels([y])[0])``, the same values
        and errors, by one dict lookup for a plain scalar label."""
        if type(y) in _SCALAR_LABELS:
            index = self._index.get(y)
            if index is not None:
                return index
        return int(self.labels([y])[0])

    def augment(self, X: ArrayLike) -> np.ndarray:
        """X with a column of ones appended when ``fit_intercept`` (the x̃ of erm.md E-3)."""
        if self.fit_intercept:
            # np.hstack([X, ones]) without its stacking machinery: the same array.
            Xa = np.empty((X.shape[0], X.shape[1] + 1), dtype=np.result_type(X, np.float64))
            Xa[:, :-1] = X
            Xa[:, -1] = 1.0
            return Xa
        return X

    def unpack(self, theta: ArrayLike) -> Tuple[np.ndarray, Union[float, np.ndarray]]:
        """``(weights, intercept)``: shapes ``(d,)``, scalar (binary) or ``(K, d)``, ``(K,)``."""
        theta = np.asarray(theta, dtype=np.float64)
        d = self.n_features
        if self.binary:
            return theta[:d].copy(), float(theta[d]) if self.fit_intercept else 0.0
        K = self.n_outputs
        mat = theta.reshape(K, d + int(self.fit_intercept))
        intercept = mat[:, d].copy() if self.fit_intercept else np.zeros(K)
        return mat[:, :d].copy(), intercept

    def value_grad(self, theta: ArrayLike, Xa: ArrayLike,
                   yi: ArrayLike) -> Tuple[float, np.ndarray]:
        """Mean loss and gradient over augmented rows ``Xa`` with class indices ``yi``."""
        return self.value_grad_on(Xa, yi)(theta)

    def value_grad_on(self, Xa: ArrayLike, yi: ArrayLike) -> Callable[[ArrayLike], Tuple[float, np.ndarray]]:
        """``θ ↦ value_grad(θ, Xa, yi)``, with what depends on the data only computed once
        (a solver evaluates it at many θ on the same points, erm.md E-3)."""
        n = Xa.shape[0]
        if self.binary:
            # −s with s = 2y − 1 = ±1: −(s·m) and (−s)·m are the same float (both exact).
            neg_s = -(2.0 * yi - 1.0)

            def binary(theta):
                neg_margin = neg_s * (Xa @ theta)
                # The mean as np.mean computes it (the float64 sum over n), without its wrapper.
                value = float(np.add.reduce(np.logaddexp(0.0, neg_margin))) / n
                return value, Xa.T @ (neg_s * sigmoid(neg_margin)) / n
            return binary
        K = self.n_outputs
        rows = np.arange(n)

        def softmax(theta):
            Th = theta.reshape(K, Xa.shape[1])
            Z = Xa @ Th.T
            zmax = Z.max(axis=1, keepdims=True)
            lse = zmax[:, 0] + np.log(np.exp(Z - zmax).sum(axis=1))
            value = float(np.add.reduce(lse - Z[rows, yi])) / n
            P = np.exp(Z - lse[:, None])
            P[rows, yi] -= 1.0
            return value, (P.T @ Xa).ravel() / n
        return softmax

    def hessian_on(self, Xa: ArrayLike, yi: ArrayLike) -> Callable[[ArrayLike], np.ndarray]:
        """``θ ↦ ∇²`` of the mean loss over augmented rows ``Xa`` (p × p; erm.md E-3), for the
        solver's Newton steps. Labels do not enter it: the loss is linear in them.

        * binary: ``(1/n)·Σ σ(m_i)(1 − σ(m_i))·x̃_i x̃_iᵀ``, m_i = ⟨θ, x̃_i⟩;
        * softmax: ``(1/n)·Σ (diag(p_i) − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ`` in the flat order of
          :meth:`unpack` (class-major), p_i the class probabilities.

        >>> loss = LogisticLoss(1, [0, 1], 1.0, fit_intercept=False)
        >>> H = loss.hessian_on(np.array([[1.0], [-1.0]]), [0, 1])(np.zeros(1))
        >>> round(float(H[0, 0]), 12)      # (√w·x)ᵀ(√w·x) rounds √(1/8) once: 0.25 to 1e-16
        0.25
        """
        n, width = Xa.shape
        if self.binary:
            def binary(theta):
                s = sigmoid(Xa @ theta)
                return _gram(Xa, s * (1.0 - s) / n)
            return binary
        K = self.n_outputs

        def softmax(theta):
            Z = Xa @ theta.reshape(K, width).T
            P = np.exp(Z - Z.max(axis=1, keepdims=True))
            P /= P.sum(axis=1, keepdims=True)
            # Σ_i p_i p_iᵀ ⊗ x̃_i x̃_iᵀ = AᵀA with the rows A_i = p_i ⊗ x̃_i; the diag(p_i)
            # part is block-diagonal, one weighted Gram matrix per class.
            A = (P[:, :, None] * Xa[:, None, :]).reshape(n, K * width)
            H = -(A.T @ A)
            for a in range(K):
                block = slice(a * width, (a + 1) * width)
                H[block, block] += _gram(Xa, P[:, a])
            return H / n
        return softmax

    def decision(self, theta: ArrayLike, X: ArrayLike) -> np.ndarray:
        Xa = self.augment(self.clip(X))
        if self.binary:
            return Xa @ np.asarray(theta, dtype=np.float64)
        return Xa @ np.asarray(theta, dtype=np.float64).reshape(self.n_outputs, Xa.shape[1]).T


def _gram(Xa: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Σ_i w_i·x̃_i x̃_iᵀ`` for weights ``w >= 0``, as ``AᵀA`` with ``A = √w·Xa``.

    A product of a matrix with its own transpose is one NumPy computes as a symmetric
    rank-k update (BLAS ``syrk``): half the multiplications of the general product
    ``Xaᵀ(w·Xa)`` (n = 4,608, p = 101: 1.8 against 3.3 ms), and exactly symmetric."""
    A = Xa * np.sqrt(w)[:, None]
    return A.T @ A


def sigmoid(z: ArrayLike) -> np.ndarray:
    """σ(z) without overflow: ``1/(1 + e^{−|z|})`` for z >= 0, ``e^{−|z|}/(1 + e^{−|z|})`` below.

    The exponential and the denominator are computed once and shared by both
    branches (the same values as computing them per branch: the same operations
    on the same arrays).
    """
    e = np.exp(-np.abs(z))
    # The numerator picked before dividing: each entry is the quotient its branch
    # gave (1/(1 + e) or e/(1 + e)), with one division per entry instead of two.
    return np.where(z >= 0, 1.0, e) / (1.0 + e)
