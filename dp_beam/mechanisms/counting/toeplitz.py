"""The square-root Toeplitz factorisation of the prefix-sum matrix.

A_T = C·C with C the lower-triangular Toeplitz matrix of the coefficients of
``(1 − x)^{−1/2}``, ``c_i = binom(2i, i)/4^i`` (Fichtenberger, Henzinger,
Upadhyay 2023, "Constant matters: fine-grained error bound on differentially
private continual observation", ICML 2023; Henzinger, Upadhyay, Upadhyay
2023, SODA, for its near-optimality: within ``1 + o(1)`` of the optimal
factorisation for max error).

The privacy argument is ``docs/privacy/counting.md``, C-8, C-9 and C-13.
"""

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from ..state import StateRecord
from .factorisation import FactorisationMechanism
from .integer_units import dyadic, from_units, round_div_pow2, to_units
from .participation import toeplitz_participation_norm

__all__ = ["SqrtToeplitzCoreState", "SqrtToeplitzMechanism", "sqrt_toeplitz_coefficients"]


@dataclasses.dataclass(frozen=True)
class SqrtToeplitzCoreState(StateRecord):
    """The core of a :class:`SqrtToeplitzMechanism`'s state: the epoch's inputs in integer units
    (lists of ints, exact) and their noised values, one row per step of the epoch."""

    units: Any
    noised: Any


def sqrt_toeplitz_coefficients(n: int) -> np.ndarray:
    """``c_0 … c_{n−1}`` of ``(1 − x)^{−1/2}``: ``c_0 = 1``, ``c_i = c_{i−1}(2i − 1)/(2i)``."""
    ratios = (2.0 * np.arange(1, n) - 1.0) / (2.0 * np.arange(1, n))
    return np.concatenate([[1.0], np.cumprod(ratios)])[:n]


class _Plan:
    def __init__(self, horizon):
        self.horizon = horizon
        self.coef = sqrt_toeplitz_coefficients(horizon)
        # Reversed once, so the release is a dot product with a suffix.
        self.reversed = self.coef[::-1].copy()
        self.cum_sq = np.cumsum(self.coef * self.coef)
        self.l2 = math.sqrt(float(self.cum_sq[-1]))
        self.l1 = None
        # C in integers (EXACT = "right_factor"): the float coefficients as
        # exact dyadic rationals over one power of two, reversed like
        # ``reversed``; a dot product with them is exact, so the only
        # rounding is the final one to a unit (half a unit).
        numerators, self.coef_bits = dyadic(self.coef)
        self.reversed_num = np.array(numerators[::-1], dtype=object)
        self.err_units = 0.5


class SqrtToeplitzMechanism(FactorisationMechanism):
    """Prefix sums as ``A x + C z`` with ``C² = A`` (the factorisation mechanism with B = R = C).

    Releasing ``y = C x + z`` and post-processing by C gives ``C(Cx + z) = Ax + Cz``:
    the release at step t is ``Σ_{s<=t} c_{t−s} y_s``, i.e. the exact sum plus
    ``Σ_{s<=t} c_{t−s} z_s``. y is computed in integers (exact ``C x``, one
    rounding to a unit far below the noise, the keyed source's exact discrete
    Gaussian z; see ``FactorisationMechanism._exact_exponent``), so the
    accountant's Gaussian mechanism is exactly what runs and the float
    release is its post-processing. σ is calibrated for the largest column norm of C,
    ``√(Σ_{i<T} c_i²)·Δ``; the release at t has std ``σ·√(Σ_{i<t} c_i²)``,
    exact. In unit-sensitivity σ the max is ``Σ_{i<T} c_i² ≈ 1 + (ln T + γ +
    ln 4)/π`` (3.273 at ``T = 2^10``, 4.596 at ``2^16``).

    State: every past input in integer units and every past y,
    ``2t·dim`` numbers, i.e. O(T): this mechanism is for short horizons
    and exists as the near-optimal reference that BLT approximates with O(1)
    state. Per step O(t·dim). Horizons above :attr:`MAX_HORIZON` = 2^14 are
    refused (``ValueError`` naming ``horizon``); at the limit the state is
    128 KiB per coordinate. The state holds exact sums and the noise; store it
    like the data.

    Laplace noise is refused: the L1 column norm ``Σ c_i`` grows like
    ``2√(T/π)``.

    Unbounded streams: epochs of ``2^k`` steps (C-6) up to
    2^14, then epochs of 2^14 steps each; every epoch is calibrated for the
    whole Δ, so the accounting argument of C-6 holds unchanged, but past
    2^14 steps the variance grows linearly (one ``Σ c_i²`` per epoch).

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import SqrtToeplitzMechanism, BinaryTreeMechanism, ZeroNoise
    >>> m = SqrtToeplitzMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise(), noise="gaussian", delta=1e-6)
    >>> [round(m.step(x), 6) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> round(m.noise_std(3), 2), round(BinaryTreeMechanism(epsilon=1.0, horizon=8, noise="gaussian", delta=1e-6).noise_std(3), 2)
    (8.27, 15.13)
    """

    name = "sqrt_toeplitz"
    STATE_VERSION = 2
    LAPLACE = False
    EXACT = "right_factor"
    MAX_HORIZON = 1 << 14

    @classmethod
    def _laplace_refusal(cls):
        return "the L1 norm of the (1-x)^(-1/2) column grows like sqrt(T), so Laplace noise would be far worse than the tree"

    @staticmethod
    @functools.lru_cache(maxsize=32)
    def _plan(horizon):
        return _Plan(horizon)

    @staticmethod
    def _var_factor(plan, t):
        return float(plan.cum_sq[t - 1])

    def _core_new(self, plan):
        rows = min(plan.horizon, 16)
        return {
            "count": 0,
            "units": np.zeros((rows, self._dim), dtype=object),
            "noised": np.zeros((rows, self._dim)),
        }

    def _core_step(self, plan, core, x, scale):
        count = core["count"]
        if count == core["noised"].shape[0]:
            # Grow geometrically so that appending stays amortised O(dim).
            rows = min(plan.horizon, 2 * count)
            units = np.zeros((rows, self._dim), dtype=object)
            units[:count] = core["units"][:count]
            noised = np.zeros((rows, self._dim))
            noised[:count] = core["noised"][:count]
            core["units"], core["noised"] = units, noised
        # y_t = (C x)_t + z_t in integer units of 2^e
        # (FactorisationMechanism._exact_exponent); the object dot product
        # multiplies Python ints, so (C x)_t is exact before its one rounding.
        exponent = self._exact_exponent(plan)
        core["units"][count] = to_units(x, exponent)
        weights = plan.reversed_num[plan.horizon - count - 1:]
        acc = weights @ core["units"][: count + 1]
        noise = self._integer_noise(scale, exponent)
        y = [round_div_pow2(int(a), plan.coef_bits) + z for a, z in zip(acc, noise)]
        core["noised"][count] = from_units(y, exponent)
        core["count"] = count + 1

    def _core_release(self, plan, core):
        # Post-processing of y: the release is (C y)_t = (A x)_t + (C z)_t.
        count = core["count"]
        if count == 0:
            return np.zeros(self._dim)
        weights = plan.reversed[plan.horizon - count:]
        # Elementwise products, then their running sum from the oldest step on (an
        # accumulation is sequential: each sum rounded once, in that order), so the same
        # bits on every CPU. A BLAS product sums in an order, and with fused multiply-adds,
        # that its kernel picks by CPU: OpenBLAS's Nehalem, Sandy Bridge and Haswell
        # kernels released three different values of one stream.
        products = weights[:, None] * core["noised"][:count]
        return np.add.accumulate(products, axis=0)[-1]

    @staticmethod
    def _core_floats(core):
        return 2 * core["count"] * core["noised"].shape[1]

    @staticmethod
    def _core_to_state(core):
        count = core["count"]
        return SqrtToeplitzCoreState(units=[[int(v) for v in row] for row in core["units"][:count]],
                                     noised=core["noised"][:count]).to_state()

    def _core_from_state(self, plan, data, local):
        record = SqrtToeplitzCoreState.from_state(data)
        units = record.units
        if (not isinstance(units, list) or len(units) != local
                or any(not isinstance(row, list) or len(row) != self._dim for row in units)
                or any(isinstance(v, bool) or not isinstance(v, int) for row in units for v in row)):
            raise ValueError(f"state units must be {local} lists of {self._dim} ints")
        rows = max(min(plan.horizon, 16), local)
        core = self._core_new(plan)
        core["units"] = np.zeros((rows, self._dim), dtype=object)
        core["noised"] = np.zeros((rows, self._dim))
        if local:
            core["units"][:local] = np.array(units, dtype=object).reshape(local, self._dim)
            core["noised"][:local] = self._array(record.noised, (local, self._dim), "noised")
        core["count"] = local
        return core

    @classmethod
    def right_factor(cls, horizon: int) -> np.ndarray:
        """The T×T matrix C (for tests)."""
        c = sqrt_toeplitz_coefficients(horizon)
        return np.array([[c[i - j] if i >= j else 0.0 for j in range(horizon)] for i in range(horizon)])

    @classmethod
    def participation_norm(cls, horizon: int, k: int, b: int) -> float:
        """``max_P ‖Σ_{s∈P} C[:, s]‖₂`` by the greedy pattern (c is positive
        and non-increasing; :func:`~dp_beam.mechanisms.counting.participation.toeplitz_participation_norm`)."""
        if horizon > cls.MAX_HORIZON:
            raise ValueError(f"horizon must be <= {cls.MAX_HORIZON} for {cls.name}, got {horizon}")
        return toeplitz_participation_norm(sqrt_toeplitz_coefficients(horizon), k, b)
