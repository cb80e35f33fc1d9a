"""PrivIncReg1 (private gradient from two noisy sums) and PrivIncReg2 (random projection and lift).

Seed 002, Kasiviswanathan, Nissim, Jin, *Private Incremental Regression*
(arXiv:1701.01093), Sections 4 and 5; the privacy arguments are claims R-2 to
R-7 and R-9 of ``docs/privacy/regression.md`` (state per stream: ``docs/design.md``
D1.3).

PrivIncReg1 (regression.md R-2 to R-5): the noisy running sums ``Q_t ≈ Σ x xᵀ`` and
``q_t ≈ Σ x y`` (:class:`~dp_beam.mechanisms.regression.moments.NoisyMoments`)
give the private gradient function ``g_t(θ) = 2(Q_t θ − q_t)`` (002 Def. 5);
any θ computed from it is post-processing. Two solvers:

* ``solver="exact"`` (default): the minimiser over C of
  ``θᵀQ₊θ − 2qᵀθ``, Q₊ the PSD projection of the (symmetric) noisy Q_t
  (:func:`~dp_beam.mechanisms.regression.solvers.solve_quadratic`).
* ``solver="noisy_proj_grad"``: the paper's NoisyProjGrad with the
  r_t and η_t we derived from its Cor. B.2 from θ_1 = Π_C(0), r capped at ``max_iterations``.

Why exact is the default, measured (``benchmarks/incremental_regression.py``,
flights 2013, one step per hour, d = 11, C an L2 ball of radius 4, δ = 10⁻⁶,
median of 4 seeds): from three months of data on (six at ε = 0.5), the exact solver's
relative excess empirical risk is far below NoisyProjGrad's (end of year:
0.030 against 1.15 at ε = 1, 0.17 against 1.38 at ε = 0.5, 0.014 against
1.15 at ε = 2; held-out MSE 1.03× the non-private model's against 2.17×),
and a solve takes 0.34 ms against about 0.5 s for NoisyProjGrad, whose r_t grows
like n² (2,300 iterations after a month, 69,000 after six) and hits its cap
of 10⁵ after about seven months (it stalls near 1.15 well before). In the first weeks, while the noise dominates the sums,
NoisyProjGrad's averaged iterate from 0 is the better one (day 7 at ε = 1:
4.6 against 54): it shrinks toward 0 where the exact minimiser follows the
noise to the boundary of C. A stream that runs for long is worth the exact
solver, which is why it is the default. Its guarantee is also the stronger
one: with N_Q, N_q the noises and ``α_t = 2(‖N_Q‖‖C‖ + ‖N_q‖)`` (regression.md R-2 to R-5),
the PSD projection moves the noisy Gram by at most ‖N_Q‖ in operator norm (its
negative eigenvalues are >= −‖N_Q‖ because the true Gram is PSD), so the minimised quadratic is within α_t‖C‖ of
``f = J − Σy²`` on all of C, and its minimiser θ̃ has
``J(θ̃) − J(θ̂) <= 2α_t‖C‖``, against ``4α_t‖C‖`` for NoisyProjGrad
(Cor. B.2, which is what 002 states).

PrivIncReg2 (regression.md R-7): a Gaussian Φ ∈ R^{m×d} drawn from the noise source
before any data (public; it may be logged), ``u = clip(Φx/√m, 1)``, the same
two sums in R^m, the projected objective minimised over θ ∈ C directly
(``v = Φθ/√m`` ranges over K = ΦC/√m), and the lift
``θ = argmin ‖θ‖_C s.t. Φθ = √m·v`` (minimum norm for an L2 ball, basis
pursuit for an L1 ball). m follows our rule
(:func:`projection_dim`, R-7) unless given. It pays off only when the data and C
have a small Gaussian width W (W² ≪ m); otherwise the projection's
distortion, of order ``t‖C‖²W²/m`` on the sum loss (R-7), dominates: on the
flights of the benchmark (d = 11, unit-ball features, the rule gives m = d)
its excess is about a hundred times the non-private risk, where PrivIncReg1's
is 3 %.

Privacy (both): the pair of sums is (ε, δ)-DP for the whole (unbounded)
output sequence under replacing one record by another at the same step
(002 Def. 4); everything released is post-processing. Per step the noise is
one Gaussian vector per counter (``noise_std(t)``).

Example (a test seed; production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import L2Ball, PrivIncReg1, PrivIncReg1Params
>>> test_seed = 0
>>> params = PrivIncReg1Params(dim=2, epsilon=1.0, delta=1e-6, constraint=L2Ball(1.0), horizon=64)
>>> mech = PrivIncReg1(params, rng=test_seed)
>>> data = np.random.default_rng(1)
>>> for t in range(64):
...     X = data.uniform(-0.7, 0.7, size=(400, 2))
...     release = mech.step_points(X, X @ np.array([0.5, -0.3]))
>>> release.t, release.n, release.covers, params.constraint.contains(release.theta)
(64, 25600, (1, 64), True)
>>> bool(np.linalg.norm(release.theta - np.array([0.5, -0.3])) < 0.05)
True
>>> mech.privacy_cost()["epsilon"], mech.privacy_cost()["delta"]
(1.0, 1e-06)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..checks import check_delta, check_epsilon, check_int, check_probability, check_real
from ..noise import RngLike, ZeroNoise, make_noise
from ..state import StateRecord
from .base import RegressionRelease, StepMixin
from .constraints import Constraint, ConstrainedParams, L2Ball, check_constraint
from .moments import COUNTERS, SPLITS, NoisyMoments
from .solvers import (gradient_error_bound, lift, noisy_proj_grad, npg_schedule, psd_part,
                      solve_quadratic)

__all__ = ["SOLVERS", "IncrementalState", "PrivIncReg1Params", "PrivIncReg1", "PrivIncReg2Params",
           "PrivIncReg2", "PrivIncReg2State",
           "projection_dim", "project_features"]

#: Solvers of the noisy quadratic (post-processing): the exact QP (default) or 002's NoisyProjGrad.
SOLVERS = ("exact", "noisy_proj_grad")


@dataclass(frozen=True)
class PrivIncReg1Params(ConstrainedParams):
    """Public parameters of :class:`PrivIncReg1` (validated at construction; ``ValueError`` names one).

    ``dim`` d; ``epsilon``, ``delta`` of the whole output sequence; ``constraint`` C;
    ``horizon`` the number of steps (``None``: unbounded, the counters' epoch
    construction); ``counter`` ``"blt"`` (default) or ``"tree"``; ``solver``
    (:data:`SOLVERS`); ``calibration`` ``"zcdp"`` or ``"analytic"``; ``split``
    ``"zcdp"`` or ``"basic"`` (see :mod:`~dp_beam.mechanisms.regression.moments`);
    ``beta`` the failure probability behind α_t; ``max_iterations`` the cap on
    NoisyProjGrad's r_t.
    """

    dim: int
    epsilon: float
    delta: float
    constraint: Constraint = field(default_factory=L2Ball)
    horizon: Optional[int] = None
    counter: str = "blt"
    solver: str = "exact"
    calibration: str = "zcdp"
    split: str = "zcdp"
    beta: float = 0.05
    max_iterations: int = 100_000

    def __post_init__(self):
        object.__setattr__(self, "dim", check_int("dim", self.dim))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta))
        check_constraint(self.constraint)
        object.__setattr__(self, "horizon", check_int("horizon", self.horizon, optional=True))
        if self.counter not in COUNTERS:
            raise ValueError(f"counter must be one of {COUNTERS}, got {self.counter!r}")
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.calibration not in ("zcdp", "analytic"):
            raise ValueError(f"calibration must be 'zcdp' or 'analytic', got {self.calibration!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        object.__setattr__(self, "beta", check_probability("beta", self.beta))
        object.__setattr__(self, "max_iterations", check_int("max_iterations", self.max_iterations))


@dataclass(frozen=True)
class IncrementalState(StateRecord):
    """The state of a :class:`PrivIncReg1`: name, version, parameters (their dict), the number
    of records and the state of its :class:`~.moments.NoisyMoments`."""

    mechanism: str
    version: int
    params: Dict[str, Any]
    n: int
    moments: Dict[str, Any]


@dataclass(frozen=True)
class PrivIncReg2State(IncrementalState):
    """The state of a :class:`PrivIncReg2`: that of PrivIncReg1, then the public projection Φ
    (written as lists; the constructor checks it)."""

    projection: Any


class _Incremental(StepMixin):
    """The shared loop: noisy moments per step, then a solve (PrivIncReg1 and 2)."""

    name = ""
    STATE_VERSION = 1
    params_cls = PrivIncReg1Params

    def _init_moments(self, dim, source):
        p = self.params
        self._moments = NoisyMoments(dim=dim, epsilon=p.epsilon, delta=p.delta, horizon=p.horizon,
                                     counter=p.counter, calibration=p.calibration, split=p.split,
                                     rng=source)
        self._n = 0
        self._Q = self._q = None

    @property
    def t(self) -> int:
        return self._moments.t

    @property
    def n(self) -> int:
        return self._n

    @property
    def source(self):
        return self._moments.source

    def set_noise_source(self, rng) -> None:
        """Draw all later noise from ``rng`` (the state is unchanged: the same as
        ``from_state(to_state(), rng)``, without the round trip)."""
        self._moments.set_noise_source(make_noise(rng))

    def update(self, gram, xy, count) -> None:
        """Consume one step's sums without solving (draws the step's noise)."""
        gram, xy, count = self._check_step(gram, xy, count)
        if self.params.horizon is not None and self.t >= self.params.horizon:
            raise ValueError(f"horizon exceeded: horizon is {self.params.horizon}, step {self.t + 1} requested")
        self._n += count
        self._Q, self._q = self._moments.step(gram, xy)

    def step(self, gram, xy, count) -> RegressionRelease:
        """Consume one step (sums of encoded points and their count); release its model."""
        self.update(gram, xy, count)
        return self.model()

    def model(self) -> RegressionRelease:
        """The model of the current step (post-processing; no draw). Needs one step first."""
        if self.t == 0:
            raise ValueError("no step consumed yet")
        if self._Q is None:
            self._Q, self._q = self._moments.current()
        std_gram, std_xy = self._moments.noise_std(self.t)
        theta, alpha, work = self._solve(self._Q, self._q, std_gram, std_xy)
        return RegressionRelease(t=self.t, n=self._n, theta=theta, method=self.name,
                                 solver=self.params.solver, covers=(1, self.t),
                                 noise_std_gram=std_gram, noise_std_xy=std_xy, alpha=alpha,
                                 iterations=int(work))

    def noise_std(self, t: int) -> dict:
        """``{"gram", "xy"}``: per-coordinate noise stds of the sums at step t (public)."""
        gram, xy = self._moments.noise_std(t)
        return {"gram": gram, "xy": xy}

    def privacy_cost(self) -> Cost:
        """The cost of the whole output sequence (replace one record)."""
        return self._moments.privacy_cost()

    def statistics(self):
        """The current noisy ``(Q_t, q_t)`` (released information: θ is a function of it)."""
        return self._moments.current()

    def state_size(self) -> int:
        """Floats in the state: the counters' (independent of t for BLT; h·D for the tree)."""
        return self._moments.state_size()

    STATE_RECORD = IncrementalState

    def _state_extra(self) -> dict:
        return {}

    def to_state(self) -> dict:
        """Plain dict (:attr:`STATE_RECORD`): parameters, n and the counters' states (no raw
        record is kept)."""
        return self.STATE_RECORD(mechanism=self.name, version=self.STATE_VERSION,
                                 params=self.params.to_dict(), n=self._n,
                                 moments=self._moments.to_state(), **self._state_extra()).to_state()

    @classmethod
    def _check_state(cls, state):
        """``(params, record)`` of a state of this class; ``ValueError`` if it is not one."""
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        record = cls.STATE_RECORD.from_state(state)
        try:
            return cls.params_cls.from_dict(record.params), record
        except (KeyError, TypeError) as err:
            raise ValueError(f"state params are invalid: {err!r}") from None

    def _restore(self, record):
        self._moments.load_state(record.moments, rng=self._moments.source)
        self._n = check_int("state n", record.n, minimum=0)


class PrivIncReg1(_Incremental):
    """PrivIncReg1 of seed 002 (regression.md R-2 to R-5): one model in C per step from two noisy running sums.

    ``step(gram, xy, count)`` takes one step's sums of
    :func:`~dp_beam.mechanisms.regression.moments.encode_point` (svec form) and
    the number of records; ``step_points(X, y)`` and ``push(x, y)`` take raw
    points (clipped to ‖x‖ <= 1, |y| <= 1). State: the two counters (BLT:
    ``(2b + 1)(d(d+1)/2 + d)`` numbers, b <= 5 buffers (one more row unbounded), whatever t; tree:
    ``h·(d(d+1)/2 + d)``), n and the parameters; no raw record.
    """

    name = "privincreg1"
    params_cls = PrivIncReg1Params

    def __init__(self, params: PrivIncReg1Params, rng: RngLike = None) -> None:
        if not isinstance(params, PrivIncReg1Params):
            raise ValueError(f"params must be PrivIncReg1Params, got {type(params).__name__}")
        self.params = params
        self.dim = self.features = params.dim
        self._init_moments(params.dim, make_noise(rng))

    def _solve(self, Q, q, std_gram, std_xy):
        p = self.params
        C = p.constraint
        alpha = gradient_error_bound(std_gram, std_xy, p.dim, C.max_norm, self.t, p.horizon, p.beta)
        if p.solver == "exact":
            theta, work = solve_quadratic(Q, q, C)
            return theta, alpha, work
        r, eta = npg_schedule(self._n, C.max_norm, alpha, p.max_iterations)
        theta = noisy_proj_grad(C, lambda th: 2.0 * (Q @ th - q), r, eta, np.zeros(p.dim))
        return theta, alpha, r

    @classmethod
    def from_state(cls, state: Dict[str, Any], rng: RngLike = None) -> "PrivIncReg1":
        """Rebuild from :meth:`to_state` output; the next draws come from ``rng``."""
        params, record = cls._check_state(state)
        mech = cls(params, rng=rng)
        mech._restore(record)
        return mech


def _unit_ball_width(d: int) -> float:
    return L2Ball(1.0).gaussian_width(d)


def projection_dim(d: int, constraint: Constraint, records: int, noise_std: float,
                   feature_width: Optional[float] = None) -> int:
    """The m for PrivIncReg2 (R-7; our derivation from the paper's bound): privacy against distortion.

    ``m = ⌈(T·W²·‖C‖²/A)^{2/3}⌉`` capped to [1, d], with T the number of
    records, ``W = w(X) + w(C)`` (Gaussian widths; ``feature_width`` is w(X),
    by default the unit ball's ≈ √d) and ``A = 4‖C‖·2σ√(ln T)·(‖C‖ + 1)``
    (σ the per-coordinate noise std of the sums). Public: no data enters.

    >>> from dp_beam.mechanisms.regression import L1Ball
    >>> projection_dim(1000, L1Ball(1.0), records=10_000, noise_std=50.0, feature_width=3.0)
    31
    """
    d = check_int("d", d)
    records = max(2, check_int("records", records))
    radius = constraint.max_norm
    wx = _unit_ball_width(d) if feature_width is None else check_real("feature_width", feature_width,
                                                                      positive=True)
    width = wx + constraint.gaussian_width(d)
    a = 4.0 * radius * 2.0 * noise_std * math.sqrt(math.log(records)) * (radius + 1.0)
    m = math.ceil((records * width ** 2 * radius ** 2 / a) ** (2.0 / 3.0))
    return int(min(max(m, 1), d))


def project_features(phi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``u = clip(Φx/√m, 1)``: clipped so the sensitivities hold for every input (regression.md R-7)."""
    m = phi.shape[0]
    u = phi @ x / math.sqrt(m)
    norm = float(np.linalg.norm(u))
    return u / norm if norm > 1.0 else u


@dataclass(frozen=True)
class PrivIncReg2Params(PrivIncReg1Params):
    """:class:`PrivIncReg1Params` plus the projection: ``projection_dim`` m (``None``: our
    rule, :func:`projection_dim`, with ``expected_records`` records (default: one per
    step of the horizon, or 2^20) and the public ``feature_width`` w(X))."""

    projection_dim: Optional[int] = None
    feature_width: Optional[float] = None
    expected_records: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "projection_dim",
                           check_int("projection_dim", self.projection_dim, optional=True))
        if self.feature_width is not None:
            object.__setattr__(self, "feature_width",
                               check_real("feature_width", self.feature_width, positive=True))
        object.__setattr__(self, "expected_records",
                           check_int("expected_records", self.expected_records, optional=True))

    def resolved_projection_dim(self) -> int:
        if self.projection_dim is not None:
            return self.projection_dim
        records = self.expected_records or self.horizon or 2 ** 20
        probe = NoisyMoments(dim=1, epsilon=self.epsilon, delta=self.delta, horizon=self.horizon,
                             counter=self.counter, calibration=self.calibration, split=self.split,
                             rng=ZeroNoise())
        sigma = probe.noise_std(self.horizon or records)[0]
        return projection_dim(self.dim, self.constraint, records, sigma, self.feature_width)


class PrivIncReg2(_Incremental):
    """PrivIncReg2 of seed 002 (regression.md R-7): noisy sums of ``u = clip(Φx/√m)`` in R^m, lifted into C.

    Φ (m×d, i.i.d. N(0, 1)) is drawn from the noise source at construction,
    before any data (or passed as ``projection``: it is public and need not be
    secret, regression.md R-7). State: Φ (m·d numbers) and the two counters in R^m.
    """

    name = "privincreg2"
    params_cls = PrivIncReg2Params

    def __init__(self, params: PrivIncReg2Params, rng: RngLike = None,
                 projection: Optional[ArrayLike] = None) -> None:
        if not isinstance(params, PrivIncReg2Params):
            raise ValueError(f"params must be PrivIncReg2Params, got {type(params).__name__}")
        self.params = params
        source = make_noise(rng)
        if projection is None:
            m = params.resolved_projection_dim()
            phi = np.asarray(source.gaussian(1.0, m * params.dim), dtype=np.float64).reshape(m, params.dim)
            if not np.any(phi):
                raise ValueError("projection: the noise source is switched off (it drew a zero "
                                 "matrix); pass projection= (a public m×d Gaussian matrix)")
        else:
            phi = np.asarray(projection, dtype=np.float64)
            if phi.ndim != 2 or phi.shape[1] != params.dim or not np.all(np.isfinite(phi)):
                raise ValueError(f"projection must be a finite m×{params.dim} matrix, got shape {phi.shape}")
            if params.projection_dim is not None and phi.shape[0] != params.projection_dim:
                raise ValueError(f"projection has {phi.shape[0]} rows, projection_dim is {params.projection_dim}")
        self._phi = phi
        self.m = phi.shape[0]
        self.dim, self.features = self.m, params.dim
        self._phi_norm = float(np.linalg.norm(phi, 2))
        self._init_moments(self.m, source)

    @property
    def projection(self) -> np.ndarray:
        """Φ (public)."""
        return self._phi.copy()

    def featurise(self, x: ArrayLike) -> np.ndarray:
        return project_features(self._phi, x)

    def _solve(self, Q, q, std_gram, std_xy):
        p = self.params
        C = p.constraint
        phi, m = self._phi, self.m
        scale = self._phi_norm / math.sqrt(m)
        alpha = gradient_error_bound(std_gram, std_xy, m, C.max_norm, self.t, p.horizon, p.beta,
                                     gram_scale=scale * scale, xy_scale=scale)
        b = phi.T @ q / math.sqrt(m)
        if p.solver == "exact":
            A = phi.T @ psd_part(Q) @ phi / m
            theta_c, work = solve_quadratic(A, b, C, psd=False)
        else:
            A = phi.T @ (0.5 * (Q + Q.T)) @ phi / m
            lip = 2.0 * self._n * (scale * C.max_norm + 1.0) * scale
            work, eta = npg_schedule(self._n, C.max_norm, alpha, p.max_iterations, lipschitz=lip)
            theta_c = noisy_proj_grad(C, lambda th: 2.0 * (A @ th - b), work, eta, np.zeros(p.dim))
        # v = Φθ/√m ∈ K; the lift is the least-Minkowski-norm preimage of √m·v = Φθ.
        theta = lift(phi, phi @ theta_c, C)
        return theta, alpha, work

    STATE_RECORD = PrivIncReg2State

    def _state_extra(self):
        return {"projection": self._phi}

    @classmethod
    def from_state(cls, state: Dict[str, Any], rng: RngLike = None) -> "PrivIncReg2":
        """Rebuild from :meth:`to_state` output; the next draws come from ``rng``."""
        params, record = cls._check_state(state)
        mech = cls(params, rng=rng, projection=record.projection)
        mech._restore(record)
        return mech
