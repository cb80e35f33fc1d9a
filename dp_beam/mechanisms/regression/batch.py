"""PrivIncERM: the generic batch-to-incremental transformation of seed 002 (regression.md R-8).

Seed 002 (arXiv:1701.01093), Mechanism PrivIncERM; ``docs/privacy/regression.md``
R-8 (the per-run budget is our reconstruction of the paper's formula).
Every τ steps an (ε′, δ′)-DP batch ERM runs on the whole prefix; in between
the last output is repeated. A record is used by at most ``k = ⌈T/τ⌉`` runs,
so advanced composition (Dwork–Rothblum–Vadhan, 002 Thm A.4) with slack δ/2
and

    ε′ = ε / (2·√(2k·ln(2/δ))),   δ′ = δ / (2k)

makes the whole sequence ``(ε′√(2k ln(2/δ)) + 2kε′², kδ′ + δ/2)``-DP, at most
``(ε/2 + ε²/(4 ln(2/δ)), δ) <= (ε, δ)``. τ defaults to
``⌈(d·T)^{1/3}·ε^{−2/3}⌉`` (regression.md R-8; our choice, T the horizon in steps).

The black box is the project's output-perturbation ERM
(:class:`~dp_beam.mechanisms.erm.OutputPerturbation`, seed 004 Alg. 1) with the
squared loss: the ridge objective ``(1/n)Σ(y − ⟨x, θ⟩)² + λ‖θ‖²`` minimised in
closed form from the exact sufficient statistics, perturbed by L2-Laplace
(pure ε′, default) or Gaussian ((ε′, δ′)) noise calibrated to the paper-
conservative sensitivity ``2L/(λn)`` (see :class:`SquaredLoss` for L), then
projected onto C (post-processing). Only the running sums ``Σ xxᵀ``, ``Σ xy``
and n are kept, not the records: for least squares they are all the batch
solver needs (design D1.3's "whole history" is for a general black box).

Example (a test seed; production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import PrivIncERM, PrivIncERMParams
>>> params = PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=10_000, tau=100)
>>> k, eps_run, delta_run = params.runs, params.run_epsilon, params.run_delta
>>> k, round(eps_run, 7), delta_run
(100, 0.009282, 5e-09)
>>> test_seed = 0
>>> mech = PrivIncERM(params, rng=test_seed)
>>> [mech.push([0.5, 0.1], 0.3).covers for _ in range(100)][-2:]
[(0, 0), (1, 100)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Type

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..checks import check_delta, check_epsilon, check_int, check_real
from ..erm import NOISE_KINDS, OutputPerturbation
from ..noise import RngLike, make_noise
from ..noise_grid import round_to_grid
from ..state import StateRecord, float_array, state_field
from .base import RegressionRelease, StepMixin
from .constraints import Constraint, ConstrainedParams, L2Ball, check_constraint
from .moments import smat, svec_dim

__all__ = ["PrivIncERMParams", "PrivIncERM", "PrivIncERMState", "SquaredLoss", "RidgeOutputPerturbation",
           "per_run_budget", "advanced_composition", "default_tau", "default_lambda"]


def per_run_budget(epsilon: float, delta: float, k: int) -> Tuple[float, float]:
    """``(ε′, δ′) = (ε/(2√(2k ln(2/δ))), δ/(2k))`` (regression.md R-8; reconstructed)."""
    return epsilon / (2.0 * math.sqrt(2.0 * k * math.log(2.0 / delta))), delta / (2.0 * k)


def advanced_composition(eps_run: float, delta_run: float, k: int,
                         slack: float) -> Tuple[float, float]:
    """``(ε′√(2k ln(1/slack)) + 2kε′², kδ′ + slack)``: k-fold composition (002 Thm A.4)."""
    return (eps_run * math.sqrt(2.0 * k * math.log(1.0 / slack)) + 2.0 * k * eps_run ** 2,
            k * delta_run + slack)


def default_tau(d: int, horizon: int, epsilon: float) -> int:
    """``⌈(d·T)^{1/3}·ε^{−2/3}⌉`` capped to [1, T] (regression.md R-8; our choice)."""
    tau = math.ceil((d * horizon) ** (1.0 / 3.0) * epsilon ** (-2.0 / 3.0))
    return int(min(max(tau, 1), horizon))


def default_lambda(n: int, epsilon: float, dim: int, radius: float) -> float:
    """Ridge λ balancing bias ``nλR²`` against noise ``16(p+1)/(λ³nε′²)`` (sum scale; our choice).

    ``λ = (48(p + 1))^{1/4}/√(n·ε′·R)``, from L2-Laplace noise of scale
    ``2L/(λnε′)`` with ``L ≈ 2/√λ`` and ``‖x‖ <= 1``; n is public under replace-one.
    """
    return (48.0 * (dim + 1)) ** 0.25 / math.sqrt(max(n, 1) * epsilon * radius)


class SquaredLoss:
    """``ℓ(θ; x, y) = (y − ⟨x, θ⟩)²`` for ‖x‖ <= 1, |y| <= 1, with the ridge λ‖θ‖².

    The interface :class:`~dp_beam.mechanisms.erm.OutputPerturbation` reads
    (``n_params``, ``lipschitz``). The minimiser θ* of the ridge objective has
    ``‖θ*‖ <= min(1/√λ, 1/λ)`` (``λ‖θ*‖² <= F(θ*) <= F(0) <= 1``, and
    ``‖(Σ/n + λI)⁻¹ Xᵀy/n‖ <= 1/λ``), where ``‖∇ℓ‖ = 2|⟨x, θ⟩ − y|·‖x‖ <= 2(‖θ‖ + 1)``,
    so ``L = 2(1 + min(1/√λ, 1/λ))`` bounds the per-record gradients at both
    neighbours' minimisers, which is what the sensitivity argument uses.
    """

    fit_intercept = False

    def __init__(self, n_features: int, lam: float) -> None:
        self.n_features = self.n_params = check_int("n_features", n_features)
        lam = check_real("lam", lam, positive=True)
        self.lipschitz = 2.0 * (1.0 + min(1.0 / math.sqrt(lam), 1.0 / lam))
        self.smoothness = 2.0


class RidgeOutputPerturbation(OutputPerturbation):
    """The batch black box: ridge least squares by output perturbation (seed 004 Alg. 1).

    :meth:`fit` solves ``(Σxxᵀ/n + λI)θ = Σxy/n`` exactly (the objective is
    2λ-strongly convex, so no optimisation error enters the sensitivity) and
    adds the noise of ``call_noise(n, 1)``: the call is ε′-DP (``"l2_laplace"``)
    or (ε′, δ′)-DP (``"gaussian"``) under replacing one record.
    """

    def __init__(self, dim: int, lam: float, epsilon: float, noise: str = "l2_laplace",
                 delta: Optional[float] = None, rng: RngLike = None) -> None:
        super().__init__(SquaredLoss(dim, lam), lam, epsilon, noise=noise,
                         delta=delta if noise == "gaussian" else None, rng=rng)

    def fit(self, gram: ArrayLike, xy: ArrayLike, n: int) -> Tuple[np.ndarray, Dict[str, float]]:
        """``(noisy θ, noise description)`` from the exact sums (gram in svec form) of n records."""
        d = self.loss.n_params
        G = smat(gram, d) / n
        theta = np.linalg.solve(G + self.lam * np.eye(d), np.asarray(xy, dtype=np.float64) / n)
        noise = self.call_noise(n, 1.0)
        draw = self.draw(noise["scale"])
        if self.source.exact_grid:
            theta = round_to_grid(theta, noise["scale"])
            draw = round_to_grid(draw, noise["scale"])
        return theta + draw, noise


@dataclass(frozen=True)
class PrivIncERMParams(ConstrainedParams):
    """Public parameters of :class:`PrivIncERM`; ``ValueError`` names a bad one.

    ``horizon`` T (steps) is required: k = ⌈T/τ⌉ sets the per-run budget.
    ``tau`` τ in steps (default :func:`default_tau`), ``lam`` the ridge λ
    (default :func:`default_lambda` per run), ``noise`` of the black box.
    """

    dim: int
    epsilon: float
    delta: float
    horizon: int
    constraint: Constraint = field(default_factory=L2Ball)
    tau: Optional[int] = None
    lam: Optional[float] = None
    noise: str = "l2_laplace"

    def __post_init__(self):
        object.__setattr__(self, "dim", check_int("dim", self.dim))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta))
        if self.horizon is None:
            raise ValueError("horizon is required for PrivIncERM: the number of batch runs "
                             "k = ceil(T/tau) sets each run's budget (give end= or horizon=)")
        object.__setattr__(self, "horizon", check_int("horizon", self.horizon))
        check_constraint(self.constraint)
        object.__setattr__(self, "tau", check_int("tau", self.tau, optional=True))
        if self.lam is not None:
            object.__setattr__(self, "lam", check_real("lam", self.lam, positive=True))
        if self.noise not in ("l2_laplace", "gaussian"):
            raise ValueError(f"noise must be 'l2_laplace' or 'gaussian' (of {NOISE_KINDS}), got {self.noise!r}")

    @property
    def resolved_tau(self) -> int:
        return self.tau if self.tau is not None else default_tau(self.dim, self.horizon, self.epsilon)

    @property
    def runs(self) -> int:
        """k = ⌈T/τ⌉, the most batch runs a record enters."""
        return math.ceil(self.horizon / self.resolved_tau)

    @property
    def run_epsilon(self) -> float:
        return per_run_budget(self.epsilon, self.delta, self.runs)[0]

    @property
    def run_delta(self) -> float:
        return per_run_budget(self.epsilon, self.delta, self.runs)[1]


@dataclass(frozen=True)
class PrivIncERMState(StateRecord):
    """The state of a :class:`PrivIncERM`: name, version, parameters (their dict), steps,
    records and the step of the last fit, the running sums (svec Gram and Xᵀy), the model and
    its noise std."""

    mechanism: str
    version: int
    params: Dict[str, Any]
    t: int
    n: int
    last: int
    gram: np.ndarray = state_field(decode=float_array)
    xy: np.ndarray = state_field(decode=float_array)
    theta: np.ndarray = state_field(decode=float_array)
    std: float = state_field()


class PrivIncERM(StepMixin):
    """Mechanism PrivIncERM of seed 002 over ridge output perturbation (regression.md R-8).

    ``step(gram, xy, count)`` as :class:`~dp_beam.mechanisms.regression.PrivIncReg1`;
    at steps t ∈ τℕ (t <= T) with at least one record the batch black box runs on
    the prefix, otherwise the last model (initially Π_C(0) = 0) is repeated.
    State: the exact sums (``d(d+1)/2 + d`` numbers, stored like the data), n,
    the last model and its noise std; constant in t.
    """

    name = "privincerm"
    STATE_VERSION = 1

    def __init__(self, params: PrivIncERMParams, rng: RngLike = None,
                 batch: Type[RidgeOutputPerturbation] = RidgeOutputPerturbation) -> None:
        if not isinstance(params, PrivIncERMParams):
            raise ValueError(f"params must be PrivIncERMParams, got {type(params).__name__}")
        self.params = params
        self.dim = self.features = params.dim
        self.source = make_noise(rng)
        self._batch = batch
        self._t = self._n = self._last = 0
        self._gram = np.zeros(svec_dim(params.dim))
        self._xy = np.zeros(params.dim)
        self._theta = params.constraint.project(np.zeros(params.dim))
        self._std = 0.0

    @property
    def t(self) -> int:
        return self._t

    @property
    def n(self) -> int:
        return self._n

    def privacy_cost(self) -> Cost:
        """The cost of the whole sequence (replace one record).

        The better of advanced composition (regression.md R-8) and basic composition
        (k·ε′, and k·δ′ for Gaussian runs); ρ = k·ρ′ with ρ′ = ε′²/2 (pure ε′)
        or ρ(ε′, δ′) (Gaussian).
        """
        p = self.params
        k, eps_run, delta_run = p.runs, p.run_epsilon, p.run_delta
        adv_eps, adv_delta = advanced_composition(eps_run, delta_run, k, p.delta / 2.0)
        basic_eps, basic_delta = k * eps_run, k * delta_run if p.noise == "gaussian" else 0.0
        probe = RidgeOutputPerturbation(p.dim, 1.0, eps_run, noise=p.noise, delta=delta_run,
                                        rng=self.source)
        if basic_eps <= adv_eps:
            eps, delta = basic_eps, basic_delta
        else:
            eps, delta = adv_eps, adv_delta
        return Cost(float(eps), float(delta), float(k * probe.rho))

    def noise_std(self, n: int) -> dict:
        """``{"model": std}``: per-coordinate noise std of a batch run on n records (public;
        the release at a step carries the std of the run it repeats)."""
        p = self.params
        box = RidgeOutputPerturbation(p.dim, self.lam_at(n), p.run_epsilon, noise=p.noise,
                                      delta=p.run_delta, rng=self.source)
        return {"model": float(box.call_noise(max(n, 1), 1.0)["std"])}

    def lam_at(self, n: int) -> float:
        p = self.params
        return p.lam if p.lam is not None else default_lambda(n, p.run_epsilon, p.dim,
                                                              p.constraint.max_norm)

    def step(self, gram: ArrayLike, xy: ArrayLike, count: int) -> RegressionRelease:
        """Consume one step's sums and count; run the batch ERM at t ∈ τℕ; release the model."""
        gram, xy, count = self._check_step(gram, xy, count)
        p = self.params
        if self._t >= p.horizon:
            raise ValueError(f"horizon exceeded: horizon is {p.horizon}, step {self._t + 1} requested")
        self._t += 1
        self._n += count
        self._gram += gram
        self._xy += xy
        if self._t % p.resolved_tau == 0 and self._n > 0:
            box = self._batch(p.dim, self.lam_at(self._n), p.run_epsilon, noise=p.noise,
                              delta=p.run_delta, rng=self.source)
            theta, noise = box.fit(self._gram, self._xy, self._n)
            self._theta = p.constraint.project(theta)
            self._std = float(noise["std"])
            self._last = self._t
        return RegressionRelease(t=self._t, n=self._n, theta=self._theta.copy(), method=self.name,
                                 solver="batch", covers=(1, self._last) if self._last else (0, 0),
                                 noise_std_model=self._std)

    def state_size(self) -> int:
        return int(self._gram.size + self._xy.size + self._theta.size + 4)

    def to_state(self) -> dict:
        """Plain dict (:class:`PrivIncERMState`): parameters, counts, the exact sums and the
        last model; the sums are private (store the state like the data)."""
        return PrivIncERMState(mechanism=self.name, version=self.STATE_VERSION,
                               params=self.params.to_dict(), t=self._t, n=self._n, last=self._last,
                               gram=self._gram, xy=self._xy, theta=self._theta,
                               std=self._std).to_state()

    @classmethod
    def from_state(cls, state: Dict[str, Any], rng: RngLike = None,
                   batch: Type[RidgeOutputPerturbation] = RidgeOutputPerturbation) -> "PrivIncERM":
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        try:
            record = PrivIncERMState.from_state(state)
            mech = cls(PrivIncERMParams.from_dict(record.params), rng=rng, batch=batch)
            mech._t = check_int("state t", record.t, minimum=0)
            mech._n = check_int("state n", record.n, minimum=0)
            mech._last = check_int("state last", record.last, minimum=0)
            mech._gram = record.gram.reshape(svec_dim(mech.dim))
            mech._xy = record.xy.reshape(mech.dim)
            mech._theta = record.theta.reshape(mech.dim)
            mech._std = float(record.std)
        except (KeyError, TypeError) as err:
            raise ValueError(f"state is invalid: {err!r}") from None
        return mech
