"""Algorithm 6 end to end without an engine (seed 003): :class:`ContinualMeanMechanism`.

docs/privacy/mean.md M-3 to M-5 (Algorithm 6), M-4 (rescaling to [0, 1]^d)
and M-2, M-3 (the cap and the user bound): per-user schedule states, the
per-step aggregate and :class:`~.core.ContinualMeanCore` in one object, for
tests, benchmarks and small streams.
"""

from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from ...accounting.cost import Cost
from .aggregate import MeanAggregate, contribution
from .core import ContinualMeanCore, MeanStep
from .config import MeanConfig, mean_config
from .params import MeanParams
from .schedule import UserState, user_hash

__all__ = [
    "ContinualMeanMechanism",
]


def rescale_setup(lower: Any, upper: Any, dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-coordinate bounds as float arrays of length ``dim``; ``ValueError`` unless finite and lower < upper."""
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (dim,)).copy()
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (dim,)).copy()
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"lower and upper must be finite, got lower={lower!r}, upper={upper!r}")
    if np.any(lo >= hi):
        raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
    return lo, hi


class ContinualMeanMechanism:
    """Algorithm 6 end to end, engine-free: per-user schedule + :class:`ContinualMeanCore`.

    ``step(samples)`` consumes one time step's ``(user, value)`` pairs (in
    arrival order) and returns a :class:`MeanStep`; feeding one pair per step
    is the paper's sample-by-sample stream. Values are clamped to
    ``[lower, upper]`` (per coordinate for ``dim > 1``) and rescaled to [0,1]
    (docs/privacy/mean.md M-4). A user's samples beyond ``max_samples_per_user`` are ignored and
    counted in :attr:`ignored` (M-2); samples past 2^L are accepted but never
    released (M-2).

    More than ``max_users`` users: a step that brings the user count above n
    raises ``ValueError`` before it consumes anything (the stream is left as it
    was), because n enters Δ_ℓ and the accuracy guarantee assumes at most n
    users (M-2, M-3). That is for this engine-free class only, called
    directly. The Beam transform (:class:`dp_beam.transforms.mean.ContinualMean`)
    feeds :class:`ContinualMeanCore` and never raises on data: it does not
    count users, and every width and sensitivity it uses comes from the
    declared ``max_users`` (public constants), so extra users keep the privacy
    guarantee and only void the accuracy one.

    Example (``ZeroNoise``: exact, not private):

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> cm = ContinualMeanMechanism(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values", rng=ZeroNoise())
    >>> [round(cm.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]
    [2.0, 3.0, 4.0]
    >>> paper = ContinualMeanMechanism(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values",
    ...                                preset="paper", rng=ZeroNoise())
    >>> [round(paper.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]   # withholds sample 3
    [2.0, 3.0, 3.0]
    """

    def __init__(self, lower: Any, upper: Any, max_samples_per_user: Optional[int] = None,
                 epsilon: Optional[float] = None, *, config: Optional[MeanConfig] = None,
                 rng: Any = None, **params: Any) -> None:
        # The mean's parameters are MeanConfig's (max_users, beta, dim, neighbours, noise,
        # delta, horizon, preset, prior_ratio, ...): one list, shared with the transform.
        if config is None:
            config = mean_config(type(self).__name__, max_samples_per_user=max_samples_per_user,
                                 epsilon=epsilon, **params)
        elif max_samples_per_user is not None or epsilon is not None or params:
            raise TypeError("give either config or the mean's parameters, not both")
        self.params = MeanParams(config)
        self.lower, self.upper = rescale_setup(lower, upper, self.params.dim)
        self.core = ContinualMeanCore(self.params, self.lower, self.upper, config.horizon, rng)
        self.users: Dict[Any, UserState] = {}
        self.ignored = 0

    def rescale(self, value: Any) -> np.ndarray:
        """``value`` clamped to the bounds and rescaled to [0, 1]^d (M-4: values in [0, 1])."""
        x = np.asarray(value, dtype=np.float64).reshape(-1)
        if x.shape != (self.params.dim,) or not np.all(np.isfinite(x)):
            raise ValueError(f"value must be {self.params.dim} finite numbers, got {value!r}")
        x = np.clip(x, self.lower, self.upper)
        return (x - self.lower) / (self.upper - self.lower)

    def step(self, samples: Iterable[Tuple[Any, Any]] = ()) -> MeanStep:
        """Consume one time step's ``(user, value)`` pairs in arrival order; return its release."""
        p = self.params
        samples = list(samples)
        new_users = {user for user, _ in samples if user not in self.users}
        if len(self.users) + len(new_users) > p.n:
            raise ValueError(f"more than max_users={p.n} distinct users "
                             "(the step was not consumed)")
        agg = MeanAggregate()
        for user, value in samples:
            state = self.users.get(user)
            if state is None:
                state = self.users[user] = UserState(uhash=user_hash(user))
            if state.count >= p.m:
                self.ignored += 1
                continue
            agg = agg.merge(contribution(p, state, self.rescale(value), step=self.core.t + 1))
        return self.core.step(agg)

    def privacy_cost(self) -> Cost:
        """The cost of the whole output sequence (:meth:`MeanParams.privacy_cost`)."""
        return self.params.privacy_cost()

    @property
    def active(self) -> Dict[int, bool]:
        """Whether each level's tree is active."""
        return dict(self.core.active)

    def tree_counts(self) -> Dict[int, int]:
        """Elements in each B_ℓ so far (the paper's c_ℓ; buffered ones excluded)."""
        return {lv: (self.core.counts[lv] if self.core.active[lv] else 0) for lv in self.params.levels}
