"""Black boxes for BBScheduler and BBImprover (``docs/privacy/growing.md`` G-3).

Each is an ε-DP batch algorithm over a histogram of counts (the database x as
a count vector over the N cells of the universe) with a stated (p, g)
accuracy profile (Definition 4): with probability 1 − β its output y answers
every query of its class within α once ``m >= g·log(1/β)/(ε·α^p)``.
Neighbouring databases have the same size and differ in the cell of one
record (replace-one, G-1), so a count vector moves by 1 in two cells.

* :class:`LaplaceHistogram`: Laplace noise on every count (L1 sensitivity 2),
  clipped and renormalised; (p, g) = (1, 4N(1 + log N)) for all linear
  queries. Small universes.
* :class:`SmallDB` (G-3, BLR08 / DR14 Thm 4.5): the exact exponential
  mechanism over all multisets of size m = ⌈4·log k/α²⌉ (k queries);
  (p, g) = (3, 20·log N·log k). Exponential time: tiny universes only.
* :class:`MWEMHistogram`: MWEM (Hardt, Ligett & McSherry 2012) over a finite
  class of k linear queries, the practical synthetic-histogram box for
  universes up to ~10^4 cells; (p, g) = (3, 320·log N·(1 + log(k·T_max))) with
  ``rounds="theory"``.
* :class:`ERMBox` (G-3): the project's output-perturbation logistic
  regression (:class:`~dp_beam.mechanisms.erm.OutputPerturbation`, L2-Laplace
  noise, pure ε) on the database's points; with BBImprover this is ERMG.
  (p, g) = (½, √(β_s/2)·(2L/λ)·(2d·ln 2 + 3)) for the excess regularised
  empirical risk.

>>> import numpy as np
>>> from dp_beam.mechanisms import ZeroNoise
>>> box = SmallDB(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [1, 1, 0, 0]]), 4)
>>> box.p, round(box.g, 4), box.size_for(0.5)
(3.0, 30.46, 18)
>>> y = box.run(np.array([3, 1, 0, 0]), epsilon=1.0, alpha=1.0, beta=0.05, source=ZeroNoise())
>>> (y * box.size_for(1.0)).round(6).tolist()       # noise off: the best multiset of size 5
[4.0, 1.0, 0.0, 0.0]
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, Sequence, Union

import numpy as np
from numpy.typing import ArrayLike

from ..checks import check_int, check_real
from ..continual_mean import exponential_mechanism
from ..erm import LogisticLoss, OutputPerturbation
from ..noise import NoiseSource
from ..noise_grid import grid_padded_scale, round_to_grid
from .schedulers import BlackBox

__all__ = ["LaplaceHistogram", "SmallDB", "MWEMHistogram", "ERMBox", "query_matrix"]


def query_matrix(queries: ArrayLike, universe_size: int) -> Any:
    """A k×N matrix of linear queries in [0, 1] (dense array or scipy.sparse), validated."""
    try:
        import scipy.sparse as sp
        if sp.issparse(queries):
            q = sp.csr_matrix(queries, dtype=np.float64)
            data = q.data
        else:
            q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
            data = q
    except (TypeError, ValueError):
        raise ValueError("queries must be a k x N matrix of numbers in [0, 1]") from None
    if q.ndim != 2 or q.shape[1] != universe_size or q.shape[0] < 1:
        raise ValueError(f"queries must have shape (k, {universe_size}) with k >= 1, got {q.shape}")
    if data.size and (not np.all(np.isfinite(data)) or data.min() < 0 or data.max() > 1):
        raise ValueError("queries must hold finite values in [0, 1]")
    return q


def _row(q, j) -> np.ndarray:
    if isinstance(q, np.ndarray):
        return q[j]
    return np.asarray(q.getrow(j).toarray()).ravel()


def _noisy(values, scale, source):
    """``values`` plus Lap(scale) each, rounded to the noise grid first with an exact-grid source."""
    values = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if source.exact_grid:
        values = np.asarray(round_to_grid(values, scale), dtype=np.float64).reshape(values.shape)
    return values + source.laplace(scale, values.size).reshape(values.shape)


class LaplaceHistogram(BlackBox):
    """Laplace counts, clipped at 0 and renormalised: ε-DP (L1 sensitivity 2 under replace-one).

    Accuracy for every f ∈ [0, 1]^N: |f(y) − f(x)| <= 2‖ν‖₁/m, and
    ‖ν‖₁ <= (2/ε)·N·log(N/β) with probability 1 − β, so (p, g) = (1, 4N(1 + log N))
    for β <= 1/e (log(N/β) <= (1 + log N)·log(1/β)).
    """

    name = "laplace_histogram"
    p = 1.0
    output_kind = "histogram"

    def __init__(self, universe_size: int) -> None:
        self.universe_size = check_int("universe_size", universe_size, 1)
        self.g = 4.0 * self.universe_size * (1.0 + math.log(self.universe_size))

    def run(self, counts: np.ndarray, epsilon: float, alpha: float, beta: float,
            source: NoiseSource) -> np.ndarray:
        scale = grid_padded_scale(2.0, lambda s: s / epsilon)
        noisy = np.maximum(_noisy(counts, scale, source), 0.0)
        total = noisy.sum()
        if not total > 0:
            return np.full(self.universe_size, 1.0 / self.universe_size)
        return noisy / total


class SmallDB(BlackBox):
    """SmallDB (growing.md G-3): the exponential mechanism over all size-m multisets of cells.

    m = ⌈log k/(α/2)²⌉ = ⌈4·log k/α²⌉ (at least 1), capped by ``max_size`` and
    so that at most ``max_candidates`` multisets are scored (a cap on m costs
    accuracy, never privacy: it depends on public α only). A candidate y is
    drawn with probability ∝ exp(−ε·|x|·max_f |f(x) − f(y)|/2); |x|·err has
    sensitivity 1 under replace-one, so the run is ε-DP. (p, g) = (3, 20·log N·log k),
    valid when log N·log k >= 1 and β <= 1/e (G-3). The sampler is the
    project's :func:`~dp_beam.mechanisms.continual_mean.exponential_mechanism`
    (exact softmax with keyed noise).
    """

    name = "smalldb"
    p = 3.0
    output_kind = "histogram"

    def __init__(self, queries: ArrayLike, universe_size: int, max_candidates: int = 200_000,
                 max_size: int | None = None) -> None:
        self.universe_size = check_int("universe_size", universe_size, 1)
        q = query_matrix(queries, self.universe_size)
        self.queries = q if isinstance(q, np.ndarray) else q.toarray()
        self.k = self.queries.shape[0]
        self.max_candidates = check_int("max_candidates", max_candidates, 1)
        self.max_size = None if max_size is None else check_int("max_size", max_size, 1)
        self.g = 20.0 * math.log(self.universe_size) * math.log(max(self.k, 2))
        self._candidates: Dict[int, np.ndarray] = {}

    def size_for(self, alpha: float) -> int:
        """The multiset size m for accuracy α (public): ⌈4 log k/α²⌉ within the caps."""
        m = max(1, math.ceil(4.0 * math.log(max(self.k, 1)) / alpha ** 2 - 1e-12))
        if self.max_size is not None:
            m = min(m, self.max_size)
        while m > 1 and math.comb(self.universe_size + m - 1, m) > self.max_candidates:
            m -= 1
        return m

    def candidates(self, m: int) -> np.ndarray:
        """All multisets of size m as count vectors (C × N ints), in a fixed public order."""
        hit = self._candidates.get(m)
        if hit is None:
            rows = []
            for combo in itertools.combinations_with_replacement(range(self.universe_size), m):
                rows.append(np.bincount(combo, minlength=self.universe_size))
            hit = self._candidates[m] = np.asarray(rows, dtype=np.int64)
        return hit

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_candidates"] = {}
        return state

    def run(self, counts: np.ndarray, epsilon: float, alpha: float, beta: float,
            source: NoiseSource) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        t = counts.sum()
        m = self.size_for(alpha)
        cands = self.candidates(m)
        if t == 0:
            return cands[0] / m
        answers_y = self.queries @ cands.T / m                      # k × C
        answers_x = self.queries @ counts / t                       # k
        cost = t * np.abs(answers_y - answers_x[:, None]).max(axis=0)  # sensitivity 1
        choice = exponential_mechanism(cost - cost.min(), epsilon, 1.0, source)
        return cands[choice] / m


class MWEMHistogram(BlackBox):
    """MWEM (Hardt, Ligett & McSherry 2012) over k linear queries: an ε-DP synthetic histogram.

    T rounds, each spending ε/(2T) on an exponential-mechanism choice of the
    worst-answered query (score |q·x − q·A| in counts, sensitivity 1) and
    ε/(2T) on a Laplace measurement of it (rounded to its noise grid with the
    keyed source), followed by multiplicative-weights sweeps over all
    measurements so far (``sweeps`` passes per round); the output is the last
    iterate (default: on a 6-cell test, 3× smaller max error than the average)
    or, with ``average=True``, the average of the T iterates as in the paper's
    analysis.

    ``rounds``: ``"theory"`` T = min(T_max, ⌈16·log N/α²⌉), for which
    (p, g) = (3, 320·log N·(1 + log(k·T_max))) (HLM12 Thm 2.2, error
    2t√(log N/T) + 10T·log(kT/β)/ε in counts, with T making the first term
    α/2, and ``average=True``); ``"auto"`` (default) T minimising that bound
    at the run's (ε, t), a practical choice; or an int. Privacy is ε for every
    choice: the data enter only through the 2T noisy steps.
    """

    name = "mwem"
    p = 3.0
    output_kind = "histogram"

    def __init__(self, queries: ArrayLike, universe_size: int, rounds: Union[int, str] = "auto",
                 max_rounds: int = 64, average: bool = False, sweeps: int = 3) -> None:
        self.universe_size = check_int("universe_size", universe_size, 1)
        self.queries = query_matrix(queries, self.universe_size)
        self.k = self.queries.shape[0]
        if not (rounds in ("auto", "theory") or (isinstance(rounds, int) and not isinstance(rounds, bool)
                                                  and rounds >= 1)):
            raise ValueError(f"rounds must be 'auto', 'theory' or an int >= 1, got {rounds!r}")
        self.rounds = rounds
        self.max_rounds = check_int("max_rounds", max_rounds, 1)
        if not isinstance(average, bool):
            raise ValueError(f"average must be True or False, got {average!r}")
        self.average = average
        self.sweeps = check_int("sweeps", sweeps, 1)
        self.g = 320.0 * math.log(self.universe_size) * (1.0 + math.log(self.k * self.max_rounds))

    def rounds_for(self, t: float, epsilon: float, alpha: float, beta: float) -> int:
        """T for a run on t records (public: t is the public size)."""
        if isinstance(self.rounds, int):
            return min(self.rounds, self.max_rounds)
        log_n = math.log(max(self.universe_size, 2))
        if self.rounds == "theory":
            return max(1, min(self.max_rounds, math.ceil(16.0 * log_n / alpha ** 2)))
        best = (math.sqrt(log_n) * epsilon * t / (12.0 * math.log(self.k / beta + 1.0))) ** (2.0 / 3.0)
        return max(1, min(self.max_rounds, int(round(best))))

    def run(self, counts: np.ndarray, epsilon: float, alpha: float, beta: float,
            source: NoiseSource) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        n_cells = self.universe_size
        t = counts.sum()
        if t == 0:
            return np.full(n_cells, 1.0 / n_cells)
        T = self.rounds_for(t, epsilon, alpha, beta)
        eps_round = epsilon / (2.0 * T)
        scale = grid_padded_scale(1.0, lambda s: s / eps_round)
        q = self.queries
        true = np.asarray(q @ counts).ravel()                        # PRIVATE
        A = np.full(n_cells, t / n_cells)
        total = np.zeros(n_cells)
        measured = []
        for _ in range(T):
            score = np.abs(true - np.asarray(q @ A).ravel())
            j = exponential_mechanism(score.max() - score, eps_round, 1.0, source)
            measured.append((j, _row(q, j), float(_noisy(true[j], scale, source)[0])))
            for _ in range(self.sweeps):
                for _, row, value in measured:
                    A = A * np.exp(row * (value - row @ A) / (2.0 * t))
                    A *= t / A.sum()
            total += A
        out = total / T if self.average else A
        return out / out.sum()

    def describe(self) -> Dict[str, Any]:
        return {**super().describe(), "k": self.k, "rounds": self.rounds,
                "max_rounds": self.max_rounds}


class ERMBox(BlackBox):
    """Output-perturbation logistic regression on the database's points (growing.md G-3; ERMG).

    The universe is a finite set of labelled points: cell i is
    ``(cell_features[i], cell_labels[i])``. A run minimises
    J(θ; x) = (1/t)Σ ℓ(θ; z) + λ‖θ‖² over the t records (each cell repeated by
    its count) with the project's certified solver and adds L2-Laplace noise of
    scale 2L/(λtε) (:class:`~dp_beam.mechanisms.erm.OutputPerturbation`,
    pure ε-DP under replace-one). Accuracy (excess J): J is β_s-smooth
    (β_s = smoothness + 2λ), so J(θ̃) − J(θ*) <= (β_s/2)(‖ν‖ + r)², with
    ‖ν‖ <= 2b(d·ln 2 + log(1/β)) (Gamma tail) and the solver radius r <= b;
    hence (p, g) = (½, √(β_s/2)·(2L·(1 + 2^−20)/λ)·(2d·ln 2 + 3)), d the number
    of parameters, for β <= 1/e and ε <= 8.
    """

    name = "erm"
    p = 0.5
    output_kind = "model"

    def __init__(self, cell_features: ArrayLike, cell_labels: ArrayLike, classes: Sequence,
                 feature_bound: float, lam: float, fit_intercept: bool = True,
                 noise: str = "l2_laplace") -> None:
        feats = np.asarray(cell_features, dtype=np.float64)
        if feats.ndim != 2 or feats.shape[0] < 1:
            raise ValueError(f"cell_features must be an N x d array, got shape {feats.shape}")
        self.universe_size = feats.shape[0]
        if noise not in ("l2_laplace", "coord_laplace_l1"):
            raise ValueError(f"noise must be 'l2_laplace' or 'coord_laplace_l1' (a black box is "
                             f"pure epsilon-DP), got {noise!r}")
        self.noise = noise
        self.loss = LogisticLoss(feats.shape[1], classes, feature_bound, fit_intercept)
        self.lam = check_real("lam", lam, positive=True)
        labels = list(cell_labels)
        if len(labels) != self.universe_size:
            raise ValueError(f"cell_labels must have N = {self.universe_size} entries, got {len(labels)}")
        self.features = self.loss.clip(feats)
        self.labels = self.loss.labels(labels)
        beta_s = self.loss.smoothness + 2.0 * self.lam
        d = self.loss.n_params
        self.g = (math.sqrt(beta_s / 2.0) * 2.0 * self.loss.lipschitz * (1.0 + 2.0 ** -20) / self.lam
                  * (2.0 * d * math.log(2.0) + 3.0))

    def _points(self, counts):
        counts = np.asarray(counts, dtype=np.int64)
        return np.repeat(self.features, counts, axis=0), np.repeat(self.labels, counts)

    def run(self, counts: np.ndarray, epsilon: float, alpha: float, beta: float,
            source: NoiseSource) -> np.ndarray:
        X, yi = self._points(counts)
        if X.shape[0] == 0:
            return np.zeros(self.loss.n_params)
        op = OutputPerturbation(self.loss, self.lam, epsilon, noise=self.noise, rng=source)
        theta, _ = op.train(X, yi, None, 1.0)
        return np.asarray(theta, dtype=np.float64)

    def objective(self, theta: ArrayLike, counts: ArrayLike) -> float:
        """J(θ; x) = mean loss + λ‖θ‖² on the database (NOT private: for evaluation)."""
        X, yi = self._points(counts)
        value, _ = self.loss.value_grad(np.asarray(theta), self.loss.augment(X), yi)
        return value + self.lam * float(np.dot(theta, theta))

    def excess_risk(self, theta: ArrayLike, counts: ArrayLike) -> float:
        """J(θ) − min J on the database (NOT private: for evaluation and tests)."""
        from ..erm import solve_erm

        X, yi = self._points(counts)
        best, _ = solve_erm(self.loss, X, yi, self.lam, None, 0.01)
        return self.objective(theta, counts) - self.objective(best, counts)
