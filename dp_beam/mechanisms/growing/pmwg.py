"""PMWG: Private Multiplicative Weights for Growing databases (``docs/privacy/growing.md`` G-8).

Seed 000, Algorithm 3. A public histogram y over the N cells answers linear
queries f ∈ [0, 1]^N on the growing database x_t (time = size t):

* every arrival mixes y with the uniform distribution,
  y ← (t/(t+1))·y + 1/((t+1)N) (k arrivals at once: the closed form
  y ← (t/(t+k))·y + (k/(t+k))/N) — public, no privacy cost (G-8);
* every query runs one step of NSG (G-7) on h = |f(x_t) − f(y)| with threshold
  T: *easy* (⊥) answers f(y) exactly, from public y; *hard* (⊤) releases
  f(x_t) + Lap(m·ξ_t) and makes one multiplicative-weights step
  y_i ← y_i·exp(−η·r_i) with r = f if the answer is below f(y), else 1 − f;
* the hard-query count is capped by H_cap(t) = ⌊b·(1 + Σ_{τ=n+1}^{t} 1/τ)⌋
  (Corollary 16); the first hard query beyond it is a permanent ABORT (G-8);
* ξ_t = ξ_n·(n/t)^c, and the rescaled threshold noise a·ξ_t·Z (G-6).

:class:`PMWGParams` exposes every constant (G-8: T = 3α/4, α' = α/4,
η = α/4, b = log N/(η·gap − η²) = 16·log N/α², multipliers 2/4/2) and
*recomputes* ξ_n from them, so privacy holds for any configuration: pure
ξ_n = A1/(εn), A1 = C_n + C_e·b·(2−c)/(1−c); (ε, δ)
ξ_n = √(A2/(2ρ*))/n, A2 = D_n + D_e·b·(1 + 1/(2(1−c))) (G-8), each times
1 + 2^−38 for the grid rounding (:mod:`~dp_beam.mechanisms.growing.svt`).
A smaller ξ_n given by hand is refused. The query budget
Budget(t) = K·exp((λ/2)((t/n)^c − 1)) is an accuracy precondition only (G-9):
it is tracked, and enforced only on request.

Query entries are rounded to multiples of 2^−20 (public; counting queries
are unchanged) so that f(x_t) is computed exactly in integers.

Adaptive rounds (G-8): the rounds' costs depend on the data-dependent hard
times. Pure DP follows from the direct NSG argument (Theorem 29: the cost is a
non-increasing function of the public hard times, bounded almost surely
under the cap). For (ε, δ) the per-round ε_r are chosen adaptively with
Σε_r² <= A2/(nξ_n)² <= 2ρ* almost surely, which fully adaptive composition
(privacy filters: Rogers et al. 2016; the Rényi filter of Feldman & Zrnic
2021) turns into ρ*-zCDP and hence (ε, δ)-DP.

>>> import numpy as np
>>> from dp_beam.mechanisms import ZeroNoise
>>> prm = PMWGParams(epsilon=1.0, alpha=0.5, n=1000, universe_size=16, K=100)
>>> round(prm.b, 4), round(prm.A, 4), round(prm.xi_n_formula, 6), prm.h_cap(2000)
(177.4457, 799.5056, 0.799506, 300)
>>> pmwg = PMWG(prm, rng=ZeroNoise())                   # noise off: not private
>>> _ = pmwg.extend({0: 1000})                           # 1000 records, all in cell 0
>>> f = np.eye(16)[0]
>>> kinds = [pmwg.query(f).kind for _ in range(40)]      # f(y) = 1/16, f(x) = 1
>>> kinds.index("easy"), pmwg.hard, round(float(f @ pmwg.histogram), 3)   # MW steps until easy
(26, 26, 0.632)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any, Dict, Mapping, NamedTuple, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..checks import check_int, check_probability, check_real
from ..noise import NoiseSource, RngLike, make_noise
from ..state import StateRecord
from .common import as_query, growing_cost, harmonic_tail, rho_star
from .schedulers import add_arrivals
from .svt import NSG, GrowthNoise, nsg_coefficients

__all__ = ["PMWGParams", "PMWG", "PMWGAnswer", "PMWGState", "mix", "mw_update", "project_update",
           "relative_entropy", "QUERY_BITS", "XI_PAD"]

#: Query entries are multiples of 2^−QUERY_BITS.
QUERY_BITS = 20
#: ξ_n is multiplied by this to cover the 2^−40 grid rounding of every noised statistic.
XI_PAD = 1.0 + 2.0 ** -38


def mix(y: np.ndarray, t: int, k: int = 1) -> np.ndarray:
    """Uniform mixing for k arrivals at size t: (t/(t+k))·y + (k/(t+k))/N (G-8, batched form).

    >>> mix(np.array([0.7, 0.1, 0.1, 0.1]), 10).round(9).tolist()
    [0.659090909, 0.113636364, 0.113636364, 0.113636364]
    """
    if k == 0:
        return y
    return (t / (t + k)) * y + (k / (t + k)) / y.shape[0]


def mw_update(y: np.ndarray, f: np.ndarray, eta: float, down: bool) -> np.ndarray:
    """One MW step: y_i·exp(−η·r_i) renormalised, r = f (``down``: f(y) too high) or 1 − f.

    >>> y = np.array([0.7, 0.1, 0.1, 0.1]); f = np.array([1.0, 0, 0, 0])
    >>> mw_update(y, f, 0.05, True).round(9).tolist()[:2], mw_update(y, f, 0.05, False).round(9).tolist()[:2]
    ([0.689396171, 0.10353461], [0.710393896, 0.096535368])
    """
    r = f if down else 1.0 - f
    w = y * np.exp(-eta * r)
    return w / w.sum()


def project_update(y: np.ndarray, f: np.ndarray, target: float, down: bool,
                   eta_max: float = 20.0) -> np.ndarray:
    """The MW step whose η makes f(y') equal ``target`` (an I-projection along the MW path).

    Our extension, ``PMWGParams(update="project")``: η is found by bisection in
    [0, ``eta_max``] (f(y') is monotone in η); it depends only on the public y,
    f and the released answer, so it is post-processing like the fixed-η step.

    >>> y = np.array([0.25, 0.25, 0.25, 0.25]); f = np.array([1.0, 0, 0, 0])
    >>> round(float(f @ project_update(y, f, 0.5, down=False)), 9)
    0.5
    """
    r = f if down else 1.0 - f

    def value(eta):
        w = y * np.exp(-eta * r)
        return float(f @ w) / float(w.sum())

    if (value(eta_max) - target) * (1 if down else -1) >= 0:
        return mw_update(y, f, eta_max, down)
    lo, hi = 0.0, eta_max
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if (value(mid) - target) * (1 if down else -1) > 0:
            lo = mid
        else:
            hi = mid
    return mw_update(y, f, 0.5 * (lo + hi), down)


def relative_entropy(x: np.ndarray, y: np.ndarray) -> float:
    """RE(x‖y) = Σ x_i log(x_i/y_i) over x_i > 0 (the potential of G-8)."""
    mask = x > 0
    return float(np.sum(x[mask] * np.log(x[mask] / y[mask])))


@dataclass(frozen=True)
class PMWGParams:
    """Every public constant of PMWG, with the validator of G-8 (growing.md G-8).

    Required: ``epsilon``, ``alpha`` ∈ (0, 1], ``n`` (start size), ``universe_size``
    N. Optional: ``delta`` (0: pure DP), ``beta``, ``K`` (budget base), ``c`` ∈ [0, 1),
    the fractions of α for T, α' and η, the noise multipliers, ``cap_b`` (b
    by hand; default log N/(η·gap − η²)), ``xi_n`` (at least the recomputed
    value, else ``ValueError`` naming ``xi_n``) and ``update``: ``"mw"`` (the
    paper's fixed-η step) or ``"project"`` (our extension: the η that moves f(y) onto the
    released answer, :func:`project_update`; post-processing, so privacy is
    unchanged, but Theorem 19's accuracy argument does not cover it).
    """
    epsilon: float
    alpha: float
    n: int
    universe_size: int
    delta: float = 0.0
    beta: float = 0.05
    K: float = 1.0
    c: float = 0.5
    threshold_frac: float = 0.75
    accuracy_frac: float = 0.25
    eta_frac: float = 0.25
    threshold_noise: float = 2.0
    query_noise: float = 4.0
    numeric_noise: float = 2.0
    cap_b: Optional[float] = None
    xi_n: Optional[float] = None
    update: str = "mw"
    b: float = field(init=False)
    A: float = field(init=False)
    xi_n_formula: float = field(init=False)

    def __post_init__(self):
        s = object.__setattr__
        s(self, "epsilon", check_real("epsilon", self.epsilon, positive=True))
        s(self, "alpha", check_real("alpha", self.alpha, positive=True, at_most=1.0))
        s(self, "n", check_int("n", self.n, 1))
        s(self, "universe_size", check_int("universe_size", self.universe_size, 2))
        s(self, "delta", check_real("delta", self.delta, nonnegative=True, below=1.0))
        s(self, "beta", check_probability("beta", self.beta))
        s(self, "K", check_real("K", self.K, positive=True))
        s(self, "c", check_real("c", self.c, nonnegative=True, below=1.0))
        for name in ("threshold_frac", "accuracy_frac", "eta_frac", "threshold_noise",
                     "query_noise", "numeric_noise"):
            s(self, name, check_real(name, getattr(self, name), positive=True))
        if self.update not in ("mw", "project"):
            raise ValueError(f"update must be 'mw' or 'project', got {self.update!r}")
        if not self.threshold_frac > self.accuracy_frac:
            raise ValueError("threshold_frac must be > accuracy_frac (the gap T − α' must be "
                             f"positive), got {self.threshold_frac!r} <= {self.accuracy_frac!r}")
        if self.cap_b is None:
            progress = self.eta_mw * self.gap - self.eta_mw ** 2
            if not progress > 0:
                raise ValueError("eta_frac must be below the gap fraction threshold_frac − "
                                 f"accuracy_frac for MW progress, got eta_frac={self.eta_frac!r}")
            s(self, "b", math.log(self.universe_size) / progress)
        else:
            s(self, "b", check_real("cap_b", self.cap_b, positive=True))
        k = nsg_coefficients(self.threshold_noise, self.query_noise, self.numeric_noise)
        if self.delta == 0:
            s(self, "A", k["C_n"] + k["C_e"] * self.b * (2.0 - self.c) / (1.0 - self.c))
            s(self, "xi_n_formula", self.A / (self.epsilon * self.n))
        else:
            s(self, "A", k["D_n"] + k["D_e"] * self.b * (1.0 + 1.0 / (2.0 * (1.0 - self.c))))
            s(self, "xi_n_formula", math.sqrt(self.A / (2.0 * self.rho)) / self.n)
        required = self.xi_n_formula * XI_PAD
        if self.xi_n is None:
            s(self, "xi_n", required)
        else:
            given = check_real("xi_n", self.xi_n, positive=True)
            if given < required:
                raise ValueError(f"xi_n must be >= {required!r} (recomputed from the constants so "
                                 f"that the whole run is private), got {given!r}")
            s(self, "xi_n", given)

    @property
    def rho(self) -> float:
        return rho_star(self.epsilon, self.delta) if self.delta > 0 else 0.5 * self.epsilon ** 2

    @property
    def T(self) -> float:
        return self.threshold_frac * self.alpha

    @property
    def alpha_prime(self) -> float:
        return self.accuracy_frac * self.alpha

    @property
    def gap(self) -> float:
        return self.T - self.alpha_prime

    @property
    def eta_mw(self) -> float:
        return self.eta_frac * self.alpha

    @property
    def noise(self) -> GrowthNoise:
        return GrowthNoise(self.xi_n, self.n, self.c)

    def xi(self, t: int) -> float:
        return self.xi_n * (self.n / t) ** self.c

    def phi(self, t: int) -> float:
        return 1.0 / (t * self.xi(t))

    def h_cap(self, t: int) -> int:
        """H_cap(t) = ⌊b·(1 + Σ_{τ=n+1}^{t} 1/τ)⌋ (Corollary 16; public)."""
        return int(math.floor(self.b * (1.0 + harmonic_tail(self.n, t))))

    @property
    def lam(self) -> float:
        """λ = α'/(ξ_n·max(2·query, 2·threshold, numeric)) (= α/(32ξ_n) for the defaults)."""
        kappa = max(2.0 * self.query_noise, 2.0 * self.threshold_noise, self.numeric_noise)
        return self.alpha_prime / (kappa * self.xi_n)

    def budget(self, t: int) -> float:
        """Budget(t) = K·exp((λ/2)((t/n)^c − 1)): queries admissible up to t (G-9, accuracy only)."""
        return self.K * math.exp(min(700.0, (self.lam / 2.0) * ((t / self.n) ** self.c - 1.0)))

    def required_n(self) -> float:
        """The start size from which λ >= log(6K/β), i.e. Theorems 14/22/24 hold: n·log(6K/β)/λ."""
        return self.n * math.log(6.0 * self.K / self.beta) / self.lam

    def privacy_cost(self) -> Cost:
        """The whole unbounded run: ε-DP (ρ = ε²/2) or (ε, δ)-DP with ρ*-zCDP (G-8)."""
        return growing_cost(self.epsilon, self.delta)

    def worst_case_cost(self, t_max: int) -> Dict[str, float]:
        """The NSG ledger with every allowed hard query as early as possible, through t_max.

        ``epsilon``: C_n·φ(n) + C_e·Σ_t (H_cap(t) − H_cap(t−1))·φ(t) (must be <= ε);
        ``square``: D_n·φ(n)² + D_e·Σ_t ΔH_cap(t)·φ(t)² (must be <= 2ρ*).
        """
        k = nsg_coefficients(self.threshold_noise, self.query_noise, self.numeric_noise)
        t = np.arange(self.n, t_max + 1, dtype=np.float64)
        tail = np.concatenate([[0.0], np.cumsum(1.0 / t[1:])])
        caps = np.floor(self.b * (1.0 + tail))
        new = np.diff(np.concatenate([[0.0], caps]))
        phi = 1.0 / (t * self.xi_n * (self.n / t) ** self.c)
        return {"epsilon": k["C_n"] * phi[0] + k["C_e"] * float(np.dot(new, phi)),
                "square": k["D_n"] * phi[0] ** 2 + k["D_e"] * float(np.dot(new, phi ** 2))}

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


class PMWGAnswer(NamedTuple):
    """One answer: ``kind`` ``easy`` (``value`` = f(y), exact), ``hard`` (noisy f(x_t)),
    ``abort`` or ``refused`` (size below n, or over the enforced budget; ``value`` None).
    ``noise_std`` is the public std of a hard value, ``hard``/``cap`` the count and
    H_cap(t) after the query, ``within_budget`` whether the cumulative count is within
    Budget(t)."""
    kind: str
    value: Optional[float]
    t: int
    noise_std: float
    hard: int
    cap: int
    within_budget: bool


@dataclass(frozen=True)
class PMWGState(StateRecord):
    """The state of a :class:`PMWG`: name, parameters (their dict), the budget and clip
    options, the PRIVATE counts, the synthetic histogram y, the size, the queries answered and
    the state of its :class:`~.svt.NSG`."""

    mechanism: str
    params: Dict[str, Any]
    enforce_budget: bool
    clip: Any
    counts: Any
    y: Any
    t: int
    queries: int
    nsg: Dict[str, Any]


class PMWG:
    """Algorithm 3 (growing.md G-8): the public histogram, NSG's easy/hard test and MW updates.

    ``extend(arrivals)``/``arrive(cell)`` add records (PRIVATE counts) and mix
    y; ``query(f)`` answers a linear query (a vector in [0, 1]^N or a predicate
    on cell indices) on the current database; ``histogram`` is the public y.
    Before the size reaches n every query is ``refused``. ``enforce_budget``
    refuses queries beyond Budget(t) (free: the counts are public, G-9).
    """

    name = "pmwg"

    def __init__(self, params: PMWGParams, rng: RngLike = None, enforce_budget: bool = False,
                 clip: bool = False) -> None:
        if not isinstance(params, PMWGParams):
            raise ValueError(f"params must be a PMWGParams, got {type(params).__name__}")
        for name, value in (("enforce_budget", enforce_budget), ("clip", clip)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        self.params = params
        self.enforce_budget = enforce_budget
        self.clip = clip
        N = params.universe_size
        self.counts = np.zeros(N, dtype=np.int64)       # PRIVATE
        self.y = np.full(N, 1.0 / N)                   # public
        self.t = 0
        self.queries = 0
        self._nsg = NSG(params.T, params.noise, make_noise(rng), cap=params.h_cap,
                        threshold_noise=params.threshold_noise, query_noise=params.query_noise,
                        numeric_noise=params.numeric_noise)

    def __repr__(self):
        return f"PMWG(t={self.t}, hard={self.hard}, aborted={self.aborted}, queries={self.queries})"

    @property
    def hard(self) -> int:
        return self._nsg.hard

    @property
    def aborted(self) -> bool:
        return self._nsg.aborted

    @property
    def rounds(self) -> int:
        return self._nsg.rounds

    @property
    def histogram(self) -> np.ndarray:
        """The public histogram y (a copy): releasing it is free post-processing."""
        return self.y.copy()

    def arrive(self, cell: int) -> None:
        self.extend(cell)

    def extend(self, arrivals: Union[int, Mapping[int, int], ArrayLike]) -> int:
        """Adds arrivals and mixes y in closed form; returns the new size."""
        before = self.t
        self.t += add_arrivals(self.counts, arrivals)
        n = self.params.n
        if self.t > n:
            start = max(before, n)
            self.y = mix(self.y, start, self.t - start)
        return self.t

    def quantise(self, query: ArrayLike) -> np.ndarray:
        """The query as integers F with f = F·2^−20 (public rounding of the entries)."""
        f = as_query(query, self.params.universe_size)
        return np.rint(f * (1 << QUERY_BITS)).astype(np.int64)

    def query(self, query: ArrayLike) -> PMWGAnswer:
        prm = self.params
        t = self.t
        cap = prm.h_cap(t) if t >= prm.n else 0
        if t < prm.n:
            return PMWGAnswer("refused", None, t, 0.0, self.hard, cap, True)
        self.queries += 1
        within = self.queries <= prm.budget(t)
        if self.enforce_budget and not within:
            self.queries -= 1
            return PMWGAnswer("refused", None, t, 0.0, self.hard, cap, False)
        F = self.quantise(query)
        f = F / float(1 << QUERY_BITS)
        fy = float(f @ self.y)
        fx = Fraction(int(F @ self.counts), t << QUERY_BITS)       # exact, PRIVATE
        h = abs(fx - Fraction(fy))
        out = self._nsg.step(h, t, numeric=fx)
        if out.kind == "easy":
            return PMWGAnswer("easy", fy, t, 0.0, self.hard, cap, within)
        if out.kind == "abort":
            return PMWGAnswer("abort", None, t, 0.0, self.hard, cap, within)
        a = out.numeric
        if prm.update == "project":
            self.y = project_update(self.y, f, min(1.0, max(0.0, a)), down=a < fy)
        else:
            self.y = mw_update(self.y, f, prm.eta_mw, down=a < fy)
        value = min(1.0, max(0.0, a)) if self.clip else a
        return PMWGAnswer("hard", value, t, self._nsg.noise_std(t), self.hard, cap, within)

    def noise_std(self, t: int) -> float:
        """Public std √2·m·ξ_t of a hard answer at size t."""
        return self._nsg.noise_std(t)

    def privacy_cost(self) -> Cost:
        return self.params.privacy_cost()

    def spent(self) -> Dict[str, float]:
        """The realised ledger so far: pure ε units and the Σε² of the zCDP accounting."""
        return {"epsilon": self._nsg.spent(), "square": self._nsg.spent_square()}

    @property
    def source(self) -> NoiseSource:
        return self._nsg.source

    def to_state(self) -> Dict[str, Any]:
        """Everything needed to continue (:class:`PMWGState`; includes the PRIVATE counts and
        the SECRET Z: Beam state only, never a release)."""
        return PMWGState(self.name, self.params.to_dict(), self.enforce_budget, self.clip,
                         self.counts, self.y, self.t, self.queries, self._nsg.to_state()).to_state()

    @classmethod
    def from_state(cls, state: Dict[str, Any], rng: RngLike = None) -> "PMWG":
        """Rebuild from :meth:`to_state` output; ``rng`` as the constructor's."""
        record = PMWGState.from_state(state)
        self = cls(PMWGParams(**record.params), rng=rng, enforce_budget=record.enforce_budget,
                   clip=record.clip)
        self.counts = np.asarray(record.counts, dtype=np.int64)
        self.y = np.asarray(record.y, dtype=np.float64)
        self.t, self.queries = int(record.t), int(record.queries)
        self._nsg.load_state(record.nsg)
        return self
