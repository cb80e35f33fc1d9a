"""The constructor parameters every continual counter shares, checked once.

All counters of this package take ``(epsilon, sensitivity, horizon, noise,
delta, dim, rng, calibration)`` and state the same privacy cost for them
(``docs/privacy/counting.md``, C-4, C-5): the checks, the ρ-zCDP that the
parameters buy, the record of the state fields they share
(:class:`CounterState`) and the common start of ``from_state`` live here so
that the tree and the factorisation mechanisms cannot drift apart.
"""

import dataclasses
import functools
import math
import numbers
from typing import Any, Dict, Optional, Tuple, Type

import numpy as np

from ...accounting.cost import Cost
from ..calibration import CALIBRATIONS, gaussian_sigma, rho_from_eps, rho_from_eps_delta
from ..checks import check_step_index
from ..noise import NoiseSource, make_noise
from ..state import StateRecord

__all__ = [
    "NOISE_KINDS",
    "CounterConfig",
    "CounterParameters",
    "CounterState",
    "check_calibration",
    "check_delta",
    "check_dim",
    "check_epsilon",
    "check_horizon",
    "check_input",
    "check_noise",
    "check_sensitivity",
    "privacy_cost",
    "restore_parameters",
    "zcdp_rho",
]

NOISE_KINDS = ("laplace", "gaussian")


def check_epsilon(epsilon: Any) -> float:
    """ε as a float; a finite number > 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return epsilon


def check_sensitivity(sensitivity: Any) -> float:
    """Δ as a float; a finite number >= 0."""
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, numbers.Real):
        raise ValueError(f"sensitivity must be a finite number >= 0, got {sensitivity!r}")
    sensitivity = float(sensitivity)
    if not math.isfinite(sensitivity) or sensitivity < 0:
        raise ValueError(f"sensitivity must be a finite number >= 0, got {sensitivity!r}")
    return sensitivity


def check_horizon(horizon: Any) -> Optional[int]:
    """The horizon T as an int >= 1, or None for an unbounded stream."""
    if horizon is None:
        return None
    if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or horizon < 1:
        raise ValueError(f"horizon must be an int >= 1 or None, got {horizon!r}")
    return int(horizon)


def check_noise(noise: Any) -> str:
    """One of :data:`NOISE_KINDS`."""
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    return noise


def check_calibration(calibration: Any) -> str:
    """One of :data:`~dp_beam.mechanisms.calibration.CALIBRATIONS`."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    return calibration


def check_delta(delta: Any, noise: str) -> Optional[float]:
    """δ for the noise: None (or 0, read as None) for Laplace, a float in (0, 1) for Gaussian."""
    if noise == "laplace":
        if delta is None:
            return None
        if isinstance(delta, numbers.Real) and not isinstance(delta, bool) and float(delta) == 0.0:
            return None
        raise ValueError(f"delta must be None or 0 for Laplace noise (pure epsilon-DP), got {delta!r}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise ValueError(f"delta must be a number in (0, 1) for Gaussian noise, got {delta!r}")
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be a number in (0, 1) for Gaussian noise, got {delta!r}")
    return delta


def check_dim(dim: Any) -> int:
    """The input vector length as an int >= 1."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise ValueError(f"dim must be an int >= 1, got {dim!r}")
    return int(dim)


def check_input(x: Any, dim: int) -> np.ndarray:
    """One step's input as a finite float array of shape ``(dim,)``."""
    if type(x) is float and dim == 1:
        # The common case (a step total), without NumPy's parsing.
        if not math.isfinite(x):
            raise ValueError(f"x must be finite, got {x!r}")
        return np.array([x])
    if isinstance(x, (str, bytes)):
        # NumPy would parse "3" as 3.0; a string is a caller bug here.
        raise ValueError(f"x must be a number or an array of {dim} numbers, got {x!r}")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"x must be a number or an array of {dim} numbers, got {x!r}") from None
    if dim == 1 and arr.shape in ((), (1,)):
        arr = arr.reshape(1)
    elif arr.shape != (dim,):
        raise ValueError(f"x must have shape ({dim},), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"x must be finite, got {x!r}")
    return arr


def zcdp_rho(noise: str, calibration: str, epsilon: float, delta: Optional[float]) -> float:
    """ρ such that the whole output sequence of a counter is ρ-zCDP (C-4, C-5).

    Laplace: ε²/2 (pure ε-DP implies it). Gaussian ``"zcdp"``: the ρ the
    (ε, δ) target was converted to. Gaussian ``"analytic"``: a Gaussian
    mechanism with L2 sensitivity s and std σ is s²/(2σ²)-zCDP; σ is
    proportional to s, so the ratio is the same for every tree depth or
    column norm and equals that of the unit-sensitivity σ.
    """
    if noise == "laplace":
        return rho_from_eps(epsilon)
    if calibration == "zcdp":
        return rho_from_eps_delta(epsilon, delta)
    unit_sigma = gaussian_sigma(1.0, epsilon, delta, "analytic")
    return 1.0 / (2.0 * unit_sigma * unit_sigma)


def privacy_cost(epsilon: float, delta: Optional[float], rho: float) -> Cost:
    """The cost of a counter's whole output sequence (C-4 to C-6).

    Laplace (``delta`` None) is ε-DP, hence ε²/2-zCDP; Gaussian is ρ-zCDP
    and (ε, δ)-DP with the ε the noise was calibrated to, which the caller
    passes (not re-derived from ρ: the analytic calibration reaches ε with
    a smaller σ than the zCDP conversion would).
    """
    if delta is None:
        return Cost.laplace(epsilon)
    return Cost.gaussian(rho, delta, epsilon=epsilon)


@dataclasses.dataclass(frozen=True)
class CounterConfig:
    """The public parameters of a continual counter, validated once (C-4, C-5).

    Every counter of this package is built from one (its keyword constructor
    makes it), and so is every stream of ``dpb.ContinualCount`` and
    ``dpb.ContinualSum``: the transform validates its parameters here at
    construction and its release builds each stream's mechanism with
    ``from_config``. Fields hold the checked values (floats, an int horizon,
    ``delta`` None for Laplace noise); a bad one raises ``ValueError`` naming
    it. The fields are, in order, the parameter part of every counter's
    ``to_state``.

    >>> c = CounterConfig(epsilon=1, horizon=8, delta=0)
    >>> c.epsilon, c.delta, c.rho, dict(c.cost())
    (1.0, None, 0.5, {'epsilon': 1.0, 'delta': 0.0, 'rho': 0.5})
    >>> CounterConfig(epsilon=1.0, noise="gaussian")
    Traceback (most recent call last):
    ...
    ValueError: delta must be a number in (0, 1) for Gaussian noise, got None
    """

    epsilon: float
    sensitivity: float = 1.0
    horizon: Optional[int] = None
    noise: str = "laplace"
    delta: Optional[float] = None
    dim: int = 1
    calibration: str = "zcdp"

    def __post_init__(self) -> None:
        checked = {
            "epsilon": check_epsilon(self.epsilon),
            "sensitivity": check_sensitivity(self.sensitivity),
            "horizon": check_horizon(self.horizon),
            "noise": check_noise(self.noise),
            "calibration": check_calibration(self.calibration),
        }
        checked["delta"] = check_delta(self.delta, checked["noise"])
        checked["dim"] = check_dim(self.dim)
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @functools.cached_property
    def rho(self) -> float:
        """ρ such that the whole output sequence is ρ-zCDP (:func:`zcdp_rho`); computed once
        per config, which every stream's mechanism shares."""
        return zcdp_rho(self.noise, self.calibration, self.epsilon, self.delta)

    def cost(self) -> Cost:
        """The counter's privacy cost (:func:`privacy_cost`)."""
        return privacy_cost(self.epsilon, self.delta, self.rho)

    def to_dict(self) -> Dict[str, Any]:
        """The fields by name, in order: the constructor keywords of every counter."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class CounterState(StateRecord):
    """The leading fields of every counter's state: its name, state version, the fields of its
    :class:`CounterConfig` (in their order) and the steps consumed.

    A counter's state record derives from this one and adds what its
    mechanism holds; the values are as the state stores them (checked by
    :func:`restore_parameters` and the mechanism's ``from_state``).
    """

    mechanism: str
    version: int
    epsilon: float
    sensitivity: float
    horizon: Optional[int]
    noise: str
    delta: Optional[float]
    dim: int
    calibration: str
    t: int

    def config_kwargs(self) -> Dict[str, Any]:
        """The :class:`CounterConfig` fields by name: the counter's constructor keywords."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CounterConfig)}


def restore_parameters(cls: type, state: Any, rng: Any, record: Type[CounterState]) -> Tuple[Any, int, Any]:
    """The common start of a continual mechanism's ``from_state``.

    Checks the state's type, mechanism name and version, reads it as
    ``record`` (a :class:`CounterState`; a missing or unknown field raises
    ``ValueError`` naming it), rebuilds ``cls`` from the constructor
    parameters the state stores (so every parameter is validated again), and
    returns ``(mechanism, t, record)`` with the step count ``t`` checked.
    """
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict, got {type(state).__name__}")
    if state.get("mechanism") != cls.name:
        raise ValueError(f"state is not a {cls.name!r} state: mechanism={state.get('mechanism')!r}")
    if state.get("version") != cls.STATE_VERSION:
        raise ValueError(f"unsupported state version {state.get('version')!r}, expected {cls.STATE_VERSION}")
    values = record.from_state(state)
    mech = cls(rng=rng, **values.config_kwargs())
    t = values.t
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        raise ValueError(f"state t must be an int >= 0, got {t!r}")
    return mech, int(t), values


class CounterParameters:
    """The validated public parameters every continual counter exposes, and its input checks.

    :class:`~.tree.BinaryTreeMechanism` and
    :class:`~.factorisation.FactorisationMechanism` set them from a
    :class:`CounterConfig` in their constructors (:meth:`_configure`); the
    accessors and the step and input checks (with the same error messages
    for every counter) are written once here.
    """

    def _configure(self, config: CounterConfig, rng: Any) -> None:
        """Takes the parameters of ``config`` and the noise source ``rng``."""
        self._config = config
        self._epsilon = config.epsilon
        self._sensitivity = config.sensitivity
        self._horizon = config.horizon
        self._noise = config.noise
        self._calibration = config.calibration
        self._delta = config.delta
        self._dim = config.dim
        self._source = make_noise(rng)
        self._rho = config.rho

    @classmethod
    def from_config(cls, config: CounterConfig, rng: Any = None) -> "CounterParameters":
        """A new mechanism with the parameters of ``config``; ``rng`` as the constructor's."""
        if not isinstance(config, CounterConfig):
            raise ValueError(f"config must be a CounterConfig, got {type(config).__name__}")
        # The config is valid already: every counter's keyword constructor builds one and
        # hands it to its ``_setup``, which is called here directly, without validating the
        # fields again (a release opens a mechanism per stream, and the checks cost as much
        # as the rest of the set-up).
        mechanism = cls.__new__(cls)
        mechanism._setup(config, rng)
        return mechanism

    @property
    def config(self) -> CounterConfig:
        return self._config

    def _check_t(self, t):
        t = check_step_index(t)
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"t must be <= horizon ({self._horizon}), got {t}")
        return t

    def _check_x(self, x):
        return check_input(x, self._dim)

    # -- public parameters ----------------------------------------------------

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def sensitivity(self) -> float:
        return self._sensitivity

    @property
    def horizon(self) -> Optional[int]:
        return self._horizon

    @property
    def noise(self) -> str:
        return self._noise

    @property
    def delta(self) -> Optional[float]:
        return self._delta

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def calibration(self) -> str:
        return self._calibration

    @property
    def noise_source(self) -> NoiseSource:
        """The :class:`~dp_beam.mechanisms.noise.NoiseSource` nodes draw from."""
        return self._source

    @property
    def rho(self) -> float:
        """ρ such that the whole output sequence is ρ-zCDP (C-4, C-5)."""
        return self._rho

    @property
    def t(self) -> int:
        """Number of steps consumed."""
        return self._t

    def _state_header(self) -> Dict[str, Any]:
        """The :class:`CounterState` fields of this counter: its name, state version and
        public parameters, and the steps consumed."""
        return {"mechanism": self.name, "version": self.STATE_VERSION, **self._config.to_dict(),
                "t": self._t}

    def _output(self, value: np.ndarray) -> Any:
        """A release: a float for a scalar stream, else a fresh array (callers may keep it)."""
        if self._dim == 1:
            return float(value[0])
        return np.array(value, dtype=np.float64, copy=True)
