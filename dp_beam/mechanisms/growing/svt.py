"""The growing sparse-vector family: ATG, NATG, NSG and LaplaceG (``docs/privacy/growing.md`` G-6, G-7, G-10).

Seed 000, Appendix C. Queries arrive while the database grows; at size t a
query has sensitivity Δ_t (1/t for a linear query on the normalised
histogram) and is compared with noise scaled by a decaying noise function
ξ_t (:class:`GrowthNoise`, ξ_t = ξ_n·(n/t)^c). The hypotheses of G-6, G-7, G-10 hold for
c ∈ [0, 1]: ξ_t is non-increasing and φ(t) = Δ_t/ξ_t is non-increasing.

**The threshold noise is rescaled (G-6, [DEVIATION], privacy-critical).** A
round draws one Z ~ Lap(1) at its first query (time s) and compares each query
at time t with T + a·ξ_t·Z; the literal paper's single Lap(2ξ_s) threshold is
unsafe when ξ_t decays (growing.md G-6) and is not offered. The rescaled rule is
standard AboveThreshold on the normalised queries (q − T)/ξ_t, whose
sensitivity is at most φ(s).

Noise multipliers (defaults, growing.md G-6, G-7): threshold a = 2, query b = 4,
numeric m = 2. The costs (Theorems 25, 27, 29, in units of φ):

* ATG round halting at e: (1/a + 1/b)·φ(s) + (1/b)·φ(e)  (= ¾φ(s) + ¼φ(e));
* NATG: plus φ(e)/m  (= ¾φ(s) + ¾φ(e));
* NSG over a transcript with hard queries at e_1 <= e_2 <= …, the final
  (possibly aborted) round included: C_n·φ(n) + C_e·Σφ(e_i), C_n = 1/a + 2/b,
  C_e = 1/a + 2/b + 1/m (= φ(n) + 1.5·Σφ(e_i), Corollary 30);
  :func:`nsg_privacy_cost`.

Exactness: each statistic is rounded to the grid 2^e, e = ⌊log2 Δ_t⌋ − 40, and
noised with an exact discrete Laplace on that grid (``integer_noise`` of the
injected source); Z lives on the grid 2^−100. Comparisons are made in exact
rational arithmetic, and the released numeric value is a function of the
noisy integer alone. Rounding adds at most 2^−40·Δ_t to the sensitivity,
which the callers' calibration covers (PMWG pads ξ_n by 1 + 2^−38).

The secret Z is kept in the mechanism's state (as sensitive as the data,
like every exact statistic in Beam state) and is never part of a release,
a repr or a log line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Dict, Iterable, NamedTuple, Optional

from ...accounting.cost import Cost
from ..checks import check_int, check_real
from ..noise import NoiseSource, RngLike, make_noise
from ..state import StateRecord, optional, state_field
from .common import fine_grid_exponent, grid_laplace_exact, growing_cost, rho_star

__all__ = ["GrowthNoise", "SVTAnswer", "ATG", "NATG", "NSG", "NSGRoundState", "NSGState", "LaplaceG",
           "nsg_privacy_cost", "nsg_coefficients", "Z_EXPONENT"]

#: Z ~ Lap(1) is drawn on the grid 2^Z_EXPONENT.
Z_EXPONENT = -100


@dataclass(frozen=True)
class GrowthNoise:
    """ξ_t = ξ_n·(n/t)^c and Δ_t = sensitivity/t, φ(t) = Δ_t/ξ_t (growing.md G-6, G-7, G-10, G-8).

    >>> noise = GrowthNoise(xi_n=0.8, n=1000)
    >>> noise.xi(4000), round(noise.phi(1000), 6), noise.phi(4000) < noise.phi(1000)
    (0.4, 0.00125, True)
    """
    xi_n: float
    n: int
    c: float = 0.5
    sensitivity: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "xi_n", check_real("xi_n", self.xi_n, positive=True))
        object.__setattr__(self, "n", check_int("n", self.n, 1))
        object.__setattr__(self, "c", check_real("c", self.c, nonnegative=True, at_most=1.0))
        object.__setattr__(self, "sensitivity", check_real("sensitivity", self.sensitivity, positive=True))

    def xi(self, t: int) -> float:
        if t < self.n:
            raise ValueError(f"t must be >= n = {self.n}, got {t}")
        return self.xi_n * (self.n / t) ** self.c

    def delta(self, t: int) -> float:
        return self.sensitivity / t

    def phi(self, t: int) -> float:
        return self.delta(t) / self.xi(t)


def nsg_coefficients(threshold_noise: float = 2.0, query_noise: float = 4.0,
                     numeric_noise: float = 2.0) -> Dict[str, float]:
    """The NSG cost coefficients: pure (C_n, C_e) and square-sum (D_n, D_e) (module docstring).

    >>> nsg_coefficients()
    {'C_n': 1.0, 'C_e': 1.5, 'D_n': 1.0, 'D_e': 1.25}
    """
    a, b, m = threshold_noise, query_noise, numeric_noise
    start = 1.0 / a + 1.0 / b
    round_bound = start + 1.0 / b
    return {"C_n": round_bound, "C_e": round_bound + 1.0 / m,
            "D_n": round_bound ** 2, "D_e": round_bound ** 2 + 1.0 / m ** 2}


def nsg_privacy_cost(hard_times: Iterable[int], noise: GrowthNoise, threshold_noise: float = 2.0,
                     query_noise: float = 4.0, numeric_noise: float = 2.0) -> float:
    """ε of an NSG transcript with hard queries at ``hard_times``: C_n·φ(n) + C_e·Σφ(e_i) (Thm 29).

    >>> noise = GrowthNoise(xi_n=1.0, n=100)
    >>> round(nsg_privacy_cost([100, 400], noise), 12) == round(0.01 + 1.5 * (0.01 + 0.005), 12)
    True
    """
    k = nsg_coefficients(threshold_noise, query_noise, numeric_noise)
    return k["C_n"] * noise.phi(noise.n) + k["C_e"] * sum(noise.phi(int(e)) for e in hard_times)


def _exact(value) -> Fraction:
    if isinstance(value, Fraction):
        return value
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"query value must be finite, got {value!r}")
    return Fraction(value)


class SVTAnswer(NamedTuple):
    """``kind`` is ``"easy"`` (⊥), ``"hard"`` (⊤) or ``"abort"``; ``numeric`` the noisy value on a
    hard query of NATG/NSG (``None`` otherwise); ``t`` the time of the query."""
    kind: str
    numeric: Optional[float]
    t: int


class ATG:
    """AboveThreshold for Growing databases, one round (growing.md G-6, Theorem 25).

    ``step(value, t)``: the round starts at its first query (Z ~ Lap(1) drawn
    then); the query value at time t is rounded to its grid and compared with
    ``T + a·ξ_t·Z`` after adding ν ~ Lap(b·ξ_t). ⊤ (True) halts the round; a
    halted round refuses further queries (:class:`NSG` starts a new one).

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> atg = ATG(threshold=0.5, noise=GrowthNoise(xi_n=0.1, n=10), rng=ZeroNoise())
    >>> [atg.step(v, 10 + i) for i, v in enumerate([0.1, 0.2, 0.7])], atg.halted
    ([False, False, True], True)
    """

    def __init__(self, threshold: float, noise: GrowthNoise, rng: RngLike = None,
                 threshold_noise: float = 2.0, query_noise: float = 4.0) -> None:
        self.threshold = check_real("threshold", threshold)
        if not isinstance(noise, GrowthNoise):
            raise ValueError(f"noise must be a GrowthNoise, got {type(noise).__name__}")
        self.noise = noise
        self.threshold_noise = check_real("threshold_noise", threshold_noise, positive=True)
        self.query_noise = check_real("query_noise", query_noise, positive=True)
        self._source = make_noise(rng)
        self._z: Optional[Fraction] = None      # SECRET: never released, logged or shown
        self.start: Optional[int] = None
        self.halted = False

    def __repr__(self):
        return (f"{type(self).__name__}(threshold={self.threshold!r}, noise={self.noise!r}, "
                f"start={self.start!r}, halted={self.halted!r})")

    def _test(self, value, t: int):
        """(⊤?, the query's grid exponent)."""
        if self.halted:
            raise RuntimeError("this ATG round has halted; start a new one")
        t = check_int("t", t, self.noise.n)
        if self.start is not None and t < self.start:
            raise ValueError(f"t must not decrease: the round started at {self.start}, got {t}")
        if self._z is None:
            self.start = t
            self._z = grid_laplace_exact(self._source, 1.0, Z_EXPONENT)
        xi = self.noise.xi(t)
        e = fine_grid_exponent(self.noise.delta(t))
        v = _round_fraction(_exact(value), e)
        nu = grid_laplace_exact(self._source, self.query_noise * xi, e)
        bar = Fraction(self.threshold) + Fraction(self.threshold_noise) * Fraction(xi) * self._z
        top = v + nu >= bar
        if top:
            self.halted = True
        return top, e

    def step(self, value: float, t: int) -> bool:
        return self._test(value, t)[0]

    def privacy_cost(self, halt_time: Optional[int]) -> float:
        """Theorem 25: (1/a + 1/b)φ(s) + φ(e)/b for a round halting at e; φ(s)/a if it never halts."""
        if self.start is None:
            return 0.0
        a, b = self.threshold_noise, self.query_noise
        if halt_time is None:
            return self.noise.phi(self.start) / a
        return (1 / a + 1 / b) * self.noise.phi(self.start) + self.noise.phi(halt_time) / b


def _round_fraction(value: Fraction, exponent: int) -> Fraction:
    unit = Fraction(2) ** exponent
    return round(value / unit) * unit


class NATG(ATG):
    """Numeric AboveThreshold for Growing databases (growing.md G-7, Theorem 27).

    On ⊤ at time e also releases ``numeric(x_e) + Lap(m·ξ_e)`` (``numeric``
    defaults to the tested value; PMWG tests |f(x) − f(y)| and releases f(x),
    G-7). ``step`` returns the numeric value on ⊤ and ``None`` on ⊥.
    """

    def __init__(self, threshold: float, noise: GrowthNoise, rng: RngLike = None,
                 threshold_noise: float = 2.0, query_noise: float = 4.0,
                 numeric_noise: float = 2.0) -> None:
        super().__init__(threshold, noise, rng, threshold_noise, query_noise)
        self.numeric_noise = check_real("numeric_noise", numeric_noise, positive=True)

    def step(self, value: float, t: int, numeric: Optional[float] = None) -> Optional[float]:
        top, e = self._test(value, t)
        if not top:
            return None
        return self._numeric(value if numeric is None else numeric, t, e)

    def _numeric(self, value, t, e) -> float:
        v = _round_fraction(_exact(value), e)
        return float(v + grid_laplace_exact(self._source, self.numeric_noise * self.noise.xi(t), e))

    def noise_std(self, t: int) -> float:
        """Standard deviation √2·m·ξ_t of a numeric answer at time t (public)."""
        return math.sqrt(2.0) * self.numeric_noise * self.noise.xi(t)

    def privacy_cost(self, halt_time: Optional[int]) -> float:
        """Theorem 27: the ATG cost plus φ(e)/m for the numeric answer at the halting time e."""
        cost = super().privacy_cost(halt_time)
        if halt_time is not None:
            cost += self.noise.phi(halt_time) / self.numeric_noise
        return cost


def _fraction_from_state(z: Any) -> Fraction:
    return Fraction(*z)


@dataclass(frozen=True)
class NSGRoundState(StateRecord):
    """The open round of an :class:`NSG`: its start, whether it halted, and its SECRET
    threshold noise Z as ``(numerator, denominator)`` (None before it is drawn)."""

    start: Any
    halted: bool
    z: Optional[Any] = state_field(decode=optional(_fraction_from_state))


@dataclass(frozen=True)
class NSGState(StateRecord):
    """The state of an :class:`NSG`: the hard queries, rounds, abort flag and the realised
    cost sums (Σφ, Σφ²), then the open round."""

    hard: int
    rounds: int
    aborted: bool
    sum_phi: float
    sum_phi_square: float
    round: NSGRoundState = state_field(decode=NSGRoundState.from_state)


class NSG:
    """NumericSparse for Growing databases (growing.md G-7, Theorems 29, 31): NATG rounds forever.

    ``step(value, t, numeric=None)`` answers one query: ``easy`` (⊥),
    ``hard`` with the noisy numeric value, or ``abort`` when a hard query would
    exceed ``cap(t)`` (G-8: permanent, nothing numeric is released; every
    later query is ``abort``). A new round, with a fresh secret Z, starts at
    the query after each ⊤. :meth:`spent` is the realised cost
    C_n·φ(n) + C_e·Σφ(e_i) (Corollary 30) and :meth:`spent_square` its
    square-sum counterpart (Lemma 23). The cost of the whole unbounded run is
    finite only under a cap on the hard queries; PMWG's is
    :meth:`~dp_beam.mechanisms.growing.PMWGParams.privacy_cost`.
    """

    def __init__(self, threshold: float, noise: GrowthNoise, rng: RngLike = None,
                 cap: Optional[Callable[[int], int]] = None, threshold_noise: float = 2.0,
                 query_noise: float = 4.0, numeric_noise: float = 2.0) -> None:
        self._round = NATG(threshold, noise, rng, threshold_noise, query_noise, numeric_noise)
        self._round.halted = True   # the first query starts a round
        self.cap = cap
        self.noise = noise
        self.hard = 0
        self.rounds = 0
        self.aborted = False
        self.sum_phi = 0.0
        self.sum_phi_square = 0.0
        self._k = nsg_coefficients(threshold_noise, query_noise, numeric_noise)

    def __repr__(self):
        return (f"NSG(noise={self.noise!r}, hard={self.hard}, rounds={self.rounds}, "
                f"aborted={self.aborted})")

    @property
    def source(self) -> NoiseSource:
        return self._round._source

    @source.setter
    def source(self, value: NoiseSource) -> None:
        self._round._source = value

    def step(self, value: float, t: int, numeric: Optional[float] = None) -> SVTAnswer:
        if self.aborted:
            return SVTAnswer("abort", None, t)
        r = self._round
        if r.halted:
            r.halted, r._z, r.start = False, None, None
            self.rounds += 1
        top, e = r._test(value, t)
        if not top:
            return SVTAnswer("easy", None, t)
        phi = self.noise.phi(t)
        if self.cap is not None and self.hard + 1 > self.cap(t):
            self.aborted = True
            return SVTAnswer("abort", None, t)
        self.hard += 1
        self.sum_phi += phi
        self.sum_phi_square += phi * phi
        return SVTAnswer("hard", r._numeric(value if numeric is None else numeric, t, e), t)

    def noise_std(self, t: int) -> float:
        return self._round.noise_std(t)

    def spent(self) -> float:
        """Realised pure-DP cost C_n·φ(n) + C_e·Σφ(e_i) of the transcript so far."""
        return self._k["C_n"] * self.noise.phi(self.noise.n) + self._k["C_e"] * self.sum_phi

    def spent_square(self) -> float:
        """Realised Σε_r² bound D_n·φ(n)² + D_e·Σφ(e_i)² (for the zCDP ledger)."""
        return self._k["D_n"] * self.noise.phi(self.noise.n) ** 2 + self._k["D_e"] * self.sum_phi_square

    def to_state(self) -> Dict:
        """Everything needed to continue (:class:`NSGState`; Z is SECRET: Beam state only)."""
        r = self._round
        z = None if r._z is None else (r._z.numerator, r._z.denominator)
        return NSGState(self.hard, self.rounds, self.aborted, self.sum_phi, self.sum_phi_square,
                        NSGRoundState(r.start, r.halted, z)).to_state()

    def load_state(self, state: Dict) -> None:
        """Continue from :meth:`to_state` output (the noise source is kept)."""
        record = NSGState.from_state(state)
        self.hard, self.rounds = int(record.hard), int(record.rounds)
        self.aborted = bool(record.aborted)
        self.sum_phi, self.sum_phi_square = float(record.sum_phi), float(record.sum_phi_square)
        r = record.round
        self._round.start, self._round.halted = r.start, bool(r.halted)
        self._round._z = r.z


class LaplaceG:
    """The growing Laplace mechanism (growing.md G-10; derived by us): q(x_t) + Lap(Δ_t/ε_j) per query.

    ``schedule="time"``: the j-th query at time t (j < ``per_time``) gets
    ε_t/per_time with a summable ε_t: pure ε·t^{−(1+η)}/Z, or (δ > 0)
    √(2ρ*/Z)·t^{−(1+η)/2} (Theorem 4), Z = n^{−(1+η)} + n^{−η}/η.
    ``schedule="queries"``: at most ``max_queries`` queries in all, each ε/K
    (pure) or √(2ρ*/K) ((ε, δ)): the naive baseline. A query beyond the
    schedule's allowance returns ``None`` (free: the counts are public).

    >>> from dp_beam.mechanisms import ZeroNoise
    >>> lap = LaplaceG(epsilon=1.0, n=100, schedule="queries", max_queries=2, rng=ZeroNoise())
    >>> lap.answer(0.25, 100), lap.answer(0.5, 120), lap.answer(0.5, 130)
    (0.25, 0.5, None)
    """

    def __init__(self, epsilon: float, n: int, delta: float = 0.0, eta: float = 0.1,
                 schedule: str = "time", per_time: int = 1, max_queries: Optional[int] = None,
                 sensitivity: float = 1.0, rng: RngLike = None) -> None:
        self.epsilon = check_real("epsilon", epsilon, positive=True)
        self.n = check_int("n", n, 1)
        self.delta = check_real("delta", delta, nonnegative=True, below=1.0)
        self.eta = check_real("eta", eta, positive=True, at_most=1.0)
        if schedule not in ("time", "queries"):
            raise ValueError(f"schedule must be 'time' or 'queries', got {schedule!r}")
        self.schedule = schedule
        self.per_time = check_int("per_time", per_time, 1)
        if schedule == "queries":
            self.max_queries = check_int("max_queries", max_queries, 1)
        elif max_queries is not None:
            raise ValueError("max_queries applies only with schedule='queries'")
        else:
            self.max_queries = None
        self.sensitivity = check_real("sensitivity", sensitivity, positive=True)
        self._source = make_noise(rng)
        self.answered = 0
        self._at = (None, 0)   # (time, queries answered at it)

    @property
    def Z(self) -> float:
        return self.n ** (-(1.0 + self.eta)) + self.n ** (-self.eta) / self.eta

    def eps_query(self, t: int) -> float:
        """ε of one query at time t under the schedule (public)."""
        if self.schedule == "queries":
            if self.delta > 0:
                return math.sqrt(2.0 * rho_star(self.epsilon, self.delta) / self.max_queries)
            return self.epsilon / self.max_queries
        if self.delta > 0:
            eps_t = math.sqrt(2.0 * rho_star(self.epsilon, self.delta) / self.Z) * t ** (-(1 + self.eta) / 2)
        else:
            eps_t = self.epsilon * t ** (-(1.0 + self.eta)) / self.Z
        return eps_t / self.per_time

    def scale(self, t: int) -> float:
        """Laplace scale Δ_t·(1 + 2^−39)/ε_query (the pad covers the rounding to the grid)."""
        return self.sensitivity / t * (1.0 + 2.0 ** -39) / self.eps_query(t)

    def noise_std(self, t: int) -> float:
        return math.sqrt(2.0) * self.scale(t)

    def answer(self, value: float, t: int) -> Optional[float]:
        t = check_int("t", t, self.n)
        if self.schedule == "queries":
            if self.answered >= self.max_queries:
                return None
        else:
            at, used = self._at
            if at is not None and t < at:
                raise ValueError(f"t must not decrease, got {t} after {at}")
            used = used if at == t else 0
            if used >= self.per_time:
                return None
            self._at = (t, used + 1)
        self.answered += 1
        e = fine_grid_exponent(self.sensitivity / t)
        v = _round_fraction(_exact(value), e)
        return float(v + grid_laplace_exact(self._source, self.scale(t), e))

    def privacy_cost(self) -> Cost:
        """The whole unbounded run: ε-DP (Σε_j <= ε) or (ε, δ)-DP with ρ*-zCDP (Σε_j² <= 2ρ*)."""
        return growing_cost(self.epsilon, self.delta)
