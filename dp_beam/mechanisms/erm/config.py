"""The user-facing parameters of the private-ERM streams (seed 004): :class:`ERMConfig`.

One frozen, validated value per stream family, taken by the engine-free
streams (:class:`~.continual.ContinualERMMechanism`,
:class:`~.sliding_window.SlidingWindowERMMechanism`,
:class:`~.multi_resolution.MultiResolutionERMMechanism`) and by the Beam
transforms ``dp_beam.ContinualERM``, ``dp_beam.SlidingWindowERM`` and
``dp_beam.MultiResolutionERM``, so that a stream and its transform accept
the same parameters with the same defaults and the same errors. The
privacy meaning of each parameter is stated in ``docs/privacy/erm.md``
(E-2 for ``feature_bound``, E-4 for ``noise``, E-5 to E-7 for the
family-specific ones).

:class:`ERMConfig` holds the model and budget shared by the three families;
:class:`ContinualERMConfig` adds ``base_size``,
:class:`SlidingWindowERMConfig` ``window`` and ``window_policy``, and
:class:`MultiResolutionERMConfig` ``max_scale``. Fields are keyword-only:
the streams and transforms keep their own positional order.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ..checks import check_int, check_real
from ..noise import ZeroNoise
from .loss import LogisticLoss
from .perturbation import OutputPerturbation
from .stream import is_pow2

__all__ = [
    "WINDOW_POLICIES",
    "ERMConfig",
    "ContinualERMConfig",
    "SlidingWindowERMConfig",
    "MultiResolutionERMConfig",
    "field_names",
]

#: How a sliding window that is not (2^k − 1) blocks is treated (erm.md E-7; see
#: :class:`~.sliding_window.SlidingWindowERMMechanism`).
WINDOW_POLICIES = ("exact", "round_down", "general")


@dataclass(frozen=True, kw_only=True)
class ERMConfig:
    """The model and budget of one private-ERM stream, validated on construction.

    ``classes`` is stored as a tuple and the numbers as plain ``int``/``float``;
    ``delta`` is kept only for ``noise="gaussian"`` (``None`` otherwise, where
    it must be ``None`` or 0). A wrong value raises ``ValueError`` naming the
    parameter, in the order of the fields.

    >>> ERMConfig(epsilon=1, block_size=4, n_features=2, classes=[0, 1], feature_bound=1,
    ...           lam=0.5).classes
    (0, 1)
    >>> ERMConfig(epsilon=1, block_size=4, n_features=2, classes=[0, 1], feature_bound=1,
    ...           lam=0.5, noise="gaussian")
    Traceback (most recent call last):
    ...
    ValueError: delta must be in (0, 1) for Gaussian noise, got None
    """

    epsilon: float
    block_size: int
    n_features: int
    classes: Sequence[Any]
    feature_bound: float
    lam: float
    fit_intercept: bool = True
    noise: str = "l2_laplace"
    delta: Optional[float] = None
    tol_fraction: float = 0.5

    def __post_init__(self) -> None:
        # A string would pass as its characters ("ab" -> ("a", "b")): almost surely a slip.
        if isinstance(self.classes, (str, bytes)):
            raise ValueError(f"classes must be a sequence of labels, got {self.classes!r}")
        self._set("block_size", check_int("block_size", self.block_size, 1))
        # The loss and the perturbation check their own parameters (messages naming them);
        # the config keeps their normalised values.
        loss = self.loss()
        self._set("n_features", loss.n_features)
        self._set("classes", loss.classes)
        self._set("feature_bound", loss.feature_bound)
        self._set("epsilon", check_real("epsilon", self.epsilon, positive=True))
        self._set("lam", check_real("lam", self.lam, positive=True))
        # Validate noise/delta once, on the whole budget, so errors name them.
        OutputPerturbation(loss, self.lam, self.epsilon, self.noise, self.delta, rng=ZeroNoise(),
                           tol_fraction=self.tol_fraction)
        self._set("delta", None if self.noise != "gaussian" else float(self.delta))
        self._set("tol_fraction", float(self.tol_fraction))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def loss(self) -> LogisticLoss:
        """The :class:`~.loss.LogisticLoss` of the stream (its Lipschitz constant, E-2 to E-4)."""
        return LogisticLoss(self.n_features, self.classes, self.feature_bound, self.fit_intercept)

    def to_dict(self) -> Dict[str, Any]:
        """The fields in order, ``classes`` as a list: keyword arguments of the stream and the
        ``"config"`` of its saved state.

        >>> ERMConfig(epsilon=1, block_size=4, n_features=2, classes=(0, 1), feature_bound=1,
        ...           lam=0.5).to_dict()["classes"]
        [0, 1]
        """
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["classes"] = list(self.classes)
        return out


@dataclass(frozen=True, kw_only=True)
class ContinualERMConfig(ERMConfig):
    """:class:`ERMConfig` plus ``base_size`` B, a multiple of ``block_size`` (erm.md E-6).

    >>> ContinualERMConfig(epsilon=1, block_size=4, base_size=6, n_features=2, classes=[0, 1],
    ...                    feature_bound=1, lam=0.5)
    Traceback (most recent call last):
    ...
    ValueError: base_size must be a multiple of block_size=4, got 6
    """

    base_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        base_size = check_int("base_size", self.base_size, 1)
        if base_size % self.block_size:
            raise ValueError(f"base_size must be a multiple of block_size={self.block_size}, "
                             f"got {base_size}")
        self._set("base_size", base_size)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowERMConfig(ERMConfig):
    """:class:`ERMConfig` plus the ``window`` w (points) and its ``window_policy`` (erm.md E-7).

    ``"exact"`` needs w = (2^k − 1)·``block_size``; ``"round_down"`` and
    ``"general"`` accept any w >= ``block_size`` (see :attr:`window_blocks`).

    >>> SlidingWindowERMConfig(epsilon=1, block_size=4, window=40, window_policy="round_down",
    ...                        n_features=2, classes=[0, 1], feature_bound=1, lam=0.5).window_blocks
    7
    """

    window: int
    window_policy: str = "exact"

    def __post_init__(self) -> None:
        super().__post_init__()
        policy = self.window_policy
        if policy not in WINDOW_POLICIES:
            raise ValueError(f"window_policy must be one of {WINDOW_POLICIES}, got {policy!r}")
        window = check_int("window", self.window, self.block_size)
        self._set("window", window)
        if policy == "exact" and window % self.block_size:
            raise ValueError(f"window must be a multiple of block_size={self.block_size} in exact "
                             f"mode, got {window}")
        blocks = window // self.block_size
        if policy == "exact" and not is_pow2(blocks + 1):
            raise ValueError(f"window must be (2^k - 1)·block_size in exact mode, got {blocks} "
                             f"blocks (use window_policy='round_down' or 'general')")

    @property
    def window_blocks(self) -> int:
        """W, the blocks in the window used: w/w0 rounded down, and under ``"round_down"``
        further down to the nearest 2^k − 1 (E-7)."""
        blocks = self.window // self.block_size
        if self.window_policy == "round_down":
            return (1 << ((blocks + 1).bit_length() - 1)) - 1
        return blocks


@dataclass(frozen=True, kw_only=True)
class MultiResolutionERMConfig(ERMConfig):
    """:class:`ERMConfig` plus ``max_scale``, an optional cap K >= 0 on the scales (erm.md E-5).

    >>> MultiResolutionERMConfig(epsilon=1, block_size=4, n_features=2, classes=[0, 1],
    ...                          feature_bound=1, lam=0.5, max_scale=-1)
    Traceback (most recent call last):
    ...
    ValueError: max_scale must be an int >= 0, got -1
    """

    max_scale: Optional[int] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_scale is not None:
            self._set("max_scale", check_int("max_scale", self.max_scale, 0))


def field_names(config_cls: type) -> Tuple[str, ...]:
    """The field names of a config class, in order (the keywords it takes)."""
    return tuple(field.name for field in dataclasses.fields(config_cls))
