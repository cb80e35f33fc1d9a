"""The front of key selection: :class:`KeySelection`, the public parameters (thresholds,
cost) of a continual private key selection, which makes and restores the per-key mechanisms
(:class:`~.counter.KeyCounter`, :class:`~.sparse_vector.KeySparseVector`)."""

import math
import numbers

from typing import Any, Dict, List, Optional, Tuple, Union

from scipy import stats

from ...accounting.cost import Cost
from ..calibration import eps_from_rho_delta, rho_from_eps, rho_from_eps_delta
from ..checks import check_int
from ..counting.tree import NOISE_KINDS, BinaryTreeMechanism
from ..noise import ZeroNoise, make_noise
from .counter import KeyCounter
from .sparse_vector import KeySparseVector
from .thresholds import (SVT_TAIL_FRACTION, laplace_tail_quantile, sparse_vector_admission_bounds,
                         sparse_vector_excess)

__all__ = ["KeySelection", "METHODS"]

#: Selection methods: a binary-tree counter per key, or AboveThreshold per key.
METHODS = ("counter", "sparse_vector")


class KeySelection:
    """Public parameters of a continual private key selection: thresholds and cost.

    Immutable; validates eagerly and raises ``ValueError`` naming the
    parameter. The modules :mod:`.counter` (claims 1–9) and
    :mod:`.sparse_vector` (claims 10–17) derive the thresholds and the cost.

    Parameters
    ----------
    epsilon:
        ε > 0 of the whole selection (all keys, all steps).
    delta:
        δ in (0, 1) of the whole selection. It bounds, among other things,
        the probability that a key only one unit contributed to is ever
        admitted (claims 4 and 13 with δ₁ <= δ).
    max_keys_per_unit:
        m >= 1, the number of keys one unit may contribute to (the caller
        enforces it); each key's mechanism gets 1/m of the budget.
    noise:
        ``"laplace"`` (default): per-key mechanisms at ε/m each.
        ``"gaussian"`` (counter method only): counters at ρ/m-zCDP each with
        ``ρ = rho_from_eps_delta(ε, δ/2)``.
    horizon:
        Number of steps T (an int >= 1) from the public start, or ``None``
        for an unbounded stream.
    method:
        ``"counter"`` (default here): a binary-tree counter per key (claims
        1–9, :class:`KeyCounter`). ``"sparse_vector"``: AboveThreshold per
        key (claims 10–17, :class:`KeySparseVector`), Laplace only; its
        thresholds are several times lower (package docstring).

    >>> sel = KeySelection(epsilon=1.0, delta=1e-6)            # unbounded, Laplace
    >>> [round(sel.threshold(t), 1) for t in (1, 100, 10_000)]
    [16.1, 243.0, 727.3]
    >>> g = KeySelection(epsilon=1.0, delta=1e-6, noise="gaussian", horizon=365)
    >>> round(g.delta_per_key, 12), round(g.threshold(1), 1)
    (1.34471e-07, 102.2)
    >>> s = KeySelection(epsilon=1.0, delta=1e-6, method="sparse_vector")   # unbounded
    >>> [round(s.threshold(t), 1) for t in (1, 100, 10_000)]
    [35.7, 52.3, 71.7]
    """

    # The parameters a per-key state records, so that only the selection
    # that made it can restore it (the method is told by the state's
    # mechanism name).
    _PARAMS = ("epsilon", "delta", "max_keys_per_unit", "noise", "horizon")

    def __init__(self, epsilon: float, delta: float, max_keys_per_unit: int = 1,
                 noise: str = "laplace", horizon: Optional[int] = None,
                 method: str = "counter") -> None:
        if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        self._m = check_int("max_keys_per_unit", max_keys_per_unit, 1)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        if horizon is not None:
            horizon = check_int("horizon", horizon, 1)
        if not isinstance(method, str) or method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "sparse_vector" and noise != "laplace":
            raise ValueError(
                f"noise must be 'laplace' with method='sparse_vector' (Gaussian noise is "
                f"available with method='counter'), got {noise!r}")
        self._epsilon = float(epsilon)
        self._delta = float(delta)
        self._noise = noise
        self._horizon = horizon
        self._method = method

        selection_delta = self._split_budget()
        # 1/(1 + e^ε) as e^{−ε}/(1 + e^{−ε}): no overflow for large ε.
        self._delta_per_key = selection_delta * math.exp(-self._epsilon) / (
            self._m * (1.0 + math.exp(-self._epsilon)))
        if not self._delta_per_key > 0.0:
            raise ValueError(f"epsilon is too large for the per-key delta to be representable, got {epsilon!r}")
        self._quantiles = {}
        if method == "counter":
            # Noise-free twin of every counter: it answers the public questions
            # (node scales at t) and is never stepped.
            self._probe = BinaryTreeMechanism(rng=ZeroNoise(), **self._counter_args())
        else:
            if self._delta_per_key < 1e-250:
                # The certified bound works in linear probability space.
                raise ValueError(
                    f"epsilon is too large for the sparse-vector threshold computation, got {epsilon!r}")
            self._probe = None
            # Claim 12: ε₁ = ε₂ = ε/(2m), Δ = 1.
            self._offset_scale = 2.0 * self._m / self._epsilon
            self._step_scale = 2.0 * self._m / self._epsilon
            self._base_threshold = None     # τ, computed on first use (claim 13)

    def _split_budget(self):
        """Set the per-key mechanisms' budget; return the δ left for thresholding."""
        if self._noise == "laplace":
            self._rho = None
            self._counter_epsilon = self._epsilon / self._m
            self._counter_delta = None
            return self._delta
        else:
            # Half of δ pays for the zCDP → (ε, δ) conversion of the counters,
            # the other half for thresholding (claim 7).
            half = self._delta / 2.0
            self._rho = rho_from_eps_delta(self._epsilon, half)
            target = self._rho / self._m
            counter_epsilon = eps_from_rho_delta(target, half)
            # The tree derives its ρ from (ε, δ) again; a last-bit excess over
            # ρ/m would break the composition to ρ, so step down until none.
            while rho_from_eps_delta(counter_epsilon, half) > target:
                counter_epsilon = math.nextafter(counter_epsilon, 0.0)
            self._counter_epsilon = counter_epsilon
            self._counter_delta = half
            return half

    def _counter_args(self):
        return dict(epsilon=self._counter_epsilon, sensitivity=1.0, horizon=self._horizon,
                    noise=self._noise, delta=self._counter_delta)

    # -- public parameters ----------------------------------------------------

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def delta(self) -> float:
        return self._delta

    @property
    def max_keys_per_unit(self) -> int:
        return self._m

    @property
    def noise(self) -> str:
        return self._noise

    @property
    def horizon(self) -> Optional[int]:
        return self._horizon

    @property
    def method(self) -> str:
        """``"counter"`` or ``"sparse_vector"``."""
        return self._method

    @property
    def mechanism(self) -> str:
        """Name of the per-key mechanism for ledgers and records, e.g. ``"key_selection+tree(laplace)"``."""
        kind = "tree" if self._method == "counter" else "sparse_vector"
        return f"key_selection+{kind}({self._noise})"

    @property
    def delta_per_key(self) -> float:
        """δ₁: the bound on a one-unit key's admission probability (claims 4, 8, 13, 16)."""
        return self._delta_per_key

    @property
    def counter_epsilon(self) -> float:
        """ε of each key's mechanism: ε/m (Laplace), or the ε that gives ρ/m at δ/2 (Gaussian)."""
        return self._counter_epsilon

    @property
    def offset_scale(self) -> float:
        """Sparse vector: ``b_ρ``, the Laplace scale of the threshold offset ρ (claims 11, 12)."""
        self._require("sparse_vector", "offset_scale")
        return self._offset_scale

    @property
    def step_scale(self) -> float:
        """Sparse vector: ``b_ν``, the Laplace scale of each step's noise ν_t (claims 11, 12)."""
        self._require("sparse_vector", "step_scale")
        return self._step_scale

    def _require(self, method, what):
        if self._method != method:
            raise ValueError(f"{what} is defined for method={method!r} only; this selection uses "
                             f"method={self._method!r}")

    def _check_t(self, t):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1:
            raise ValueError(f"t must be an int >= 1, got {t!r}")
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"t must be <= horizon ({self._horizon}), got {t}")
        return int(t)

    def _pattern(self, t):
        """(cache key, w_t): the node-scale multiset at t depends only on the key."""
        if self._horizon is not None:
            return (None, bin(t).count("1")), 1.0 / self._horizon
        j = t.bit_length() - 1
        return (j, bin(t - (1 << j) + 1).count("1")), math.ldexp(1.0, -(2 * j + 1))

    def weight(self, t: int) -> float:
        """``w_t`` (claim 3): ``1/T`` bounded, ``2^{−(2j+1)}`` for t in epoch j unbounded."""
        return self._pattern(self._check_t(t))[1]

    def tail_probability(self, t: int) -> float:
        """Counter: ``δ₁·w_t``, the bound on ``P(Z_t >= q_t)``."""
        self._require("counter", "tail_probability")
        return self._delta_per_key * self.weight(t)

    def noise_scales(self, t: int) -> List[float]:
        """Scales of the independent noises in the admission test at t.

        Counter: the tree's node noises in its release at t. Sparse vector:
        ``(b_ρ, b_ν)``, the offset ρ (drawn once, so shared by all steps)
        and ν_t.
        """
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return [self._offset_scale, self._step_scale]
        return self._probe.noise_scales(t)

    def noise_std(self, t: int) -> float:
        """Standard deviation of the admission test's noise at t (``Z_t``, or ``ν_t − ρ``)."""
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return math.sqrt(2.0 * (self._offset_scale ** 2 + self._step_scale ** 2))
        return self._probe.noise_std(t)

    def threshold(self, t: int) -> float:
        """The public threshold ``τ_t`` at step index t (1-based from the public start).

        Counter: ``τ_t = 1 + q_t`` (claim 3), computed once per pattern of
        node scales (bounded: the popcount of t; unbounded: its epoch and
        the popcount within it) and cached, since most steps share one.
        Sparse vector: ``τ_t = τ + g(t)`` (claim 13), τ computed once.
        """
        t = self._check_t(t)
        if self._method == "sparse_vector":
            return self.base_threshold() + self._svt_shift(t)
        key, w = self._pattern(t)
        q = self._quantiles.get(key)
        if q is None:
            p = self._delta_per_key * w
            if self._noise == "gaussian":
                q = self._probe.noise_std(t) * float(stats.norm.isf(p))
            else:
                q = laplace_tail_quantile(self._probe.noise_scales(t), p)
            self._quantiles[key] = q
        return 1.0 + q

    def _svt_shift(self, t):
        """``g(t)``: 0 bounded, ``b_ν·ln(w_1/w_t) = 2j·b_ν·ln 2`` for t in epoch j unbounded."""
        if self._horizon is not None:
            return 0.0
        return 2.0 * (t.bit_length() - 1) * self._step_scale * math.log(2.0)

    def base_threshold(self) -> float:
        """Sparse vector: τ = ``threshold(1)``, the smallest τ certified by claim 14."""
        self._require("sparse_vector", "base_threshold")
        if self._base_threshold is None:
            excess = sparse_vector_excess(self._offset_scale, self._step_scale, self._horizon,
                                 self._delta_per_key)
            self._base_threshold = 1.0 + excess
        return self._base_threshold

    def admission_bounds(self, units: int = 1) -> Tuple[float, float]:
        """Sparse vector: certified bounds on the admission probability of a key with <= ``units`` units.

        ``units=1``: the one-unit key of claim 13, whose upper bound is at
        most δ₁; ``units=0``: a key with no data run from the start (δ₀,
        claim 15). Returns ``(lower, upper)`` from
        :func:`sparse_vector_admission_bounds` (the lower bound is that of
        a key whose count is ``units`` at every step).
        """
        self._require("sparse_vector", "admission_bounds")
        units = check_int("units", units, 0)
        return sparse_vector_admission_bounds(
            self.base_threshold() - units, self._offset_scale, self._step_scale, self._horizon,
            self._delta_per_key * SVT_TAIL_FRACTION)

    def privacy_cost(self) -> Cost:
        """Cost of the whole selection under add/remove of one unit.

        A :class:`~dp_beam.accounting.cost.Cost` ``(ε, δ, ρ)``: the selection is (ε, δ)-DP
        (claims 7, 16). ``rho`` is the zCDP cost of the m per-key mechanisms
        a unit touches: ``m·(ε/m)²/2`` for Laplace (each is ε/m-DP, counter
        or sparse vector), ρ for Gaussian. It does **not** cover the
        thresholding part of δ (``m·δ₁·(1 + e^ε)``), which no zCDP bound
        does; an accountant composing in zCDP must add that δ separately.
        """
        if self._noise == "laplace":
            rho = self._m * (rho_from_eps(self._counter_epsilon) if self._probe is None
                             else self._probe.rho)
        else:
            rho = self._rho
        return Cost(self._epsilon, self._delta, rho)

    def counter_cost(self) -> Cost:
        """Privacy cost of one key's mechanism: its tree's (ε/m, or ρ/m-zCDP), or ε/m for sparse vector."""
        if self._probe is None:
            eps = self._counter_epsilon
            return Cost(eps, 0.0, eps * eps / 2.0)
        return Cost.of(self._probe.privacy_cost())

    # -- per-key mechanisms ---------------------------------------------------

    def new_counter(self, first_t: int, rng: Any = None) -> Union[KeyCounter, KeySparseVector]:
        """The per-key mechanism of a key whose first data is at step index ``first_t`` (>= 1).

        A :class:`KeyCounter` (counter method) or :class:`KeySparseVector`.
        It is aligned to the public start: it has consumed ``first_t − 1``
        zero steps without testing them (claims 6, 15), so its next ``step``
        is step ``first_t``. The counter catches up by ``skip``; the sparse
        vector draws its offset ρ here, from ``rng``, and nothing else.
        ``rng``: ``None`` for secure noise; an int seed, a NumPy
        ``Generator`` or a :class:`~dp_beam.mechanisms.noise.NoiseSource`
        for tests. Many keys may share one source.
        """
        first_t = check_int("first_t", first_t, 1)
        if self._horizon is not None and first_t > self._horizon:
            raise ValueError(f"first_t must be <= horizon ({self._horizon}), got {first_t}")
        if self._method == "sparse_vector":
            source = make_noise(rng)
            offset = float(source.laplace(self._offset_scale, 1)[0])
            return KeySparseVector(self, source, t=first_t - 1, count=0, offset=offset)
        tree = BinaryTreeMechanism(rng=rng, **self._counter_args())
        tree.skip(first_t - 1)
        return KeyCounter(self, tree)

    def restore(self, state: Dict[str, Any],
                rng: Any = None) -> Union[KeyCounter, KeySparseVector]:
        """Rebuild a per-key mechanism from its ``to_state()`` output.

        The state must come from a selection with the same parameters and
        method. ``rng`` as in :meth:`new_counter`; with a source positioned
        where the original's was, the restored mechanism admits exactly
        where the original would have.
        """
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        cls = KeySparseVector if self._method == "sparse_vector" else KeyCounter
        if state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state: mechanism={state.get('mechanism')!r}")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(
                f"unsupported state version {state.get('version')!r}, expected {cls.STATE_VERSION}")
        record = cls.STATE_RECORD.from_state(state)
        params = {name: getattr(record, name) for name in self._PARAMS}
        mine = {name: getattr(self, name) for name in self._PARAMS}
        if params != mine:
            raise ValueError(f"state was made by a different selection: {params} != {mine}")
        t = check_int("state t", record.t, 0)
        admitted = record.admitted
        if admitted is not None:
            # A key's mechanism stops at admission, so its t is the admission step.
            if isinstance(admitted, bool) or not isinstance(admitted, numbers.Integral) or admitted != t or t < 1:
                raise ValueError(f"state admitted must be None or equal to t={t}, got {admitted!r}")
        if cls is KeySparseVector:
            return self._restore_sparse_vector(t, admitted, record.count, record.offset, rng)
        tree_state = record.tree
        if admitted is not None:
            if tree_state is not None:
                raise ValueError("state of an admitted key must not hold a tree")
            return KeyCounter(self, None, t=t, admitted=int(admitted))
        if not isinstance(tree_state, dict):
            raise ValueError("state tree must be a tree state (dict) before admission")
        expected = self._probe.to_state()
        for name in ("mechanism", "epsilon", "sensitivity", "horizon", "noise", "delta", "dim", "calibration"):
            if tree_state.get(name) != expected[name]:
                raise ValueError(
                    f"state tree {name}={tree_state.get(name)!r} does not match the selection's {expected[name]!r}")
        tree = BinaryTreeMechanism.from_state(tree_state, rng=rng)
        if tree.t != t:
            raise ValueError(f"state t={t} does not match its tree's t={tree.t}")
        return KeyCounter(self, tree)

    def _restore_sparse_vector(self, t, admitted, count, offset, rng):
        if admitted is not None:
            if count is not None or offset is not None:
                raise ValueError("state of an admitted key must not hold its count or offset")
            return KeySparseVector(self, None, t=t, admitted=int(admitted))
        if self._horizon is not None and t > self._horizon:
            raise ValueError(f"state t={t} is past the horizon ({self._horizon})")
        count = check_int("state count", count, 0)
        if isinstance(offset, bool) or not isinstance(offset, numbers.Real) or not math.isfinite(offset):
            raise ValueError(f"state offset must be a finite number before admission, got {offset!r}")
        return KeySparseVector(self, make_noise(rng), t=t, count=count, offset=float(offset))

    def __repr__(self) -> str:
        return (f"KeySelection(epsilon={self._epsilon!r}, delta={self._delta!r}, "
                f"max_keys_per_unit={self._m!r}, noise={self._noise!r}, horizon={self._horizon!r}, "
                f"method={self._method!r})")

