"""The two running sums of private incremental regression, released by continual counters.

Seed 002 (arXiv:1701.01093, Section 4, eq. (2); regression.md R-2, R-5): the gradient
of the least-squares sum loss is ``∇J(θ; Γ_t) = 2(Σ x xᵀ θ − Σ x y)``, so two
running sums suffice; ``docs/privacy/regression.md`` R-5
releases them with TreeMech (the Gaussian binary tree). Here any of the
project's vector counters does it: BLT (the default, the most accurate counter
for Gaussian noise) or the tree (the paper's reference).

**The Gram stream is symmetric, so only its upper triangle is released**, as
``svec(xxᵀ)``: the d(d+1)/2 entries ``x_i²`` (diagonal) and ``√2·x_i x_j``
(i < j), so that ``‖svec(M)‖₂ = ‖M‖_F``. Sensitivity under *replacing one
event by another at the same step* (the relation of seed 002, Def. 4), with
``‖x‖, ‖x'‖ <= 1``:

    ‖svec(xxᵀ) − svec(x'x'ᵀ)‖² = ‖xxᵀ − x'x'ᵀ‖_F² = ‖x‖⁴ + ‖x'‖⁴ − 2⟨x, x'⟩² <= 2,

so ``Δ_Q = √2``, attained by two orthogonal unit vectors (regression.md R-2 to R-5: "√2 is
the tight bound for the matrix stream"; the paper's 2 is not needed). The plain
upper triangle (weight 1 off the diagonal) has the same sensitivity √2 (its
squared difference is ``(‖xxᵀ − x'x'ᵀ‖_F² + Σ_i (x_i² − x'_i²)²)/2 <= (2 + 2)/2``),
but puts noise σ on every entry; the √2 weighting leaves ``σ/√2`` on the
off-diagonal entries of the rebuilt matrix, exactly what symmetrising the
paper's full d² noisy matrix gives, at half the numbers. The ``x·y`` stream has
``Δ_q = 2`` (``‖xy − x'y'‖ <= ‖x‖|y| + ‖x'‖|y'|``, attained by ``x' = −x``).
Tests check both by brute force.

Exact sums: every coordinate of an encoded point is rounded to a multiple of
``2^POINT_GRID_EXPONENT`` (:func:`encode_point`), so per-step sums are exact
in any order (a retried bundle sums to the same bits) while below 2^23 in
magnitude. The rounding moves an encoded vector of D coordinates by at most
``√D·2^-31``, so both sensitivities carry a pad of ``√D·2^-30``.

Budget split (regression.md R-2 to R-5: each tree ``(ε/2, δ/2)`` by basic composition): the
default ``split="zcdp"`` gives each counter half of the zCDP budget
``ρ = ρ(ε, δ)`` (or, with ``calibration="analytic"``, half of μ² for the
μ-GDP Gaussian mechanism that is exactly (ε, δ)-DP), by calibrating each at
(ε, δ) for ``√2`` times its sensitivity. Gaussian mechanisms compose exactly in
ρ (and in μ²), so the pair is (ε, δ)-DP with noise ``√2·Δ_i/√(2ρ)`` per
counter, against ``Δ_i/√(2ρ(ε/2, δ/2))`` for the paper's split (about 1.4 times
more noise at ε = 1, δ = 10⁻⁶). ``split="basic"`` is the paper's.

Example (a test seed; production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.regression.moments import NoisyMoments, encode_point, smat
>>> g, b = encode_point(np.array([0.6, 0.8]), 0.5)
>>> smat(g, 2).round(6).tolist(), b.round(6).tolist()    # on the 2^-30 grid
([[0.36, 0.48], [0.48, 0.64]], [0.3, 0.4])
>>> test_seed = 0
>>> m = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=8, rng=test_seed)
>>> Q, q = m.step(g, b)
>>> std_gram, std_xy = m.noise_std(1)
>>> Q.shape, q.shape, round(std_xy / std_gram, 6)        # the sensitivities 2 and √2
((2, 2), (2,), 1.414214)
>>> m.privacy_cost()["epsilon"], m.privacy_cost()["delta"]
(1.0, 1e-06)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..calibration import CALIBRATIONS, gaussian_sigma, rho_from_eps_delta
from ..checks import check_int
from ..noise import RngLike, make_noise
from ..counting.registry import get_mechanism
from ..state import StateRecord

__all__ = [
    "COUNTERS",
    "MomentsState",
    "SPLITS",
    "POINT_GRID_EXPONENT",
    "svec_dim",
    "svec",
    "smat",
    "upper_triangle",
    "clip_point",
    "encode_point",
    "encode_points",
    "gram_sensitivity",
    "xy_sensitivity",
    "NoisyMoments",
    "treemech_sigma",
]

#: Counters offered for the running sums: BLT (default) and the tree (002's TreeMech).
COUNTERS = ("blt", "tree")
#: How (ε, δ) is shared by the two counters (see the module docstring).
SPLITS = ("zcdp", "basic")
#: Encoded points are rounded to multiples of 2^this (exact per-step sums).
POINT_GRID_EXPONENT = -30
#: Replace-one sensitivity of svec(xxᵀ) for ‖x‖ <= 1 (tight).
GRAM_REPLACE = math.sqrt(2.0)
#: Replace-one sensitivity of x·y for ‖x‖ <= 1, |y| <= 1 (tight).
XY_REPLACE = 2.0


def svec_dim(d: int) -> int:
    """Number of upper-triangle entries of a d×d matrix: d(d+1)/2."""
    return d * (d + 1) // 2


@functools.lru_cache(maxsize=64)
def _triu(d: int):
    rows, cols = np.triu_indices(d)
    weights = np.where(rows == cols, 1.0, math.sqrt(2.0))
    return rows, cols, weights


def svec(matrix: ArrayLike) -> np.ndarray:
    """Upper triangle of a symmetric matrix, off-diagonal entries times √2 (row-major).

    ``‖svec(M)‖₂ = ‖M‖_F`` for symmetric M.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    rows, cols, weights = _triu(matrix.shape[0])
    return matrix[rows, cols] * weights


def smat(vector: ArrayLike, d: int) -> np.ndarray:
    """The symmetric d×d matrix of :func:`svec` output (inverse of :func:`svec`)."""
    rows, cols, weights = _triu(d)
    vector = np.asarray(vector, dtype=np.float64)
    if vector.shape != (rows.size,):
        raise ValueError(f"vector must have {rows.size} entries for d={d}, got shape {vector.shape}")
    out = np.zeros((d, d))
    values = vector / weights
    out[rows, cols] = values
    out[cols, rows] = values
    return out


def upper_triangle(matrix: ArrayLike) -> np.ndarray:
    """The plain upper triangle (weight 1 everywhere), for the sensitivity comparison only."""
    matrix = np.asarray(matrix, dtype=np.float64)
    rows, cols, _ = _triu(matrix.shape[0])
    return matrix[rows, cols].copy()


def clip_point(x: ArrayLike, y: float) -> Tuple[np.ndarray, float, bool]:
    """``(x, y, clipped)``: x scaled down to ``‖x‖₂ <= 1`` and y clamped to [−1, 1].

    The bounds are public constants (regression.md R-1: ‖x‖ <= 1, |y| <= 1), never read
    from the data; ``clipped`` tells whether either moved. x and y must be finite.
    """
    x = np.asarray(x, dtype=np.float64)
    y = float(y)
    if x.ndim != 1 or not np.isfinite(x).all() or not math.isfinite(y):
        raise ValueError("x must be a finite vector and y a finite number")
    clipped = False
    norm = math.hypot(*x.tolist()) if x.size else 0.0
    if norm > 1.0:
        x = x / norm
        clipped = True
    if abs(y) > 1.0:
        y = math.copysign(1.0, y)
        clipped = True
    return x, y, clipped


def _round(values: np.ndarray) -> np.ndarray:
    return np.ldexp(np.round(np.ldexp(values, -POINT_GRID_EXPONENT)), POINT_GRID_EXPONENT)


def encode_point(z: ArrayLike, y: float) -> Tuple[np.ndarray, np.ndarray]:
    """``(svec(zzᵀ), z·y)`` of one clipped point, each coordinate on the 2^-30 grid.

    z is the (clipped) feature vector, or its clipped projection u in PrivIncReg2.
    """
    z = np.asarray(z, dtype=np.float64)
    rows, cols, weights = _triu(z.size)
    return _round(z[rows] * z[cols] * weights), _round(z * float(y))


def encode_points(Z: ArrayLike, y: ArrayLike) -> Tuple[np.ndarray, np.ndarray]:
    """``(Σ svec(z zᵀ), Σ z·y)`` over the rows z of Z: the sums of :func:`encode_point`, in one pass.

    The same bits as adding the points' encodings one by one in any order:
    every encoding is on the 2^-30 grid, so every partial sum is exact.

    >>> import numpy as np
    >>> Z, y = np.array([[0.6, 0.8], [0.1, -0.3]]), np.array([0.5, -1.0])
    >>> one = [encode_point(z, v) for z, v in zip(Z, y)]
    >>> gram, xy = encode_points(Z, y)
    >>> bool(np.array_equal(gram, one[0][0] + one[1][0]) and np.array_equal(xy, one[0][1] + one[1][1]))
    True
    """
    Z = np.asarray(Z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    rows, cols, weights = _triu(Z.shape[1])
    return (_round(Z[:, rows] * Z[:, cols] * weights).sum(axis=0),
            _round(Z * y[:, None]).sum(axis=0))


def gram_sensitivity(d: int) -> float:
    """Replace-one L2 sensitivity of one step's Σ svec(zzᵀ): √2 plus the rounding pad."""
    return GRAM_REPLACE + math.sqrt(svec_dim(d)) * 2.0 ** (POINT_GRID_EXPONENT)


def xy_sensitivity(d: int) -> float:
    """Replace-one L2 sensitivity of one step's Σ z·y: 2 plus the rounding pad."""
    return XY_REPLACE + math.sqrt(d) * 2.0 ** (POINT_GRID_EXPONENT)


def treemech_sigma(sensitivity: float, horizon: int, epsilon: float, delta: float) -> float:
    """The paper's TreeMech σ (R-5, as we reconstructed it): ``Δ·√h·√(2 ln(1.25/δ))/ε`` with ``h = ⌊log2 T⌋ + 1``.

    The classic Gaussian mechanism on the joint node vector (sensitivity Δ√h).
    The counters here calibrate the same joint sensitivity by zCDP (about 0.1 %
    above this at ε = 0.5, δ = 5·10⁻⁷) or the analytic Gaussian (below it);
    kept to check the paper's numbers (R-5).

    >>> round(treemech_sigma(2.0, 1024, 0.5, 5e-7), 4)
    72.0111
    """
    levels = int(math.floor(math.log2(horizon))) + 1
    return sensitivity * math.sqrt(levels) * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


@dataclasses.dataclass(frozen=True)
class MomentsState(StateRecord):
    """The state of a :class:`NoisyMoments`: the states of its two counters."""

    gram: Dict[str, Any]
    xy: Dict[str, Any]


class NoisyMoments:
    """Noisy running ``Q_t = Σ_{s<=t} svec(z zᵀ)`` and ``q_t = Σ_{s<=t} z·y`` (Gaussian noise).

    ``step(gram, xy)`` consumes one step's sums (``gram`` in svec form) and
    returns ``(Q_t, q_t)`` with Q_t the symmetric d×d matrix. Each counter
    draws one noise vector per step from the shared source; the noise of a
    released value is never redrawn (the counters keep it). The pair is
    (ε, δ)-DP for the whole output sequence under replacing one event at the
    same step (module docstring); :meth:`privacy_cost` states it.
    """

    def __init__(self, dim: int, epsilon: float, delta: float, horizon: Optional[int] = None,
                 counter: str = "blt", calibration: str = "zcdp", split: str = "zcdp",
                 rng: RngLike = None) -> None:
        self.dim = check_int("dim", dim)
        if counter not in COUNTERS:
            raise ValueError(f"counter must be one of {COUNTERS}, got {counter!r}")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.counter, self.calibration, self.split = counter, calibration, split
        self.epsilon, self.delta, self.horizon = epsilon, delta, horizon
        self.source = make_noise(rng)
        cls = get_mechanism(counter)
        args = self._counter_args()
        self._gram = cls(dim=svec_dim(self.dim), sensitivity=args["gram"], rng=self.source, **args["common"])
        self._xy = cls(dim=self.dim, sensitivity=args["xy"], rng=self.source, **args["common"])

    def _counter_horizon(self):
        """The BLT counter runs over the smallest tabulated horizon >= T (its shipped
        parameters): a counter calibrated for more steps is valid for fewer, with a
        little more noise, and no BLT optimisation (about a second per horizon) runs
        at pipeline time."""
        if self.counter != "blt" or self.horizon is None:
            return self.horizon
        from ..counting.blt_table import BLT_TABLE

        larger = [h for h in BLT_TABLE if h >= self.horizon]
        return min(larger) if larger else self.horizon

    def _counter_args(self):
        if self.split == "zcdp":
            eps, delta, factor = self.epsilon, self.delta, math.sqrt(2.0)
        else:
            eps, delta, factor = self.epsilon / 2.0, self.delta / 2.0, 1.0
        common = dict(epsilon=eps, delta=delta, horizon=self._counter_horizon(), noise="gaussian",
                      calibration=self.calibration)
        return {"common": common, "gram": factor * gram_sensitivity(self.dim),
                "xy": factor * xy_sensitivity(self.dim)}

    @property
    def t(self) -> int:
        return self._gram.t

    def step(self, gram: ArrayLike, xy: ArrayLike) -> Tuple[np.ndarray, np.ndarray]:
        """Add one step's sums; return the noisy ``(Q_t, q_t)`` through it."""
        Q = self._gram.step(np.asarray(gram, dtype=np.float64))
        q = self._xy.step(np.asarray(xy, dtype=np.float64))
        return smat(np.atleast_1d(Q), self.dim), np.atleast_1d(np.asarray(q, dtype=np.float64))

    def current(self) -> Tuple[np.ndarray, np.ndarray]:
        """The current noisy ``(Q_t, q_t)`` (no draw)."""
        return (smat(np.atleast_1d(self._gram.current()), self.dim),
                np.atleast_1d(np.asarray(self._xy.current(), dtype=np.float64)))

    def noise_std(self, t: int) -> Tuple[float, float]:
        """``(std of each svec coordinate of Q_t, std of each coordinate of q_t)`` at step t.

        Diagonal entries of Q_t have the first std, off-diagonal ones that
        std over √2. Public: a function of t and the parameters.
        """
        return float(self._gram.noise_std(t)), float(self._xy.noise_std(t))

    def privacy_cost(self) -> Cost:
        """The cost of the pair for the whole output sequence: ρ-zCDP, stated at the (ε, δ) the
        counters were calibrated to."""
        if self.split == "basic":
            rho = self._gram.rho + self._xy.rho
        elif self.calibration == "zcdp":
            rho = rho_from_eps_delta(self.epsilon, self.delta)
        else:
            # Each counter is a Gaussian mechanism with μ/√2 for its real sensitivity;
            # together μ, i.e. exactly (ε, δ)-DP, and μ²/2-zCDP.
            unit = gaussian_sigma(1.0, self.epsilon, self.delta, "analytic")
            rho = 1.0 / (2.0 * unit * unit)
        return Cost.gaussian(float(rho), float(self.delta), epsilon=float(self.epsilon))

    def state_size(self) -> int:
        """Floats held: the two counters' states (BLT: at most 11·D each, 12·D unbounded; tree: h·D)."""
        return int(self._gram.state_size() + self._xy.state_size())

    def to_state(self) -> dict:
        """The counters' states (:class:`MomentsState`)."""
        return MomentsState(gram=self._gram.to_state(), xy=self._xy.to_state()).to_state()

    def set_noise_source(self, rng: RngLike) -> None:
        """Draw all later noise from ``rng``: ``load_state(to_state(), rng)`` without the round trip."""
        self.source = make_noise(rng)
        self._gram.set_noise_source(self.source)
        self._xy.set_noise_source(self.source)

    def load_state(self, state: Dict[str, Any], rng: RngLike = None) -> None:
        """Restore the counters from :meth:`to_state` output, drawing from ``rng`` next."""
        self.source = make_noise(rng)
        cls = get_mechanism(self.counter)
        record = MomentsState.from_state(state)
        try:
            self._gram = cls.from_state(record.gram, rng=self.source)
            self._xy = cls.from_state(record.xy, rng=self.source)
        except (KeyError, TypeError) as err:
            raise ValueError(f"moments state is invalid: {err!r}") from None
        if self._gram.dim != svec_dim(self.dim) or self._xy.dim != self.dim:
            raise ValueError("moments state does not match dim")
