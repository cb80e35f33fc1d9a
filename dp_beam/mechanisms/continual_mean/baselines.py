"""Baselines of Algorithm 6 (seed 003), for the benchmarks and tests.

Algorithms 2 (:class:`NaiveMean`), 4 (:class:`SingleTreeMean`) and 5
(:class:`MultiTreeMean`) of arXiv:2212.09980 (privacy: docs/privacy/mean.md
M-10), element-indexed as in the paper with scalar values in [0, 1], and their
per-time-step forms :class:`StepNaiveMean` and :class:`StepPriorMean` with the
same cap, noise family and neighbour relation as Algorithm 6.
"""

import math
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from ...accounting.cost import Cost
from ..calibration import eps_from_rho_delta, rho_from_eps_delta
from ..noise import make_noise
from ..counting.registry import default_mechanism, get_mechanism
from ..counting.tree import BinaryTreeMechanism
from .config import NEIGHBOURS, positive_int, positive_real
from .schedule import UserState, element_size, withhold_release
from .stream import rescale_setup

__all__ = [
    "NaiveMean",
    "SingleTreeMean",
    "MultiTreeMean",
    "StepNaiveMean",
    "StepPriorMean",
    "prior_truncation",
]


class _Baseline:
    def __init__(self, max_users, max_samples_per_user, epsilon, rng):
        self.n = positive_int("max_users", max_users)
        self.m = positive_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = positive_real("epsilon", epsilon)
        self.L = self.m.bit_length() - 1
        self.source = make_noise(rng)
        self.users = {}
        self.N = 0

    def _user(self, u):
        st = self.users.get(u)
        if st is None:
            st = self.users[u] = UserState()
        return st

    @staticmethod
    def _x(x):
        x = float(x)
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"baseline samples must be in [0, 1], got {x!r}")
        return x


class NaiveMean(_Baseline):
    """Algorithm 2 (M-10): every sample into one tree, η = m·h(T)/ε; samples past m dropped."""

    def __init__(self, max_users: int, max_samples_per_user: int, epsilon: float,
                 rng: Any = None) -> None:
        super().__init__(max_users, max_samples_per_user, epsilon, rng)
        self.T = self.n * self.m
        self.tree = BinaryTreeMechanism(self.epsilon, sensitivity=self.m, horizon=self.T, rng=self.source)
        self.dropped = 0

    @property
    def eta(self) -> float:
        return self.tree.noise_scales(1)[0]

    def step(self, x: float, user: Any) -> float:
        st = self._user(user)
        if st.count >= self.m:
            self.dropped += 1
        else:
            st.count += 1
            self.tree.step(self._x(x))
            self.N += 1
        return self.tree.current() / self.N if self.N else float("nan")


class _PriorMean(_Baseline):
    """Shared by Algorithms 4 and 5: the schedule plus Π_ℓ around 2^{ℓ−1}μ̃ (eq. (4))."""

    def __init__(self, max_users, max_samples_per_user, epsilon, prior, beta=0.1, tau=None, rng=None):
        super().__init__(max_users, max_samples_per_user, epsilon, rng)
        self.prior = float(prior)
        self.E, self.tau, self.Delta, self.width = prior_truncation(self.n, self.m, beta, tau)

    def _element(self, x, user):
        st = self._user(user)
        x = self._x(x)
        out = withhold_release(st, np.array([x]), self.L, 0)
        lv = out["level"]
        if lv is None:
            return None, None
        value = float(out["element"][0])
        if lv >= 1:
            c = element_size(lv) * self.prior
            value = min(max(value, c - self.Delta[lv]), c + self.Delta[lv])
        self.N += element_size(lv)
        return lv, value


class SingleTreeMean(_PriorMean):
    """Algorithm 4 (M-10): one tree of horizon nE, η = E·h(nE)·W_max/ε (eq. (5))."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree = BinaryTreeMechanism(self.epsilon, sensitivity=self.E * max(self.width.values()),
                                        horizon=self.n * self.E, rng=self.source)

    @property
    def eta(self) -> float:
        return self.tree.noise_scales(1)[0]

    def step(self, x: float, user: Any) -> float:
        lv, value = self._element(x, user)
        if lv is not None:
            self.tree.step(value)
        return self.tree.current() / self.N


class MultiTreeMean(_PriorMean):
    """Algorithm 5 (M-10): B_0..B_L of horizon n at ε/(L+1) each, η_ℓ = (L+1)h(n)W_ℓ/ε (eq. (7))."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trees = {lv: BinaryTreeMechanism(self.epsilon / self.E, sensitivity=self.width[lv],
                                              horizon=self.n, rng=self.source)
                      for lv in range(self.L + 1)}

    @property
    def eta(self) -> Dict[int, float]:
        return {lv: tr.noise_scales(1)[0] for lv, tr in self.trees.items()}

    def step(self, x: float, user: Any) -> float:
        lv, value = self._element(x, user)
        if lv is not None:
            self.trees[lv].step(value)
        return sum(tr.current() for tr in self.trees.values()) / self.N


# -- per-time-step baselines: same cap m, noise family and neighbour relation as Algorithm 6 --

def _resolve_noise(noise, delta, horizon, mechanism):
    if noise is None:
        noise = "laplace" if delta in (None, 0, 0.0) else "gaussian"
    if noise not in ("laplace", "gaussian"):
        raise ValueError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
    if noise == "gaussian":
        delta = positive_real("delta", delta, upper=1.0)
    elif delta not in (None, 0, 0.0):
        raise ValueError(f"delta must be None for Laplace noise (pure epsilon-DP), got {delta!r}")
    else:
        delta = None
    if mechanism is None:
        mechanism = default_mechanism(noise, horizon)
    return noise, delta, get_mechanism(mechanism), mechanism


def _counter(cls, noise, delta, epsilon_or_rho, sensitivity, horizon, source):
    """A continual counter at ε (Laplace) or exactly ρ (Gaussian, zCDP calibration)."""
    if noise == "laplace":
        return cls(epsilon=epsilon_or_rho, sensitivity=sensitivity, horizon=horizon, rng=source)
    return cls(epsilon=eps_from_rho_delta(epsilon_or_rho, delta), sensitivity=sensitivity,
               horizon=horizon, noise="gaussian", delta=delta, rng=source, calibration="zcdp")


def _counters_cost(trees, noise, delta):
    """Basic composition of the counters: the ε add (Laplace) or the ρ add (Gaussian, zCDP)."""
    if noise == "laplace":
        return Cost.laplace(sum(t.epsilon for t in trees))
    rho = sum(t.rho for t in trees)
    return Cost.gaussian(rho, delta, epsilon=eps_from_rho_delta(rho, delta))


class StepNaiveMean:
    """Algorithm 2 (M-10) stepped once per time step, for like-for-like comparisons.

    A continual counter over the steps takes each step's sum of the new
    samples (rescaled to [0, 1]; a user's samples past the cap m are dropped).
    A user's at most m samples each move the sum by at most 1, at any steps,
    so its per-step changes add up to ``Σ_t |δ_t| <= m``: the counter's
    sensitivity under ``"values"`` for Laplace (L1) and Gaussian (the
    counters' ``Σ_t ‖δ_t‖₂`` form) alike. The denominator N is public under
    ``"values"``. Under ``"participation"`` the samples are centred (x − ½,
    sensitivity m/2) and N is released by a second counter (sensitivity m);
    each gets ε/2 (Laplace) or ρ/2 (Gaussian, zCDP), and the estimate is
    ``½ + S̃/max(Ñ, 1)``. Same default mechanism rule as :class:`MeanParams`.

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> b = StepNaiveMean(0.0, 10.0, 4, 1.0, neighbours="values", horizon=3, rng=ZeroNoise())
    >>> [round(b.step([("a", 2.0), ("b", 4.0)]), 3), round(b.step([("a", 9.0)]), 3)]
    [3.0, 5.0]
    >>> b.privacy_cost()["epsilon"]
    1.0
    """

    def __init__(self, lower: float, upper: float, max_samples_per_user: int, epsilon: float, *,
                 neighbours: str = "participation", noise: Optional[str] = None,
                 delta: Optional[float] = None, horizon: Optional[int] = None,
                 mechanism: Optional[str] = None, rng: Any = None) -> None:
        self.lower, self.upper = rescale_setup(lower, upper, 1)
        self.m = positive_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = positive_real("epsilon", epsilon)
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
        self.neighbours = neighbours
        self.noise, self.delta, cls, self.mechanism = _resolve_noise(noise, delta, horizon, mechanism)
        self.source = make_noise(rng)
        budget = self.epsilon if self.noise == "laplace" else rho_from_eps_delta(self.epsilon, self.delta)
        if neighbours == "values":
            self.sum_tree = _counter(cls, self.noise, self.delta, budget, self.m, horizon, self.source)
            self.count_tree = None
        else:
            half = budget / 2
            self.sum_tree = _counter(cls, self.noise, self.delta, half, self.m / 2, horizon, self.source)
            self.count_tree = _counter(cls, self.noise, self.delta, half, self.m, horizon, self.source)
        self.counts = {}
        self.N = 0
        self.dropped = 0

    def step(self, samples: Iterable[Tuple[Any, float]] = ()) -> float:
        """Consume one step's ``(user, value)`` pairs; return the estimate in ``[lower, upper]`` units."""
        return self.release(*self.prepare(samples))

    def prepare(self, samples: Iterable[Tuple[Any, float]]) -> Tuple[float, int]:
        """The noise-free part of a step: cap, clamp, rescale; returns ``(sum in [0,1] units, count)``.

        Depends on the data only, so a benchmark can prepare a stream once and
        :meth:`release` it on fresh instances for each noise draw.
        """
        total, n = 0.0, 0
        R = float(self.upper[0] - self.lower[0])
        for user, value in samples:
            c = self.counts.get(user, 0)
            if c >= self.m:
                self.dropped += 1
                continue
            self.counts[user] = c + 1
            total += (min(max(float(value), self.lower[0]), self.upper[0]) - self.lower[0]) / R
            n += 1
        return total, n

    def release(self, total: float, n: int) -> float:
        """Feed one step's prepared ``(sum, count)`` to the counters; return the estimate."""
        R = float(self.upper[0] - self.lower[0])
        self.N += n
        if self.count_tree is None:
            s = float(np.ravel(self.sum_tree.step(total))[0])
            est01 = s / self.N if self.N else 0.5
        else:
            s = float(np.ravel(self.sum_tree.step(total - n / 2))[0])
            den = float(np.ravel(self.count_tree.step(float(n)))[0])
            est01 = 0.5 + s / max(den, 1.0)
        return float(self.lower[0] + R * est01)

    def privacy_cost(self) -> Cost:
        """The cost of the whole output sequence: the counters compose."""
        return _counters_cost([self.sum_tree] + ([self.count_tree] if self.count_tree is not None else []),
                              self.noise, self.delta)


def prior_truncation(max_users: int, max_samples_per_user: int, beta: float = 0.1,
                     tau: Optional[float] = None
                     ) -> Tuple[int, float, Dict[int, float], Dict[int, float]]:
    """Eq. (4) of Algorithms 4 and 5 (M-10): ``(E, τ, {ℓ: Δ_ℓ}, {ℓ: W_ℓ})`` for ℓ >= 1 (W_0 = 1).

    >>> E, tau, D, W = prior_truncation(1000, 16)
    >>> E, round(tau, 6), round(D[4], 4)
    (5, 0.627782, 12.1248)
    """
    n = positive_int("max_users", max_users)
    m = positive_int("max_samples_per_user", max_samples_per_user)
    L = m.bit_length() - 1
    E = L + 1
    lg = math.log(6 * n * E / positive_real("beta", beta, upper=1.0))
    tau = math.sqrt(lg / (2 * m)) if tau is None else float(tau)
    Delta = {lv: math.sqrt(element_size(lv) * lg / 2) + element_size(lv) * tau for lv in range(1, L + 1)}
    width = {0: 1.0, **{lv: 2 * d for lv, d in Delta.items()}}
    return E, tau, Delta, width


class StepPriorMean:
    """Algorithms 4 (``trees="single"``) and 5 (``trees="multi"``; M-10) with a given
    prior μ̃, stepped once per time step.

    The withhold-release schedule and the truncation Π_ℓ around 2^{ℓ−1}μ̃ of
    eq. (4) are the paper's. The element-indexed trees become continual
    counters over the time steps fed each step's sum of released
    (truncated) elements: a user still has at most E = L+1 elements, one per
    level. Algorithm 4: one counter, sensitivity ``E·W_max`` (eq. (5));
    Algorithm 5: one counter per level at ε/(L+1) (ρ/(L+1) with Gaussian
    noise), sensitivity ``W_ℓ`` (eq. (7)). The paper's neighbour relation
    (``"values"``): N is public. The prior is an input; its own privacy cost
    (the paper charges it separately) is not included in :meth:`privacy_cost`.

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> b = StepPriorMean(0.0, 1.0, 4, 1.0, prior=0.5, max_users=10, horizon=2, rng=ZeroNoise())
    >>> [round(b.step([("a", 0.2), ("a", 0.4)]), 3), round(b.step([("a", 0.6), ("a", 0.8)]), 3)]
    [0.3, 0.5]
    """

    def __init__(self, lower: float, upper: float, max_samples_per_user: int, epsilon: float, *,
                 prior: float, max_users: int, trees: str = "multi", beta: float = 0.1,
                 tau: Optional[float] = None, noise: Optional[str] = None,
                 delta: Optional[float] = None, horizon: Optional[int] = None,
                 mechanism: Optional[str] = None, rng: Any = None) -> None:
        if trees not in ("single", "multi"):
            raise ValueError(f"trees must be 'single' or 'multi', got {trees!r}")
        self.trees_kind = trees
        self.lower, self.upper = rescale_setup(lower, upper, 1)
        self.m = positive_int("max_samples_per_user", max_samples_per_user)
        self.epsilon = positive_real("epsilon", epsilon)
        self.L = self.m.bit_length() - 1
        R = float(self.upper[0] - self.lower[0])
        self.prior = min(max((float(prior) - self.lower[0]) / R, 0.0), 1.0)
        self.E, self.tau, self.Delta, self.width = prior_truncation(max_users, self.m, beta, tau)
        self.noise, self.delta, cls, self.mechanism = _resolve_noise(noise, delta, horizon, mechanism)
        self.source = make_noise(rng)
        budget = self.epsilon if self.noise == "laplace" else rho_from_eps_delta(self.epsilon, self.delta)
        if trees == "single":
            sens = self.E * max(self.width.values())
            self.trees = {"all": _counter(cls, self.noise, self.delta, budget, sens, horizon, self.source)}
        else:
            self.trees = {lv: _counter(cls, self.noise, self.delta, budget / self.E, self.width[lv],
                                       horizon, self.source) for lv in range(self.L + 1)}
        self.users = {}
        self.N = 0

    def step(self, samples: Iterable[Tuple[Any, float]] = ()) -> float:
        """Consume one step's ``(user, value)`` pairs; return the estimate in ``[lower, upper]`` units."""
        return self.release(*self.prepare(samples))

    def prepare(self, samples: Iterable[Tuple[Any, float]]) -> Tuple[Dict[Any, float], int]:
        """The noise-free part of a step (schedule, truncation): ``(per-tree sums, samples represented)``."""
        R = float(self.upper[0] - self.lower[0])
        sums = {key: 0.0 for key in self.trees}
        represented = 0
        for user, value in samples:
            st = self.users.setdefault(user, UserState())
            if st.count >= self.m:
                continue
            x = (min(max(float(value), self.lower[0]), self.upper[0]) - self.lower[0]) / R
            out = withhold_release(st, np.array([x]), self.L, 0)
            lv = out["level"]
            if lv is None:
                continue
            e = float(out["element"][0])
            if lv >= 1:
                c = element_size(lv) * self.prior
                e = min(max(e, c - self.Delta[lv]), c + self.Delta[lv])
            sums["all" if self.trees_kind == "single" else lv] += e
            represented += element_size(lv)
        return sums, represented

    def release(self, sums: Dict[Any, float], represented: int) -> float:
        """Feed one step's prepared sums to the counters; return the estimate."""
        R = float(self.upper[0] - self.lower[0])
        self.N += represented
        total = sum(float(np.ravel(self.trees[key].step(v))[0]) for key, v in sums.items())
        est01 = total / self.N if self.N else self.prior
        return float(self.lower[0] + R * est01)

    def privacy_cost(self) -> Cost:
        """The cost of the counters (the prior's own cost excluded, see above)."""
        return _counters_cost(list(self.trees.values()), self.noise, self.delta)
