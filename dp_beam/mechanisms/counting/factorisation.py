"""Shared machinery of the matrix-factorisation continual-counting mechanisms.

Every mechanism here releases prefix sums ``A x`` (A the T×T lower-triangular
all-ones matrix) as ``B (R x + z)`` for a factorisation ``A = B R``: the right
factor R is what the noise ``z`` protects, so its largest column norm is the
sensitivity (L2 for Gaussian, L1 for Laplace noise), and the left factor B
carries the noise into the releases, so release t has noise std
``scale · ‖B[t, :]‖₂`` (Li, Miklau et al. 2015 "The matrix mechanism";
Denisov, McMahan, Rush, Smith, Thakurta 2022; Fichtenberger, Henzinger,
Upadhyay 2023 for the max-error objective). The mechanisms never build the
matrices; they stream ``B (R x + z)`` with small state. The classes'
``right_factor`` methods build R for small T so that tests can check
``B R = A`` against the streaming code.

:class:`FactorisationMechanism` holds what the mechanisms share with
:class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism`: the constructor and its
validation, calibration, privacy cost, the unbounded-stream construction and
(de)serialisation. A subclass supplies a *plan* (public constants for one
horizon) and a *core* (the per-horizon streaming state).

The privacy argument is ``docs/privacy/counting.md``, C-6, C-8 and C-9.
"""

import dataclasses
import functools
import math
from typing import Any, Dict, Optional, Union

import numpy as np

from ...accounting.cost import Cost
from ..calibration import noise_scale
from ..halfwidths import gaussian_halfwidth
from ..noise import make_noise
from ..noise_grid import grid_padded_scale, round_to_grid
from .intervals import laplace_combination_halfwidth
from .parameters import (
    CounterConfig,
    CounterParameters,
    CounterState,
    privacy_cost,
    restore_parameters,
)

__all__ = [
    "FactorisationMechanism",
    "FactorisationState",
    "RIGHT_FACTOR_SLACK",
    "prefix_sum_matrix",
    "prefix_sum_lower_bound",
]

#: Relative sensitivity margin of the integer right factor (``EXACT =
#: "right_factor"``): the rounding terms are kept below 2^-21 of the
#: sensitivity, the rest covers the float evaluation of the column norm.
RIGHT_FACTOR_SLACK = 2.0 ** -20


def prefix_sum_matrix(horizon: int) -> np.ndarray:
    """The T×T lower-triangular all-ones matrix A (release t = Σ_{s<=t} x_s)."""
    return np.tril(np.ones((horizon, horizon)))


def prefix_sum_lower_bound(horizon: int) -> float:
    """Lower bound on the max per-step std of *any* factorisation of A_T.

    For ``A = B R`` with unit-sensitivity calibration the largest per-step
    std is ``max_t ‖B[t]‖₂ · max_s ‖R[:, s]‖₂ >= γ₂(A) >= ‖A‖_* / T``
    (the trace-norm bound on the factorisation norm γ₂, e.g. Lee, Shraibman,
    Špalek 2008; used for continual counting by Fichtenberger, Henzinger,
    Upadhyay 2023 and Henzinger, Upadhyay, Upadhyay 2023). The singular
    values of A_T are known in closed form,
    ``1 / (2 sin((2j−1)π / (4T+2)))`` for j = 1..T, so the bound is exact
    arithmetic, not an SDP: 2.910 at T = 2^10, 4.232 at 2^16, 5.115 at 2^20.
    """
    j = np.arange(1, horizon + 1, dtype=np.float64)
    singular = 0.5 / np.sin((2.0 * j - 1.0) * math.pi / (4.0 * horizon + 2.0))
    return float(singular.sum() / horizon)


# -- the shared mechanism ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FactorisationState(CounterState):
    """The state of a :class:`FactorisationMechanism`: the counter fields, then the open
    epoch's core (the subclass's dict, None between epochs of an unbounded stream) and the sum
    of the closed epochs' releases (None for a bounded horizon), as stored."""

    core: Optional[Dict[str, Any]]
    roots: Optional[Any]


@functools.lru_cache(maxsize=4096)
def _calibrated_scale(noise, l1, l2, epsilon, delta, calibration):
    # Cached across instances: every stream of a release computes the same scales, once per
    # epoch of an unbounded stream (≈ 10 µs each, mostly validating the parameters).
    return noise_scale(noise, l1, l2, epsilon, delta, calibration)


def _base_epochs(cls):
    """Whether ``cls`` keeps the base class's epoch lengths (``2^k``, capped by ``MAX_HORIZON``)."""
    return cls._epoch_length.__func__ is FactorisationMechanism._epoch_length.__func__


class FactorisationMechanism(CounterParameters):
    """Base of the streaming factorisation mechanisms (constructor as the tree's).

    Subclasses set ``name``, ``STATE_VERSION``, ``LAPLACE`` (whether Laplace
    noise is offered) and implement the class methods ``_plan(horizon)``
    (public constants: ``l1``, ``l2`` column norms and whatever the core
    needs), ``_var_factor(plan, t)`` (``‖B[t]‖²`` in units of the noise
    scale²), ``_laplace_terms(plan, t)`` (``[(coefficient, multiplicity)]`` of
    the release noise) and the instance methods ``_core_new(plan)``,
    ``_core_step(plan, core, x)``, ``_core_release(plan, core)``,
    ``_core_to_state(core)``, ``_core_from_state(plan, data, t)``.

    Unbounded streams (``horizon=None``)
        As the tree's doubling construction (``docs/privacy/counting.md``,
        C-6; :mod:`~dp_beam.mechanisms.counting.doubling`): epoch k runs its own
        mechanism over ``L_k`` steps (``L_k = 2^k`` unless the subclass caps
        it), calibrated for the *whole* sensitivity Δ of a privacy unit; the
        release is the sum of the final releases of completed epochs plus the
        current epoch's release. Epochs see disjoint steps and each is a
        Gaussian (resp. Laplace) mechanism on its own right factor, so a unit
        that spreads its Δ as ``D_k`` over epochs (``Σ D_k <= Δ``) costs
        ``Σ (D_k/Δ)² ρ <= ρ`` (resp. ``Σ (D_k/Δ) ε <= ε``); the analytic
        Gaussian argument of C-6 applies unchanged. Final releases of
        completed epochs are post-processing; only their sum is kept.
    """

    name = None
    STATE_VERSION = 1
    LAPLACE = True
    #: How a release stays an exact function of the discrete mechanism's
    #: output (see :meth:`_scale`): ``"nodes"`` or ``"right_factor"``.
    EXACT = "nodes"
    #: Largest horizon (and epoch length) supported; None for no limit.
    MAX_HORIZON = None

    def __init__(
        self,
        epsilon: float,
        sensitivity: float = 1.0,
        horizon: Optional[int] = None,
        noise: str = "laplace",
        delta: Optional[float] = None,
        dim: int = 1,
        rng: Any = None,
        calibration: str = "zcdp",
    ) -> None:
        self._setup(CounterConfig(epsilon, sensitivity, horizon, noise, delta, dim, calibration),
                    rng)

    def _setup(self, config: CounterConfig, rng: Any) -> None:
        self._last_std = None  # (t, std) of the last noise_std call
        self._check_max_horizon(config.horizon)
        self._check_offered(config.noise)
        self._configure(config, rng)

        self._scales = {}
        self._t = 0
        if self._horizon is not None:
            self._core = self._core_new(self._plan_of(self._horizon))
            self._roots = None
        else:
            self._core = None
            self._roots = np.zeros(self._dim, dtype=np.float64)

    def _check_max_horizon(self, horizon):
        if self.MAX_HORIZON is not None and horizon is not None and horizon > self.MAX_HORIZON:
            raise ValueError(
                f"horizon must be <= {self.MAX_HORIZON} for {self.name} (its state grows linearly "
                f"with the horizon), got {horizon}"
            )
        return horizon

    def _check_offered(self, noise):
        if noise == "laplace" and not self.LAPLACE:
            raise ValueError(
                f"noise must be 'gaussian' for {self.name}: {self._laplace_refusal()}"
            )
        return noise

    def _plan_of(self, horizon):
        """The plan this instance uses for a mechanism over ``horizon`` steps."""
        return self._plan(horizon)

    @classmethod
    def _laplace_refusal(cls):
        return "Laplace noise is not offered"

    # -- epochs ---------------------------------------------------------------------

    @classmethod
    def _epoch_length(cls, k):
        length = 1 << k
        if cls.MAX_HORIZON is not None:
            length = min(length, cls.MAX_HORIZON)
        return length

    @classmethod
    def _epoch_of(cls, t):
        """``(k, start, length)``: epoch k holds steps ``start .. start+length−1``."""
        if cls.MAX_HORIZON is None and type(t) is int and t >= 1 and _base_epochs(cls):
            # Epochs of 2^k steps: epoch k holds 2^k .. 2^(k+1) − 1, the loop below in
            # closed form (an unbounded stream asks at every step).
            k = t.bit_length() - 1
            return k, 1 << k, 1 << k
        start, k = 1, 0
        while True:
            length = cls._epoch_length(k)
            if cls.MAX_HORIZON is not None and length == cls.MAX_HORIZON:
                # From here on every epoch has the same length.
                extra = (t - start) // length
                return k + extra, start + extra * length, length
            if t < start + length:
                return k, start, length
            start += length
            k += 1

    def _calibrated(self, plan, sensitivity):
        """Scale for a per-step sensitivity: the column norm times it, calibrated."""
        # Gaussian-only plans (LAPLACE = False) have no L1 norm.
        l1 = None if plan.l1 is None else plan.l1 * sensitivity
        return _calibrated_scale(self._noise, l1, plan.l2 * sensitivity, self._epsilon,
                                 self._delta, self._calibration)

    def _scale(self, horizon):
        """Noise scale (Laplace b or Gaussian σ) of a mechanism over ``horizon`` steps.

        Calibrated for the sensitivity the exact computation adds (class
        attribute ``EXACT``): ``"nodes"`` mechanisms round each noised node to
        the noise grid, one grid step per node
        (:func:`~dp_beam.mechanisms.noise_grid.grid_padded_scale`);
        ``"right_factor"`` mechanisms compute ``R x + z`` in integers, within a
        relative :data:`RIGHT_FACTOR_SLACK` (see :meth:`_exact_exponent`).
        """
        scale = self._scales.get(horizon)
        if scale is None:
            plan = self._plan_of(horizon)
            if self.EXACT == "nodes":
                scale = grid_padded_scale(self._sensitivity, lambda s: self._calibrated(plan, s))
            else:
                scale = self._calibrated(plan, self._sensitivity * (1.0 + RIGHT_FACTOR_SLACK))
            self._scales[horizon] = scale
        return scale

    def _noised(self, exact, scale, noise):
        """``exact + noise``, with ``exact`` first rounded to the noise grid for an
        exact-grid source (as the tree's ``_noised``; ``EXACT = "nodes"``)."""
        if self._source.exact_grid:
            exact = round_to_grid(exact, scale)
        return exact + noise

    # -- integer right factor (EXACT = "right_factor") ----------------------------------

    def _exact_exponent(self, plan):
        """Exponent e of the unit ``2^e`` in which ``R x + z`` is computed.

        The noised vector is ``y = round(R̃ x̂) + Z`` in integer units of
        ``h = 2^e``: x̂ is x rounded to h, R̃ the right factor with the plan's
        float coefficients taken as exact dyadic rationals, and the rounding
        of ``R̃ x̂`` (and of any internal buffers) is bounded by
        ``plan.err_units`` units per coordinate, a public constant of the
        plan. Two neighbouring inputs then give integer vectors whose L2
        distance is at most the exact sensitivity S (column norm ×
        sensitivity) plus ``n·h·√dim·‖R‖col`` (inputs rounded to h, at most n
        steps changed) plus ``2·err_units·h·√(n·dim)`` (the computation's
        rounding, n the plan's horizon). h is the largest power of two that
        keeps both terms below ``S·2^-51``, so calibrating for
        ``S·(1 + RIGHT_FACTOR_SLACK)`` covers them with ample room for the
        floating-point evaluation of S itself; a unit that small also keeps
        the release's own rounding (post-processing, harmless for privacy)
        at the level of float64 rounding, so noise-free tests see exact sums. The discrete Gaussian on
        those integers is then exactly the mechanism the accountant charges,
        and the release is its post-processing, however it is computed.
        """
        key = ("exponent", plan.horizon)
        exponent = self._scales.get(key)
        if exponent is None:
            total = plan.l2 * self._sensitivity
            n = plan.horizon
            spread = n * math.sqrt(self._dim) * plan.l2 + 2.0 * plan.err_units * math.sqrt(n * self._dim)
            exponent = math.frexp(total * 2.0 ** -51 / spread)[1] - 1
            self._scales[key] = exponent
        return exponent

    def _integer_noise(self, scale, exponent):
        """One noise vector of length dim as ints in units of ``2^exponent``."""
        return self._source.integer_noise(self._noise, scale, exponent, self._dim)

    def _segments(self, t):
        """``[(horizon, local t)]``: the mechanisms whose noise the release at t sums."""
        if self._horizon is not None:
            return [(self._horizon, t)]
        k, start, length = self._epoch_of(t)
        segments = []
        for j in range(k):
            ell = self._epoch_length(j)
            segments.append((ell, ell))
        segments.append((length, t - start + 1))
        return segments

    # -- noise ------------------------------------------------------------------------

    def noise_std(self, t: int) -> float:
        """Standard deviation of each coordinate of the release at step t (1-based).

        ``scale·‖B[t]‖₂`` for the mechanism's left factor B (×√2 for Laplace),
        summed in variance over the completed epochs of an unbounded stream.
        Exact, not a bound.
        """
        t = self._check_t(t)
        last = self._last_std
        if last is not None and last[0] == t:
            # A release asks twice per step (the std and the interval).
            return last[1]
        factor = 2.0 if self._noise == "laplace" else 1.0
        var = 0.0
        for horizon, local in self._segments(t):
            scale = self._scale(horizon)
            var += scale * scale * self._var_factor(self._plan_of(horizon), local)
        std = math.sqrt(factor * var)
        self._last_std = (t, std)
        return std

    def ci_halfwidth(self, t: int, level: float = 0.95) -> float:
        """Half-width x with ``P(|noise| <= x) = level`` for each coordinate at step t.

        Gaussian: the normal quantile (the noise is a linear map of Gaussians).
        Laplace: exact inversion of the distribution of the weighted Laplace
        sum (:func:`laplace_combination_halfwidth`).
        """
        if self._noise == "gaussian":
            return gaussian_halfwidth(self.noise_std(t), level)
        t = self._check_t(t)
        scales, counts = [], []
        for horizon, local in self._segments(t):
            scale = self._scale(horizon)
            for coef, count in self._laplace_terms(self._plan_of(horizon), local):
                scales.append(abs(coef) * scale)
                counts.append(count)
        return laplace_combination_halfwidth(scales, counts, level)

    def privacy_cost(self) -> Cost:
        """The :class:`~dp_beam.accounting.cost.Cost` of the whole output sequence (as the tree's; C-8)."""
        return privacy_cost(self._epsilon, self._delta, self._rho)

    def state_size(self) -> int:
        """Number of floats in the state (see the class docstring for the bound)."""
        size = 0 if self._core is None else self._core_floats(self._core)
        if self._roots is not None:
            size += self._roots.size
        return int(size)

    def set_noise_source(self, rng: Any) -> None:
        """Draw all later noise from ``rng`` (resolved like the constructor's).

        The state is unchanged, so this equals ``from_state(to_state(), rng)``
        without the round trip; a release DoFn gives every step its own keyed
        source this way.
        """
        self._source = make_noise(rng)

    def _draw(self, scale, count):
        """``count`` noise vectors of length dim, drawn in one call (order is part of the state)."""
        size = count * self._dim
        if self._noise == "laplace":
            values = self._source.laplace(scale, size)
        else:
            values = self._source.gaussian(scale, size)
        return values.reshape(count, self._dim)

    # -- stepping ---------------------------------------------------------------------

    def step(self, x: Union[float, np.ndarray]) -> Union[float, np.ndarray]:
        """Consume the next element x and return the noisy prefix sum through it.

        x is a number (dim 1) or an array of shape ``(dim,)``, finite. Returns
        a float when ``dim == 1``, else a new array of shape ``(dim,)``.
        """
        arr = self._check_x(x)
        t = self._t + 1
        if self._horizon is not None:
            if t > self._horizon:
                raise ValueError(f"horizon exceeded: horizon is {self._horizon}, step {t} requested")
            plan = self._plan_of(self._horizon)
            self._core_step(plan, self._core, arr, self._scale(self._horizon))
            self._t = t
            return self._output(self._core_release(plan, self._core))
        k, start, length = self._epoch_of(t)
        plan = self._plan_of(length)
        if t == start:
            self._core = self._core_new(plan)
        self._core_step(plan, self._core, arr, self._scale(length))
        self._t = t
        value = self._roots + self._core_release(plan, self._core)
        if t == start + length - 1:
            self._roots = value
            self._core = None
        return self._output(value)

    def current(self) -> Union[float, np.ndarray]:
        """The current release without consuming input (0 before the first step)."""
        if self._core is None:
            value = self._roots if self._roots is not None else np.zeros(self._dim)
        else:
            horizon = self._horizon if self._horizon is not None else self._epoch_of(self._t)[2]
            value = self._core_release(self._plan_of(horizon), self._core)
            if self._roots is not None:
                value = self._roots + value
        return self._output(value)

    # -- serialisation ------------------------------------------------------------------

    def to_state(self) -> Dict[str, Any]:
        """Plain dict (ints, floats, strings, lists, None) holding everything
        needed to continue; JSON- and pickle-friendly. The noise source is not
        included: a restored mechanism gets its own (:meth:`from_state`)."""
        core = None if self._core is None else self._core_to_state(self._core)
        return FactorisationState(**self._state_header(), core=core, roots=self._roots).to_state()

    @classmethod
    def from_state(cls, state: dict, rng: Any = None) -> "FactorisationMechanism":
        """Rebuild a mechanism from :meth:`to_state` output.

        ``rng`` is resolved like the constructor's (None → secure noise). With
        a noise source positioned where the original's was, the restored
        mechanism releases exactly what the original would have.
        """
        mech, t, record = restore_parameters(cls, state, rng, FactorisationState)
        core, roots = record.core, record.roots
        if mech._horizon is not None:
            if t > mech._horizon:
                raise ValueError(f"state t={t} exceeds horizon {mech._horizon}")
            if core is None or roots is not None:
                raise ValueError("state of a bounded mechanism needs core and no roots")
            horizon, local = mech._horizon, t
        else:
            horizon, local = mech._restore_epochs(t, core, roots)
        if core is None:
            mech._core = None
        else:
            if not isinstance(core, dict):
                raise ValueError("state core must be a dict")
            try:
                mech._core = mech._core_from_state(mech._plan_of(horizon), core, local)
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"state core is invalid: {err}") from None
        mech._t = t
        return mech

    def _restore_epochs(self, t, core, roots):
        """Restore the roots of an unbounded mechanism at step t; ``(epoch length, local t)``
        of the open epoch the core belongs to (``(None, None)`` between epochs)."""
        if roots is None:
            raise ValueError("state of an unbounded mechanism needs roots")
        roots_arr = np.asarray(roots, dtype=np.float64)
        if roots_arr.shape != (self._dim,) or not np.all(np.isfinite(roots_arr)):
            raise ValueError(f"state roots must be {self._dim} finite floats")
        self._roots = roots_arr.copy()
        epoch_open = False
        if t:
            k, start, length = self._epoch_of(t)
            epoch_open = t != start + length - 1
        if (core is not None) != epoch_open:
            raise ValueError(f"state core does not match t={t} of an unbounded mechanism")
        if not epoch_open:
            return None, None
        return length, t - start + 1

    @staticmethod
    def _array(data, shape, what):
        arr = np.asarray(data, dtype=np.float64)
        if arr.shape != shape or not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} must be finite floats of shape {shape}")
        return arr.copy()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(epsilon={self._epsilon!r}, sensitivity={self._sensitivity!r}, "
            f"horizon={self._horizon!r}, noise={self._noise!r}, delta={self._delta!r}, "
            f"dim={self._dim!r}, calibration={self._calibration!r}, t={self._t})"
        )
