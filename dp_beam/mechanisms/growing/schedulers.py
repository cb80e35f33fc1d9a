"""BBScheduler and BBImprover: static ε-DP black boxes re-run on a growing database.

``docs/privacy/growing.md`` G-3, G-4 (BBScheduler, Algorithm 1) and G-5
(BBImprover, Algorithm 2), seed 000 (Cummings et al., "Differential Privacy
for Growing Databases"). Time is the database size t (G-1, G-2, G-4): the database
x_t holds t records, x_{t+1} is x_t plus one record, and the sizes are public
(neighbouring streams *replace* the content of one record, G-1).

* :class:`BlackBox` is Definition 4: an ε-DP batch algorithm M(x, ε, α, β)
  that is α-accurate with probability 1 − β whenever
  ``|x| >= g·log(1/β)/(ε·α^p)``; concrete boxes live in
  :mod:`dp_beam.mechanisms.growing.boxes`.
* :class:`BBScheduler` runs the box once per epoch [t_i, t_{i+1}),
  t_i = ⌈n(1+γ)^i⌉ (exact, G-4), with the schedules of G-4 (derived by us
  with the paper's sums: its own were lost):
  pure DP ε_i = ε(1 − (1+γ)^{−1/2})(1+γ)^{−i/2} (Σ = ε), or (ε, δ) with
  ε_i = c√γ(1+γ)^{−(i+1)/2}, c = √(2ρ*) (Σε_i² = 2ρ*, Theorem 4), and
  β_i = β/2^{i+1}. Empty epochs (ceiling collisions) are skipped (G-4).
* :class:`BBImprover` runs it after every arrival with
  ε_t = √(2ρ*/Z)·t^{−(1+η)/2}, β_t = βn/(t(t+1)) (G-5).

Batched arrivals (a Beam step hands over many records at once, G-1): runs
that would happen *inside* a batch are never observed, since queries come
after the batch. They are skipped, and with ``pool=True`` (default) the one
run at the end of the batch spends their budget: Σε (pure) or √Σε² (zCDP) of
the skipped runs, and Σβ of their failure probabilities. Which runs are
pooled depends only on the public sizes, and the pooled total never exceeds
the schedule's, so :meth:`privacy_cost` holds for any batching. With one
record per call (:meth:`arrive`) nothing is pooled and the calls are exactly
those of the schedule.

>>> import numpy as np
>>> from dp_beam.mechanisms import ZeroNoise
>>> from dp_beam.mechanisms.growing.boxes import LaplaceHistogram
>>> sched = BBScheduler(LaplaceHistogram(4), epsilon=1.0, n=10, gamma=0.5, rng=ZeroNoise())
>>> runs = [sched.arrive(i % 4) for i in range(30)]
>>> [r.t for r in runs if r is not None]
[10, 15, 23]
>>> sched.answer(np.array([1.0, 0.0, 0.0, 0.0]))       # f(y) from the run at t = 23
0.2608695652173913
>>> sched.privacy_cost()["epsilon"]
1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..checks import check_int, check_probability, check_real
from ..noise import NoiseSource, RngLike, make_noise
from ..state import StateRecord, optional, state_field
from .common import EpochTimes, exact_gamma, growing_cost, rho_star

__all__ = ["BlackBox", "Run", "GrowingState", "BBSchedulerState", "BBSchedulerParams", "BBScheduler",
           "BBImproverParams", "BBImprover", "add_arrivals"]


class BlackBox:
    """Definition 4 (growing.md G-3): an ε-DP batch algorithm with a (p, g) accuracy profile.

    Subclasses set ``name``, ``p``, ``g``, ``universe_size`` and ``output_kind``
    (``"histogram"``: a distribution over the N cells; ``"model"``: a
    parameter vector) and implement :meth:`run`, which must be ε-DP for
    databases that differ in the cell of one record (replace-one, sizes
    public) for every α and β, and (α, β)-accurate for its query class when
    ``m >= g·log(1/β)/(ε·α^p)``. Every random choice goes through ``source``
    (a :class:`~dp_beam.mechanisms.noise.NoiseSource`).
    """

    name = "black_box"
    p: float = 1.0
    g: float = 1.0
    universe_size: int = 1
    output_kind = "histogram"

    def run(self, counts: np.ndarray, epsilon: float, alpha: float, beta: float,
            source: NoiseSource) -> Any:
        raise NotImplementedError

    def answer(self, output: Any, query: ArrayLike) -> float:
        """f(y) for a linear query f ∈ [0, 1]^N: post-processing of the output."""
        if self.output_kind != "histogram":
            raise ValueError(f"{self.name} releases a {self.output_kind}, not a histogram: "
                             "linear queries cannot be answered from it")
        return float(np.dot(np.asarray(query, dtype=np.float64), np.asarray(output)))

    def required_size(self, epsilon: float, alpha: float, beta: float) -> float:
        """g·log(1/β)/(ε·α^p): the size from which the box is (α, β)-accurate."""
        return self.g * math.log(1.0 / beta) / (epsilon * alpha ** self.p)

    def accuracy(self, m: float, epsilon: float, beta: float) -> float:
        """α_M(m, ε, β) = (g·log(1/β)/(ε·m))^{1/p} (the inverse form of G-3)."""
        return (self.g * math.log(1.0 / beta) / (epsilon * m)) ** (1.0 / self.p)

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, "p": self.p, "g": self.g, "N": self.universe_size,
                "output": self.output_kind}


def _output_from_state(output: Any) -> Any:
    # An array output was written as a list; anything else as it was.
    return np.asarray(output, dtype=np.float64) if isinstance(output, list) else output


@dataclass(frozen=True)
class Run(StateRecord):
    """One black-box run: ``t`` the snapshot size, ``t_epoch`` the epoch start (BBScheduler) or
    ``t`` (BBImprover), the run's (ε, β, α), its output, and ``pooled`` skipped runs.

    It is also the record of the latest run in a scheduler's state (:class:`GrowingState`)."""
    index: int
    epoch: int
    t: int
    t_epoch: int
    epsilon: float
    beta: float
    alpha: float
    output: Any = state_field(decode=_output_from_state, repr=False, compare=False)
    pooled: int = 1


@dataclass(frozen=True)
class GrowingState(StateRecord):
    """The state of a :class:`BBImprover` (and the start of a :class:`BBScheduler`'s): the
    PRIVATE counts, the size, the runs so far and the latest, the ledger, ``pool`` and the
    public schedule's parameters (their dict, as the constructor takes them)."""

    mechanism: str
    counts: Any
    t: int
    runs: int
    latest: Optional[Run] = state_field(decode=optional(Run.from_state))
    spent: Dict[str, float] = state_field()
    pool: bool = state_field()
    params: Dict[str, Any] = state_field()


@dataclass(frozen=True)
class BBSchedulerState(GrowingState):
    """The state of a :class:`BBScheduler`: that of :class:`GrowingState`, then the next epoch."""

    next_epoch: int


def add_arrivals(counts: np.ndarray, arrivals: Union[int, Mapping[int, int], ArrayLike]) -> int:
    """Adds arrivals to ``counts`` in place and returns how many: a cell index, a ``{cell: k}``
    mapping, or a length-N count vector (non-negative ints)."""
    n_cells = counts.shape[0]
    if isinstance(arrivals, dict):
        added = 0
        for cell, k in arrivals.items():
            cell, k = check_int("cell", cell, 0), check_int("count", k, 0)
            if cell >= n_cells:
                raise ValueError(f"cell must be < N = {n_cells}, got {cell}")
            counts[cell] += k
            added += k
        return added
    if np.ndim(arrivals) == 0:
        cell = check_int("cell", arrivals, 0)
        if cell >= n_cells:
            raise ValueError(f"cell must be < N = {n_cells}, got {cell}")
        counts[cell] += 1
        return 1
    vec = np.asarray(arrivals)
    if vec.shape != (n_cells,) or not np.issubdtype(vec.dtype, np.integer) or vec.min() < 0:
        raise ValueError(f"arrivals must be a cell, a {{cell: count}} dict or {n_cells} "
                         "non-negative int counts")
    counts += vec.astype(np.int64)
    return int(vec.sum())


def _dataclass_state(obj):
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass(frozen=True)
class BBSchedulerParams:
    """The public schedule of BBScheduler (growing.md G-4, G-3).

    ``gamma=None`` uses the γ we derived, γ = min(1, X0^{1/(p+2)}) (pure) or
    min(1, X0^{2/(2p+3)}) ((ε, δ)); any γ in (0, 1] may be given (G-4: privacy
    does not depend on it). γ is rounded down to 12 significant digits
    (:attr:`gamma`, exact as :attr:`gamma_exact`); :attr:`gamma_formula` is
    the unrounded value. ``schedule="alt_a"`` (pure DP only) is ALT-A,
    ε_i = εγ(1+γ)^{−(i+1)}, private but with accuracy degrading like
    (log(t/n)/γ)^{1/p} (G-4).

    >>> prm = BBSchedulerParams(epsilon=1.0, n=1000, p=3, g=1.0, gamma=0.1)
    >>> [round(prm.eps_i(i), 10) for i in range(2)], prm.epoch_time(2)
    ([0.0465374108, 0.0443716802], 1210)
    """
    epsilon: float
    n: int
    p: float
    g: float
    delta: float = 0.0
    beta: float = 0.05
    gamma: Optional[float] = None
    schedule: str = "sqrt"
    gamma_formula: float = field(init=False)
    gamma_exact: Fraction = field(init=False, repr=False)

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "epsilon", check_real("epsilon", self.epsilon, positive=True))
        set_(self, "n", check_int("n", self.n, 1))
        set_(self, "p", check_real("p", self.p, positive=True))
        set_(self, "g", check_real("g", self.g, positive=True))
        set_(self, "delta", check_real("delta", self.delta, nonnegative=True, below=1.0))
        set_(self, "beta", check_probability("beta", self.beta))
        if self.schedule not in ("sqrt", "alt_a"):
            raise ValueError(f"schedule must be 'sqrt' or 'alt_a', got {self.schedule!r}")
        if self.schedule == "alt_a" and self.delta > 0:
            raise ValueError("schedule='alt_a' is a pure-DP schedule: it needs delta=0")
        x0 = self.g * math.log(2.0 / self.beta) / (self.scale * self.n)
        exponent = 1.0 / (self.p + 2.0) if self.delta == 0 else 2.0 / (2.0 * self.p + 3.0)
        set_(self, "gamma_formula", min(1.0, x0 ** exponent))
        chosen = self.gamma_formula if self.gamma is None else check_real(
            "gamma", self.gamma, positive=True, at_most=1.0)
        set_(self, "gamma_exact", exact_gamma(chosen))
        set_(self, "gamma", float(self.gamma_exact))

    @property
    def scale(self) -> float:
        """ε (pure) or c = √(2ρ*) ((ε, δ)): the quantity X0 divides by."""
        return self.epsilon if self.delta == 0 else math.sqrt(2.0 * rho_star(self.epsilon, self.delta))

    @property
    def x0(self) -> float:
        return self.g * math.log(2.0 / self.beta) / (self.scale * self.n)

    def eps_i(self, i: int) -> float:
        g = self.gamma
        if self.delta > 0:
            return self.scale * math.sqrt(g) * (1.0 + g) ** (-(i + 1) / 2.0)
        if self.schedule == "alt_a":
            return self.epsilon * g * (1.0 + g) ** (-(i + 1))
        return self.epsilon * (1.0 - (1.0 + g) ** -0.5) * (1.0 + g) ** (-i / 2.0)

    def beta_i(self, i: int) -> float:
        return self.beta * 2.0 ** (-(i + 1))

    def epoch_time(self, i: int) -> int:
        return _epochs(self)(i)

    def alpha_i(self, i: int) -> float:
        """α_i = (g·log(1/β_i)/(ε_i·t_i))^{1/p}, the accuracy asked of the run of epoch i (G-3)."""
        return (self.g * math.log(1.0 / self.beta_i(i)) / (self.eps_i(i) * self.epoch_time(i))) \
            ** (1.0 / self.p)

    def theorem10_alpha(self) -> float:
        """(1 + 13.3^{1/p})·γ (pure) or (1 + 5.5^{1/p})·γ ((ε, δ)): Theorem 10's accuracy."""
        k = 13.3 if self.delta == 0 else 5.5
        return (1.0 + k ** (1.0 / self.p)) * self.gamma

    def privacy_cost(self) -> Cost:
        """Cost of the whole unbounded run: ε-DP (δ = 0; ρ = Σε_i²/2) or (ε, δ)-DP with ρ*-zCDP."""
        g = self.gamma
        if self.delta > 0:
            return growing_cost(self.epsilon, self.delta)
        if self.schedule == "alt_a":
            square_sum = self.epsilon ** 2 * g / (2.0 + g)
        else:
            a = (1.0 + g) ** -0.5
            square_sum = self.epsilon ** 2 * (1.0 - a) ** 2 / (1.0 - a * a)
        return growing_cost(self.epsilon, 0.0, square_sum)


_EPOCH_CACHE: Dict[tuple, EpochTimes] = {}


def _epochs(params: BBSchedulerParams) -> EpochTimes:
    key = (params.n, params.gamma_exact)
    hit = _EPOCH_CACHE.get(key)
    if hit is None:
        if len(_EPOCH_CACHE) > 64:
            _EPOCH_CACHE.clear()
        hit = _EPOCH_CACHE[key] = EpochTimes(params.n, params.gamma_exact)
    return hit


class _Growing:
    """Shared state of the two schedulers: the private counts, the size, the latest run."""

    name = "growing"

    def __init__(self, black_box: BlackBox, rng=None, pool: bool = True):
        if not isinstance(black_box, BlackBox):
            raise ValueError(f"black_box must be a dp_beam BlackBox, got {type(black_box).__name__}")
        if not isinstance(pool, bool):
            raise ValueError(f"pool must be True or False, got {pool!r}")
        self.box = black_box
        self.pool = pool
        self._source = make_noise(rng)
        self.counts = np.zeros(black_box.universe_size, dtype=np.int64)  # PRIVATE
        self.t = 0
        self.runs = 0
        self.latest: Optional[Run] = None
        self.spent = {"epsilon": 0.0, "square": 0.0, "beta": 0.0}

    def answer(self, query) -> Optional[float]:
        """f(y) from the latest run (``None`` before the first): free post-processing (G-4)."""
        if self.latest is None:
            return None
        return self.box.answer(self.latest.output, query)

    def _run(self, epoch, t_epoch, eps, beta, pooled):
        alpha = self.box.accuracy(t_epoch, eps, beta)
        output = self.box.run(self.counts.copy(), eps, alpha, beta, self._source)
        self.latest = Run(self.runs, epoch, self.t, t_epoch, eps, beta, alpha, output, pooled)
        self.runs += 1
        self.spent["epsilon"] += eps
        self.spent["square"] += eps * eps
        self.spent["beta"] += beta
        return self.latest

    def arrive(self, cell) -> Optional[Run]:
        """One arrival (the cell index of the new record); returns the run it triggers, if any."""
        return self.extend(cell)

    def extend(self, arrivals) -> Optional[Run]:
        """A batch of arrivals (cell, ``{cell: k}`` or count vector), then at most one run."""
        before = self.t
        self.t += add_arrivals(self.counts, arrivals)
        return self._after(before)

    def _state_fields(self) -> Dict[str, Any]:
        """The :class:`GrowingState` fields of this scheduler but its parameters."""
        return {"mechanism": self.name, "counts": self.counts, "t": self.t, "runs": self.runs,
                "latest": self.latest, "spent": self.spent, "pool": self.pool}

    def _load(self, record: GrowingState) -> None:
        self.counts = np.asarray(record.counts, dtype=np.int64)
        self.t = int(record.t)
        self.runs = int(record.runs)
        self.spent = dict(record.spent)
        if record.latest is not None:
            self.latest = record.latest


class BBScheduler(_Growing):
    """Algorithm 1 (growing.md G-4): one black-box run per non-empty epoch; queries answered from it.

    ``extend``/``arrive`` add records; when the size reaches the next epoch
    boundary t_i the box runs on the current database with (ε_i, β_i, α_i)
    and fresh randomness, and every later query until t_{i+1} is answered
    from its output (Lemma 11: the staleness error is at most γ/(1+γ)).
    :meth:`privacy_cost` is the cost of the whole unbounded run.
    """

    name = "bbscheduler"

    def __init__(self, black_box: BlackBox, *, epsilon: float, n: int, delta: float = 0.0,
                 beta: float = 0.05, gamma: Optional[float] = None, schedule: str = "sqrt",
                 pool: bool = True, rng: RngLike = None) -> None:
        super().__init__(black_box, rng, pool)
        self.params = BBSchedulerParams(epsilon=epsilon, n=n, p=black_box.p, g=black_box.g,
                                        delta=delta, beta=beta, gamma=gamma, schedule=schedule)
        self.next_epoch = 0  # index of the next epoch boundary not yet passed

    def _after(self, before):
        prm = self.params
        crossed = []
        while self.t >= prm.epoch_time(self.next_epoch):
            i = self.next_epoch
            if prm.epoch_time(i + 1) > prm.epoch_time(i):  # empty epochs are skipped (G-4)
                crossed.append(i)
            self.next_epoch += 1
        if not crossed:
            return None
        i = crossed[-1]
        if self.pool:
            eps_list = [prm.eps_i(j) for j in crossed]
            eps = sum(eps_list) if prm.delta == 0 else math.sqrt(sum(e * e for e in eps_list))
            beta = sum(prm.beta_i(j) for j in crossed)
        else:
            eps, beta = prm.eps_i(i), prm.beta_i(i)
        return self._run(i, prm.epoch_time(i), eps, beta, len(crossed) if self.pool else 1)

    def privacy_cost(self) -> Cost:
        return self.params.privacy_cost()

    def to_state(self) -> Dict[str, Any]:
        """Everything needed to continue (:class:`BBSchedulerState`; the counts are PRIVATE);
        γ is stored exactly (a Fraction), not rounded."""
        params = _dataclass_state(self.params)
        params.pop("gamma_formula")
        params.pop("gamma_exact")
        params["gamma"] = self.params.gamma_exact
        return BBSchedulerState(**self._state_fields(), params=params,
                                next_epoch=self.next_epoch).to_state()

    @classmethod
    def from_state(cls, state: Dict[str, Any], black_box: BlackBox,
                   rng: RngLike = None) -> "BBScheduler":
        """Rebuild from :meth:`to_state` output around ``black_box``; ``rng`` as the constructor's."""
        record = BBSchedulerState.from_state(state)
        prm = dict(record.params)
        prm["gamma"] = float(prm["gamma"])
        prm.pop("p"), prm.pop("g")
        self = cls(black_box, rng=rng, pool=record.pool, **prm)
        self._load(record)
        self.next_epoch = int(record.next_epoch)
        return self


@dataclass(frozen=True)
class BBImproverParams:
    """The public schedule of BBImprover (growing.md G-5).

    ``normaliser="bound"`` uses Z = n^{−(1+η)} + n^{−η}/η; ``"zeta"`` the exact
    Hurwitz zeta ζ(1+η, n) (tighter, still Σε_t² <= 2ρ*).

    >>> prm = BBImproverParams(epsilon=1.0, delta=1e-6, n=1000, p=1.0, g=1.0, eta=0.1)
    >>> round(prm.Z, 10), f"{prm.eps_t(1000):.9e}", f"{prm.beta_t(1000):.6e}"
    (5.0123735235, '1.869072393e-03', '4.995005e-05')
    """
    epsilon: float
    delta: float
    n: int
    p: float
    g: float
    beta: float = 0.05
    eta: float = 0.1
    normaliser: str = "bound"

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "epsilon", check_real("epsilon", self.epsilon, positive=True))
        set_(self, "delta", check_real("delta", self.delta, positive=True, below=math.exp(-1.0)))
        set_(self, "n", check_int("n", self.n, 1))
        set_(self, "p", check_real("p", self.p, positive=True))
        set_(self, "g", check_real("g", self.g, positive=True))
        set_(self, "beta", check_probability("beta", self.beta))
        set_(self, "eta", check_real("eta", self.eta, positive=True, at_most=1.0))
        if self.normaliser not in ("bound", "zeta"):
            raise ValueError(f"normaliser must be 'bound' or 'zeta', got {self.normaliser!r}")

    @property
    def rho(self) -> float:
        return rho_star(self.epsilon, self.delta)

    @property
    def Z(self) -> float:
        n, eta = self.n, self.eta
        if self.normaliser == "zeta":
            from scipy.special import zeta

            return float(zeta(1.0 + eta, n))
        return n ** (-(1.0 + eta)) + n ** (-eta) / eta

    def eps_t(self, t: int) -> float:
        return math.sqrt(2.0 * self.rho / self.Z) * t ** (-(1.0 + self.eta) / 2.0)

    def beta_t(self, t: int) -> float:
        return self.beta * self.n / (t * (t + 1.0))

    def alpha_t(self, t: int) -> float:
        return (self.g * math.log(1.0 / self.beta_t(t)) / (self.eps_t(t) * t)) ** (1.0 / self.p)

    def pooled(self, t0: int, t1: int) -> Tuple[float, float]:
        """(ε, β) of one run at t1 that spends the budget of the runs at sizes max(t0+1, n)..t1:
        ε = √Σε_τ² (zCDP adds), β = Σβ_τ (telescoping)."""
        lo = max(t0 + 1, self.n)
        if t1 < lo:
            raise ValueError(f"nothing to pool between {t0} and {t1}")
        if t1 - lo <= 10_000:
            square = math.fsum(self.eps_t(t) ** 2 for t in range(lo, t1 + 1))
        else:
            from scipy.special import zeta

            x = 1.0 + self.eta
            square = 2.0 * self.rho / self.Z * float(zeta(x, lo) - zeta(x, t1 + 1))
        beta = self.beta * self.n * (1.0 / lo - 1.0 / (t1 + 1.0))
        return math.sqrt(square), beta

    def theorem13_alpha(self, t: int) -> float:
        """Theorem 13's bound (2g√(L+ε)·log(2t²/(nβ))/(ε√η·n^{η/2}·t^{(1−η)/2}))^{1/p}."""
        L = math.log(1.0 / self.delta)
        num = 2.0 * self.g * math.sqrt(L + self.epsilon) * math.log(2.0 * t * t / (self.n * self.beta))
        den = self.epsilon * math.sqrt(self.eta) * self.n ** (self.eta / 2.0) * t ** ((1.0 - self.eta) / 2.0)
        return (num / den) ** (1.0 / self.p)

    def privacy_cost(self) -> Cost:
        """(ε, δ)-DP and ρ*-zCDP for the whole unbounded run (Σε_t² <= 2ρ*, Theorem 4)."""
        return growing_cost(self.epsilon, self.delta)


class BBImprover(_Growing):
    """Algorithm 2 (growing.md G-5): a fresh black-box run after every arrival, with shrinking ε_t.

    Needs 0 < δ < 1/e. Runs at every size t >= n (the first at t = n); a batch
    of arrivals makes one run at its end (pooled, see the module docstring).
    """

    name = "bbimprover"

    def __init__(self, black_box: BlackBox, *, epsilon: float, delta: float, n: int,
                 beta: float = 0.05, eta: float = 0.1, normaliser: str = "bound",
                 pool: bool = True, rng: RngLike = None) -> None:
        super().__init__(black_box, rng, pool)
        self.params = BBImproverParams(epsilon=epsilon, delta=delta, n=n, p=black_box.p,
                                       g=black_box.g, beta=beta, eta=eta, normaliser=normaliser)

    def _after(self, before):
        prm = self.params
        if self.t < prm.n or self.t == before:
            return None
        if self.pool:
            eps, beta = prm.pooled(before, self.t)
            pooled = self.t - max(before + 1, prm.n) + 1
        else:
            eps, beta, pooled = prm.eps_t(self.t), prm.beta_t(self.t), 1
        return self._run(self.t, self.t, eps, beta, pooled)

    def privacy_cost(self) -> Cost:
        return self.params.privacy_cost()

    def to_state(self) -> Dict[str, Any]:
        """Everything needed to continue (:class:`GrowingState`; the counts are PRIVATE)."""
        return GrowingState(**self._state_fields(), params=_dataclass_state(self.params)).to_state()

    @classmethod
    def from_state(cls, state: Dict[str, Any], black_box: BlackBox,
                   rng: RngLike = None) -> "BBImprover":
        """Rebuild from :meth:`to_state` output around ``black_box``; ``rng`` as the constructor's."""
        record = GrowingState.from_state(state)
        prm = dict(record.params)
        prm.pop("p"), prm.pop("g")
        self = cls(black_box, rng=rng, pool=record.pool, **prm)
        self._load(record)
        return self
