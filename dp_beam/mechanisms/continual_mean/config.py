"""The user-facing parameters of the continual mean (seed 003): :class:`MeanConfig`.

One frozen, validated value taken by :class:`~.params.MeanParams` (which
derives every constant of Algorithm 6 from it), by the engine-free
:class:`~.stream.ContinualMeanMechanism` and by the Beam transform
``dp_beam.ContinualMean``, so the three accept the same parameters. The
privacy meaning of each parameter is stated in ``docs/privacy/mean.md``
(M-1 for ``neighbours``, M-7 for the budget split, M-8 for the tuned plan).
"""

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Optional

from ..counting.registry import get_mechanism

__all__ = [
    "NEIGHBOURS",
    "PRESETS",
    "MeanConfig",
    "mean_config",
    "check_keywords",
    "h",
    "positive_int",
    "positive_real",
]


NEIGHBOURS = ("participation", "values")

#: Parameter presets of :class:`~.params.MeanParams` (see its docstring).
PRESETS = ("tuned", "paper")


def h(n: int) -> int:
    """Tree depth ``⌊log2 n⌋ + 1`` (docs/privacy/counting.md C-3)."""
    return int(n).bit_length()


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1, or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def positive_real(name: str, value: Any, upper: Optional[float] = None) -> float:
    """``value`` as a finite float > 0 (and < ``upper``), or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    value = float(value)
    if value <= 0 or (upper is not None and value >= upper):
        bound = f" and < {upper}" if upper is not None else ""
        raise ValueError(f"{name} must be > 0{bound}, got {value!r}")
    return value


@dataclass(frozen=True)
class MeanConfig:
    """The declared configuration of one mean stream, validated on construction.

    ``max_users`` (n) and ``max_samples_per_user`` (m) are public upper
    bounds; ``beta`` affects accuracy targets only, never privacy
    (docs/privacy/mean.md M-7). ``noise=None`` means ``"gaussian"`` when
    ``delta`` is given, else ``"laplace"``; ``mechanism=None`` means the
    binary tree for ``preset="paper"`` and the most accurate counter for the
    noise family otherwise; ``median_budget=None`` means ``"per_L"`` and
    ``tree_levels=None`` means ``h(n)``. The defaults are resolved by
    :class:`~.params.MeanParams`, so :func:`dataclasses.replace` of one field
    re-derives the others. A wrong value raises ``ValueError`` naming the
    parameter.

    >>> MeanConfig(1000, 16, 1.0, preset="paper").resolved_noise()
    'laplace'
    >>> MeanConfig(1000, 16, 1.0, prior_query=True)
    Traceback (most recent call last):
    ...
    ValueError: prior_query=True needs neighbours='values' (user counts must be public)
    """

    max_users: int
    max_samples_per_user: int
    epsilon: float
    beta: float = 0.1
    dim: int = 1
    neighbours: str = "participation"
    noise: Optional[str] = None
    delta: Optional[float] = None
    median_budget: Optional[str] = None
    tree_levels: Optional[int] = None
    mechanism: Optional[str] = None
    horizon: Optional[int] = None
    preset: str = "tuned"
    prior_ratio: Optional[float] = None
    prior_query: Optional[bool] = None
    user_spread: float = 0.0

    def __post_init__(self) -> None:
        # The order of the checks is the order of the error a caller sees first.
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {self.preset!r}")
        self._set("max_users", positive_int("max_users", self.max_users))
        self._set("max_samples_per_user",
                  positive_int("max_samples_per_user", self.max_samples_per_user))
        self._set("epsilon", positive_real("epsilon", self.epsilon))
        self._set("beta", positive_real("beta", self.beta, upper=1.0))
        self._set("dim", positive_int("dim", self.dim))
        if self.neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {self.neighbours!r}")
        self._check_noise()
        if self.horizon is not None:
            self._set("horizon", positive_int("horizon", self.horizon))
        self._check_tuned_options()
        if self.mechanism is not None:
            get_mechanism(self.mechanism)  # raises ValueError naming `mechanism`
        if self.median_budget not in (None, "per_L", "per_L_minus_1"):
            raise ValueError("median_budget must be 'per_L', 'per_L_minus_1' or None, "
                             f"got {self.median_budget!r}")
        if self.tree_levels is not None:
            self._set("tree_levels", positive_int("tree_levels", self.tree_levels))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_noise(self) -> None:
        noise, delta = self.noise, self.delta
        if noise not in (None, "laplace", "gaussian"):
            raise ValueError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
        if self.resolved_noise() == "gaussian":
            self._set("delta", positive_real("delta", delta, upper=1.0))
        elif delta not in (None, 0, 0.0):
            raise ValueError(f"delta must be None for Laplace noise (pure epsilon-DP), got {delta!r}")

    def _check_tuned_options(self) -> None:
        tuned = self.preset == "tuned"
        ratio = self.prior_ratio
        if ratio is not None:
            if not tuned:
                raise ValueError("prior_ratio applies to preset='tuned' only")
            if not (isinstance(ratio, numbers.Real) and ratio == math.inf):
                self._set("prior_ratio", positive_real("prior_ratio", ratio))   # math.inf: no prior
        query = self.prior_query
        if query is not None:
            if not tuned:
                raise ValueError("prior_query applies to preset='tuned' only")
            if not isinstance(query, bool):
                raise ValueError(f"prior_query must be None, True or False, got {query!r}")
            if query and self.neighbours != "values":
                raise ValueError("prior_query=True needs neighbours='values' "
                                 "(user counts must be public)")
        spread = self.user_spread
        if (isinstance(spread, bool) or not isinstance(spread, numbers.Real)
                or not 0.0 <= spread < 1.0):
            raise ValueError(f"user_spread must be a number in [0, 1), got {spread!r}")
        if spread and not tuned:
            raise ValueError("user_spread applies to preset='tuned' only")
        self._set("user_spread", float(spread))

    def resolved_noise(self) -> str:
        """``noise``, or the default for ``delta``: Gaussian with δ, else Laplace (pure ε)."""
        if self.noise is not None:
            return self.noise
        return "laplace" if self.delta in (None, 0, 0.0) else "gaussian"


def mean_config(owner: str, **params: Any) -> MeanConfig:
    """A :class:`MeanConfig` from keyword arguments given to ``owner``'s constructor.

    An unknown keyword raises the ``TypeError`` Python raises for ``owner``
    itself, so a misspelt parameter names the class the caller used.

    >>> mean_config("Example", max_users=10, max_samples_per_user=4, epsilon=1.0).dim
    1
    >>> mean_config("Example", max_users=10, max_samples_per_user=4, epsilon=1.0, dims=2)
    Traceback (most recent call last):
    ...
    TypeError: Example.__init__() got an unexpected keyword argument 'dims'
    """
    check_keywords(owner, params)
    return MeanConfig(**params)


def check_keywords(owner: str, params: Any) -> None:
    """``TypeError`` as Python words it for ``owner``'s constructor if a name of
    ``params`` is not a field of :class:`MeanConfig`."""
    names = {field.name for field in dataclasses.fields(MeanConfig)}
    for name in params:
        if name not in names:
            raise TypeError(f"{owner}.__init__() got an unexpected keyword argument {name!r}")
