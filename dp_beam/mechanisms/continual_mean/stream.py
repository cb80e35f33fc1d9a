"""Algorithm 6 end to end without an engine (seed 003): :class:`ContinualMean`.

Spec withhold_release_and_composition.md §2.9, §3.1 (rescaling to [0, 1]^d)
and §6 A14–A15 (the cap and the user bound): per-user schedule states, the
per-step aggregate and :class:`~.core.ContinualMeanCore` in one object, for
tests, benchmarks and small streams.
"""

import numpy as np

from .aggregate import MeanAggregate, contribution
from .core import ContinualMeanCore
from .params import MeanParams
from .schedule import UserState, user_hash

__all__ = [
    "ContinualMean",
]


def rescale_setup(lower, upper, dim):
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (dim,)).copy()
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (dim,)).copy()
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"lower and upper must be finite, got lower={lower!r}, upper={upper!r}")
    if np.any(lo >= hi):
        raise ValueError(f"lower must be < upper, got lower={lower!r}, upper={upper!r}")
    return lo, hi


class ContinualMean:
    """Algorithm 6 end to end, engine-free: per-user schedule + :class:`ContinualMeanCore`.

    ``step(samples)`` consumes one time step's ``(user, value)`` pairs (in
    arrival order) and returns a :class:`MeanStep`; feeding one pair per step
    is the paper's sample-by-sample stream. Values are clamped to
    ``[lower, upper]`` (per coordinate for ``dim > 1``) and rescaled to [0,1]
    (§3.1). A user's samples beyond ``max_samples_per_user`` are ignored and
    counted in :attr:`ignored` (§6 A14); samples past 2^L are accepted but never
    released (WR-6).

    More than ``max_users`` users: a step that brings the user count above n
    raises ``ValueError`` before it consumes anything (the stream is left as it
    was), because n enters Δ_ℓ and the accuracy guarantee assumes at most n
    users (§6 A15, A6-14). That is for this engine-free class only, called
    directly. The Beam transform (:class:`dp_beam.transforms.mean.ContinualMean`)
    feeds :class:`ContinualMeanCore` and never raises on data: it does not
    count users, and every width and sensitivity it uses comes from the
    declared ``max_users`` (public constants), so extra users keep the privacy
    guarantee and only void the accuracy one.

    Example (``ZeroNoise``: exact, not private):

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> cm = ContinualMean(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values", rng=ZeroNoise())
    >>> [round(cm.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]
    [2.0, 3.0, 4.0]
    >>> paper = ContinualMean(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values",
    ...                       preset="paper", rng=ZeroNoise())
    >>> [round(paper.step([("a", x)]).estimate, 3) for x in (2.0, 4.0, 6.0)]   # withholds sample 3
    [2.0, 3.0, 3.0]
    """

    def __init__(self, lower, upper, max_samples_per_user, epsilon, *, max_users, beta=0.1, dim=1,
                 neighbours="participation", noise=None, delta=None, horizon=None,
                 median_budget=None, mechanism=None, preset="tuned", prior_ratio=None,
                 prior_query=None, user_spread=0.0, rng=None):
        self.params = MeanParams(max_users, max_samples_per_user, epsilon, beta, dim=dim,
                                 neighbours=neighbours, noise=noise, delta=delta,
                                 median_budget=median_budget, mechanism=mechanism,
                                 horizon=horizon, preset=preset, prior_ratio=prior_ratio,
                                 prior_query=prior_query, user_spread=user_spread)
        self.lower, self.upper = rescale_setup(lower, upper, self.params.dim)
        self.core = ContinualMeanCore(self.params, self.lower, self.upper, horizon, rng)
        self.users = {}
        self.ignored = 0

    def rescale(self, value):
        x = np.asarray(value, dtype=np.float64).reshape(-1)
        if x.shape != (self.params.dim,) or not np.all(np.isfinite(x)):
            raise ValueError(f"value must be {self.params.dim} finite numbers, got {value!r}")
        x = np.clip(x, self.lower, self.upper)
        return (x - self.lower) / (self.upper - self.lower)

    def step(self, samples=()):
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

    def privacy_cost(self):
        return self.params.privacy_cost()

    @property
    def active(self):
        return dict(self.core.active)

    def tree_counts(self):
        """Elements in each B_ℓ so far (the paper's c_ℓ; buffered ones excluded)."""
        return {lv: (self.core.counts[lv] if self.core.active[lv] else 0) for lv in self.params.levels}
