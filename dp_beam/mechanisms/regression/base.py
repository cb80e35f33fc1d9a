"""What the three incremental-regression mechanisms share: validation, the release, stepping.

``docs/privacy/regression.md`` (seed 002,
arXiv:1701.01093) and design D1.3 (one model per step, state
per stream bounded, no raw records kept). A mechanism consumes one time step
at a time, as the sums of its points' encodings
(:func:`~dp_beam.mechanisms.regression.moments.encode_point`) and their
count, and releases one model per step. Time is the step index t (1-based);
``n`` is the number of records through step t, public under the replace-one
relation (002 Def. 4: neighbouring streams have the same length).

Example: ``step_points`` encodes raw points exactly as the transform's
per-event stage does, so both feed a mechanism the same sums (a test seed;
production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import PrivIncReg1, PrivIncReg1Params
>>> test_seed = 0
>>> mech = PrivIncReg1(PrivIncReg1Params(dim=2, epsilon=1.0, delta=1e-6, horizon=4), rng=test_seed)
>>> gram, xy, clipped = mech.encode([3.0, 4.0], 2.0)      # clipped to ‖x‖ = 1, y = 1
>>> gram.round(6).tolist(), xy.round(6).tolist(), clipped
([0.36, 0.678823, 0.64], [0.6, 0.8], True)
>>> release = mech.step_points(np.zeros((0, 2)), [])        # a step without records
>>> release.t, release.n, bool(np.linalg.norm(release.theta) <= 1.0)   # noise only, still in C
(1, 0, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
from numpy.typing import ArrayLike

from ..checks import check_int
from .moments import clip_point, encode_point, svec_dim

__all__ = ["RegressionRelease", "StepMixin"]


@dataclass(frozen=True)
class RegressionRelease:
    """The model released at one step.

    ``theta`` ∈ C. ``covers`` is the range of steps ``(first, last)`` (1-based,
    inclusive) whose records the model is a function of: ``(1, t)`` for
    PrivIncReg1/2, ``(1, last batch call)`` for PrivIncERM (``(0, 0)``: none
    yet). ``noise_std_gram`` / ``noise_std_xy`` are the per-coordinate stds of
    the noisy sums behind the model (diagonal of Q; off-diagonal entries have
    ``1/√2`` of it), ``noise_std_model`` the per-coordinate std of PrivIncERM's
    output perturbation (0 for the others). ``alpha`` is the gradient-error
    bound α_t (regression.md R-2 to R-5), ``iterations`` the solver's work. All noise figures
    are public: functions of t, n and the parameters.
    """

    t: int
    n: int
    theta: np.ndarray
    method: str
    solver: str
    covers: Tuple[int, int]
    noise_std_gram: float = 0.0
    noise_std_xy: float = 0.0
    noise_std_model: float = 0.0
    alpha: float = 0.0
    iterations: int = 0


class StepMixin:
    """``push``/``step_points`` on raw points, on top of a mechanism's ``step(gram, xy, count)``.

    Subclasses set ``dim`` (the dimension of the encoded vectors z) and implement
    ``featurise(x) -> z`` (identity, or PrivIncReg2's clipped projection).
    """

    #: Dimension of the raw feature vectors x.
    features: int = 0

    def featurise(self, x: np.ndarray) -> np.ndarray:
        return x

    def encode(self, x: ArrayLike, y: float) -> Tuple[np.ndarray, np.ndarray, bool]:
        """``(svec(zzᵀ), z·y, clipped)`` of one raw point, as the transform's per-event stage computes it."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.features,):
            raise ValueError(f"x must have shape ({self.features},), got {x.shape}")
        x, y, clipped = clip_point(x, y)
        z = self.featurise(x)
        gram, xy = encode_point(z, y)
        return gram, xy, clipped

    def step_points(self, X: ArrayLike, y: ArrayLike) -> RegressionRelease:
        """Consume one step holding the points ``(X[i], y[i])`` (possibly none)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or (X.size and X.shape[1] != self.features):
            raise ValueError(f"X must have shape (n, {self.features}), got {X.shape}")
        X = X.reshape(-1, self.features)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if X.shape[0] != y.size:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.size} values")
        k = self.dim
        gram, xy = np.zeros(svec_dim(k)), np.zeros(k)
        for row, label in zip(X, y):
            g, b, _ = self.encode(row, label)
            gram += g
            xy += b
        return self.step(gram, xy, X.shape[0])

    def push(self, x: ArrayLike, y: float) -> RegressionRelease:
        """Consume one step holding the single point ``(x, y)`` (the paper's one record per step, R-1)."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.features,):
            raise ValueError(f"x must have shape ({self.features},), got {x.shape}")
        return self.step_points(x.reshape(1, -1), [y])

    def _check_step(self, gram, xy, count):
        gram = np.asarray(gram, dtype=np.float64).reshape(-1)
        xy = np.asarray(xy, dtype=np.float64).reshape(-1)
        if gram.shape != (svec_dim(self.dim),) or xy.shape != (self.dim,):
            raise ValueError(f"gram must have {svec_dim(self.dim)} and xy {self.dim} entries, "
                             f"got {gram.shape} and {xy.shape}")
        if not (np.all(np.isfinite(gram)) and np.all(np.isfinite(xy))):
            raise ValueError("gram and xy must be finite")
        count = check_int("count", count, minimum=0)
        return gram, xy, count
