"""Buffered linear Toeplitz (BLT) mechanism for continual counting.

Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024, "Efficient and
near-optimal noise generation for streaming differential privacy"
(FOCS 2024; arXiv:2404.16706): BLT matrices, their inverses and O(d)
streaming, and "Opt-BLT", parameters optimised for the max-error objective. The right factor C is the
lower-triangular Toeplitz matrix with generating function

    c(x) = 1 + Σ_{j<d} ω_j x / (1 − θ_j x),   i.e. c_0 = 1, c_i = Σ_j ω_j θ_j^{i−1},

and the release is ``B (C x + z) = A x + A C⁻¹ z``: the noise added at step t
is ``(C⁻¹ z)_t``, which d buffers generate (C⁻¹ is again of this form; we
stream it directly from ``z = C y``: ``y_t = z_t − ωᵀ s_t``,
``s_{t+1} = diag(θ) s_t + y_t``). With ``d = 3 … 5`` buffers the max error
is within about 1.1× of the best any factorisation can do (the paper's
Table 1); the shipped parameters give a max std of 3.273 / 4.602 / 5.506 σ at
T = 2^10 / 2^16 / 2^20 against the lower bound 2.910 / 4.232 / 5.115 σ.

The privacy argument is ``docs/privacy/counting.md``, C-8, C-9 and C-12.
"""

import dataclasses
import functools
import math
import operator
import threading
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
from scipy import optimize

from ..state import StateRecord
from .factorisation import FactorisationMechanism
from .integer_units import Lanes, dyadic, from_unit, from_units, round_div_pow2, to_unit, to_units
from .lockstep import Lockstep
from .participation import toeplitz_participation_norm

__all__ = ["BLTCoreState", "BLTMechanism", "LockstepBLT", "blt_errors", "optimise_blt",
           "blt_parameters"]


@dataclasses.dataclass(frozen=True)
class BLTCoreState(StateRecord):
    """The core of a :class:`BLTMechanism`'s state: the integer buffers of the right factor
    (lists of ints, exact, unpacked), the float buffers of its inverse and the running release."""

    right: Any
    buffers: Any
    total: Any


def _geometric(q, n):
    """``Σ_{i<n} q^i`` elementwise for complex q (n may be 0)."""
    q = np.asarray(q, dtype=np.complex128)
    out = np.full(q.shape, float(n), dtype=np.complex128)
    far = np.abs(1.0 - q) > 1e-13
    with np.errstate(divide="ignore", invalid="ignore"):
        qq = q[far]
        # q^n via exp(n log q) loses nothing for |q| <= 1 and is vectorised;
        # q = 0 has log −inf and exp(−inf) = 0, as it should.
        out[far] = -np.expm1(n * np.log(qq)) / (1.0 - qq) if n > 0 else 0.0
    return out


#: Row norms a plan remembers (a year of hourly steps is 8,760).
_B_SQ_CACHE = 1 << 16


class _Closed:
    """Closed forms of ``Σ_{i<n} c_i²`` and ``Σ_{i<n} b_i²`` (b = row of B = A C⁻¹).

    C⁻¹ has coefficients ``d_0 = 1``, ``d_i = −ωᵀ M^{i−1} 1`` with
    ``M = diag(θ) − 1ωᵀ``; diagonalising M gives ``d_i = −Σ_j u_j λ_j^{i−1}``
    and the partial sums ``b_i = β_0 + Σ_j β_j λ_j^i`` with
    ``β_j = u_j/(1 − λ_j)``, ``β_0 = 1 − Σ β_j``. Sums of squares of
    exponential sums are sums of geometric series: O(d²) work for any n.
    """

    def __init__(self, theta, omega):
        self.theta = np.asarray(theta, dtype=np.float64)
        self.omega = np.asarray(omega, dtype=np.float64)
        d = self.theta.size
        m = np.diag(self.theta) - np.outer(np.ones(d), self.omega)
        lam, vec = np.linalg.eig(m)
        u = (self.omega @ vec) * np.linalg.solve(vec, np.ones(d))
        beta = u / (1.0 - lam)
        self.radius = float(np.max(np.abs(lam))) if d else 0.0
        self.coef = np.concatenate([[1.0 - beta.sum()], beta])
        self.base = np.concatenate([[1.0], lam])
        self._b_sq = {}  # n → b_sq(n), shared by every stream of this plan
        # What _geometric(outer(base, base), n) computes before it uses n: every
        # step asks for a new n, and these are the same for all of them.
        q = np.outer(self.base, self.base).astype(np.complex128)
        self._far = np.abs(1.0 - q) > 1e-13
        with np.errstate(divide="ignore", invalid="ignore"):
            self._log_far = np.log(q[self._far])
        self._gap_far = 1.0 - q[self._far]
        self._coef_sq = np.outer(self.coef, self.coef)

    def c_sq(self, n):
        if n <= 0:
            return 0.0
        w = self.omega
        return 1.0 + float(np.real(np.sum(np.outer(w, w) * _geometric(np.outer(self.theta, self.theta), n - 1))))

    def b_sq(self, n):
        # Every stream with this plan asks for the same n at the same step:
        # remember the answers (a float each; bounded like the horizons).
        cache = self._b_sq
        value = cache.get(n)
        if value is None:
            # _geometric(outer(base, base), n) with its n-free part computed once.
            sums = np.full(self._far.shape, float(n), dtype=np.complex128)
            with np.errstate(divide="ignore", invalid="ignore"):
                sums[self._far] = -np.expm1(n * self._log_far) / self._gap_far if n > 0 else 0.0
            value = float(np.real(np.sum(self._coef_sq * sums)))
            if len(cache) >= _B_SQ_CACHE:
                cache.clear()
            cache[n] = value
        return value


def blt_errors(theta: Sequence[float], omega: Sequence[float], horizon: int) -> Tuple[float, float]:
    """``(column norm ‖c_{0:T}‖₂, max row norm ‖b_{0:T}‖₂)`` of a BLT; their
    product is the max per-step std in unit-sensitivity σ."""
    closed = _Closed(theta, omega)
    return math.sqrt(closed.c_sq(horizon)), math.sqrt(max(closed.b_sq(horizon), 0.0))


def _unpack(p, d):
    theta = 1.0 / (1.0 + np.exp(-p[:d]))
    omega = np.exp(p[d:])
    return theta, omega


def _objective(p, horizon, d):
    theta, omega = _unpack(p, d)
    closed = _Closed(theta, omega)
    value = closed.c_sq(horizon) * closed.b_sq(horizon)
    if not np.isfinite(value) or value <= 0:
        return 1e6
    # |λ| >= 1 makes the noise buffers grow without bound (and the closed
    # form ill-conditioned); the optimum is well inside.
    penalty = 1e3 * (closed.radius - 0.999999) if closed.radius > 0.999999 else 0.0
    return 0.5 * math.log(value) + penalty


def optimise_blt(
    horizon: int, buffers: Sequence[int] = (3, 4, 5), restarts: int = 4, start_stream: int = 0
) -> Optional[Dict[str, Any]]:
    """BLT parameters minimising the max per-step std over ``horizon`` steps.

    Minimises ``‖c‖₂ · max_t ‖B[t]‖₂`` (the paper's max-error objective;
    ``‖B[t]‖`` is largest at t = T because B is lower-triangular Toeplitz)
    over ``θ ∈ (0, 1)^d`` and ``ω > 0`` (logit/log parametrised) with
    Nelder-Mead followed by BFGS, from ``restarts`` starts per buffer count
    with ``1 − θ`` log-spaced over ``[2/T, 1/2]``. Deterministic for a given
    ``start_stream`` (it picks the optimiser's random restart points; it has
    nothing to do with privacy noise), so the shipped table is reproducible.
    Returns ``{"theta", "omega", "max_std"}``.
    """
    best = None
    for d in buffers:
        for trial in range(restarts):
            rng = np.random.default_rng(start_stream * 1000 + 10 * d + trial)
            gaps = np.geomspace(2.0 / max(horizon, 4), 0.5, d) * np.exp(rng.normal(0.0, 0.2, d))
            gaps = np.clip(gaps, 1e-9, 0.9)
            theta0 = 1.0 - gaps
            p0 = np.concatenate([np.log(theta0 / gaps), np.log(0.5 * gaps)])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = optimize.minimize(
                    _objective, p0, args=(horizon, d), method="Nelder-Mead",
                    options={"maxiter": 20000, "maxfev": 20000, "xatol": 1e-10, "fatol": 1e-12},
                )
                res = optimize.minimize(_objective, res.x, args=(horizon, d), method="BFGS")
            theta, omega = _unpack(res.x, d)
            col, row = blt_errors(theta, omega, horizon)
            if _Closed(theta, omega).radius >= 1.0:
                continue
            if best is None or col * row < best["max_std"]:
                best = {"theta": theta.tolist(), "omega": omega.tolist(), "max_std": col * row}
    return best


@functools.lru_cache(maxsize=64)
def blt_parameters(horizon: int) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """``(theta, omega)`` for a horizon: the shipped table (``blt_table.py``,
    generated by ``benchmarks/make_blt_table.py``) for 2^10, 2^12, …, 2^20, and for any
    other horizon the entry of the smallest tabulated one above it (the largest past
    the table), as the epochs of an unbounded stream.

    Never optimised at run time: the optimiser's floats depend on the CPU's BLAS and
    SIMD kernels, and parameters (hence noise scales) that differ between two workers
    would let a replay on the other one draw different noise. Little is lost: at 12
    horizons from 2 to 100,000 steps the tabulated parameters' max std was within 0.1 %
    of :func:`optimise_blt` (4 and 5 buffers, one start) for the horizon itself (below
    it at 8,760, 20,000 and 100,000)."""
    from .blt_table import BLT_TABLE

    entry = BLT_TABLE.get(horizon)
    if entry is None:
        entry = BLT_TABLE[_table_horizon(horizon)]
    return tuple(entry["theta"]), tuple(entry["omega"])


@functools.lru_cache(maxsize=1024)
def _table_horizon(horizon):
    """Smallest tabulated horizon >= horizon (the largest one past the table)."""
    from .blt_table import BLT_TABLE

    larger = [h for h in BLT_TABLE if h >= horizon]
    return min(larger) if larger else max(BLT_TABLE)


def _column_sq(theta, omega, n):
    """``Σ_{i<n} c_i²`` of the column ``c_0 = 1``, ``c_i = Σ_j ω_j θ_j^(i−1)``, on Python
    floats: ``1 + Σ_{j,k} ω_j ω_k Σ_{i<n−1} (θ_j θ_k)^i``, the geometric sums in closed form.

    What :meth:`_Closed.c_sq` computes (to rounding) without NumPy's complex loops, so
    that the noise scale calibrated from it has the same bits on every machine.
    """
    if n <= 0:
        return 0.0
    m = n - 1
    total = 0.0
    for wj, tj in zip(omega, theta):
        for wk, tk in zip(omega, theta):
            q = tj * tk
            if m == 0:
                geometric = 0.0
            elif abs(1.0 - q) <= 1e-13:
                geometric = float(m)
            else:
                geometric = -math.expm1(m * math.log(q)) / (1.0 - q)
            total += wj * wk * geometric
    return 1.0 + total


class _RowNorms:
    """``Σ_{i<n} b_i²`` of a plan (b = row of B = A C⁻¹: the release's noise in units of σ),
    by the recurrence of C⁻¹ on Python floats and kept as it grows.

    :class:`_Closed` gets the same sums (to rounding) for any n from an eigen-decomposition,
    which LAPACK computes with the CPU's BLAS kernels: a reported noise std (and the mean's
    activation bound read from it) would then differ in its last bits between workers.
    Here ``d_0 = 1``, ``d_i = −ω·v_(i−1)``, ``v_i = θ∘v_(i−1) + d_i`` (``v_0 = 1``, so
    ``v_i = M^i 1`` with ``M = diag(θ) − 1ωᵀ``) and ``b_i = b_(i−1) + d_i``, each product and
    sum rounded once in a fixed order. Streams of a plan ask for t = 1, 2, …, so each
    answer costs O(d) once per process; a smaller n than the last starts over.
    """

    def __init__(self, theta, omega):
        self._theta = [float(v) for v in theta]
        self._omega = [float(v) for v in omega]
        self._cache = {}
        self._lock = threading.Lock()   # release DoFns in threads share a plan
        self._start()

    def _start(self):
        self._n = 0                     # terms summed
        self._v = [1.0] * len(self._theta)
        self._b = 0.0
        self._sum = 0.0

    def __call__(self, n):
        value = self._cache.get(n)
        if value is not None:
            return value
        with self._lock:
            if n < self._n:
                self._start()
            theta, omega = self._theta, self._omega
            v, b, total = self._v, self._b, self._sum
            for i in range(self._n, n):
                if i == 0:
                    d = 1.0
                else:
                    acc = 0.0
                    for w, x in zip(omega, v):
                        acc += w * x
                    d = -acc
                    v = [th * x + d for th, x in zip(theta, v)]
                b += d
                total += b * b
            self._n = max(self._n, n)
            self._v, self._b, self._sum = v, b, total
            value = total if n > 0 else 0.0
            if len(self._cache) >= _B_SQ_CACHE:
                self._cache.clear()
            self._cache[n] = value
        return value


class _Plan:
    def __init__(self, horizon, theta, omega):
        self.horizon = horizon
        self.theta = np.asarray(theta, dtype=np.float64)
        self.omega = np.asarray(omega, dtype=np.float64)
        #: θ as a column, to scale the (d, dim) float buffers in place.
        self.theta_column = self.theta[:, None]
        self.buffers = self.theta.size
        # The column norm (it calibrates the noise) and the row norms on Python floats:
        # the same bits on every machine (_column_sq, _RowNorms).
        self.l2 = math.sqrt(_column_sq(self.theta.tolist(), self.omega.tolist(), horizon))
        self.row_sq = _RowNorms(self.theta, self.omega)
        self.l1 = None
        # The right factor C in integer arithmetic (EXACT = "right_factor"):
        # θ and ω as exact dyadic rationals, and the bound on the rounding of
        # the integer buffers: buffer i carries an error e with
        # |e| <= 1/(2(1 − θ_i)) (each step adds at most 1/2 and shrinks the
        # old error by θ_i), so (C x)_t is off by at most
        # 1/2 + Σ |ω_i|/(2(1 − θ_i)) units. A buffer with θ_i = 1 (the
        # optimiser returns it for some horizons) is never rounded: its
        # products are exact, so it adds nothing.
        if not all(0.0 < th <= 1.0 for th in self.theta):
            raise ValueError(f"theta must lie in (0, 1] for a stable BLT, got {tuple(self.theta)}")
        self.theta_num, self.theta_bits = dyadic(self.theta)
        self.omega_num, self.omega_bits = dyadic(self.omega)
        #: ω as Python floats, the weights of :func:`_weighted_rows`.
        self.omega_list = self.omega.tolist()
        self.theta_list = self.theta.tolist()
        decaying = self.theta < 1.0
        self.err_units = 0.5 + float(np.sum(np.abs(self.omega[decaying]) / (2.0 * (1.0 - self.theta[decaying]))))

    def column(self):
        """``c_0 … c_(T−1)``: ``c_0 = 1``, ``c_i = Σ_j ω_j θ_j^(i−1)``. The powers are running
        products and the sum runs over j in order, all elementwise (IEEE-rounded per
        operation): the same bits on every machine, unlike NumPy's dispatched ``power``."""
        powers = np.empty((max(self.horizon - 1, 0), self.buffers))
        if powers.shape[0]:
            powers[0] = 1.0
            powers[1:] = self.theta
            np.cumprod(powers, axis=0, out=powers)
        return np.concatenate([[1.0], _weighted_rows(self.omega_list, powers.T)])


def _weighted_rows(weights, rows):
    """``Σ_j weights[j]·rows[j]`` for the rows of a (d, dim) array (or the floats of a list),
    left to right, every product and sum rounded once as IEEE-754 prescribes.

    The same bits on every machine: a BLAS product (``@``, ``dot``) picks its kernel by
    CPU, and the kernels differ in summation order and in fused multiply-adds (OpenBLAS's
    Haswell and Sandy Bridge kernels gave different releases of one stream), so a
    replay on another worker's CPU would not release the same value.
    """
    acc = weights[0] * rows[0]
    for j in range(1, len(weights)):
        acc = acc + weights[j] * rows[j]
    return acc


def _sync_floats(core):
    """Write a scalar core's floats, kept in a list by :meth:`BLTMechanism._scalar_core_step`,
    back to its arrays (the buffers, then the running release), for the array paths."""
    floats = core.pop("floats", None)
    if floats is not None:
        core["buffers"][:, 0] = floats[:-1]
        core["total"][0] = floats[-1]


@functools.lru_cache(maxsize=64)
def _horizon_plan(length):
    """The plan of a horizon (or an unbounded stream's epoch) of ``length`` steps, made once:
    a step looks it up by its length (``blt_parameters(h)`` is the table entry of
    ``_table_horizon(h)``, tabulated or not)."""
    theta, omega = blt_parameters(_table_horizon(length))
    return _Plan(length, theta, omega)


#: Spare bits of a packed lane: the buffers may grow 2^32-fold before they are repacked wider.
_SPARE_BITS = 32


def _round_all(values, bits):
    """:func:`~.integer_units.round_div_pow2` of every value (ties to even)."""
    if bits <= 0:
        return [v << -bits for v in values]
    half = (1 << (bits - 1)) - 1
    return [(v + half + ((v >> bits) & 1)) >> bits for v in values]


def _packable(plan):
    """Whether :class:`_Packing` applies: its lanes need ω >= 0 and fractional units (the
    tabulated plans; about twice as fast as lists from dim 1 on)."""
    return plan.omega_bits > 0 and plan.theta_bits > 0 and all(w >= 0 for w in plan.omega_num)


class _Packing:
    """The d integer buffers of a plan, each packed into one int (:class:`Lanes`).

    Lane j of a buffer holds ``v + 2^bits`` for the buffer's value v, with
    ``|v| < 2^bits``; the lanes are wide enough for ``Σ_i ω_i (v_i + 2^bits)``
    and ``θ_i (v_i + 2^bits)`` in units of ``2^-omega_bits`` and
    ``2^-theta_bits``. The offset is an even multiple of both units
    (``bits > max(omega_bits, theta_bits)``), so rounding a lane (ties to even)
    rounds v and shifts the result by the offset's exact image: every lane
    follows the list recurrence of :meth:`BLTMechanism._list_step` bit for bit.
    """

    def __init__(self, plan, dim, bits):
        bits = max(bits, plan.omega_bits + 1, plan.theta_bits + 1)
        self.bits, self.offset = bits, 1 << bits
        total_omega = sum(plan.omega_num)
        width = max(total_omega.bit_length(), plan.theta_bits + 1) + bits + 2
        self.lanes = lanes = Lanes(dim, -(-width // 8) * 8)
        self._rep_offset = lanes.rep(self.offset)
        #: Σ ω_i·2^bits in units of 2^-omega_bits: what a rounded ω-lane carries.
        self.omega_offset = (total_omega << bits) >> plan.omega_bits
        # Added to a rounded θ_i-lane (offset θ_i·2^bits) and to units packed with
        # offset 2^(width−1): leaves the offset 2^bits.
        self.addends = [lanes.rep(self.offset - ((th << bits) >> plan.theta_bits)) - lanes.half
                        for th in plan.theta_num]

    def pack(self, values):
        return self.lanes.pack_signed(values) + self._rep_offset

    def unpack(self, packed):
        offset = self.offset
        return [v - offset for v in self.lanes.unpack(packed)]


@functools.lru_cache(maxsize=256)
def _packing(plan, dim, bits):
    return _Packing(plan, dim, bits)


class BLTMechanism(FactorisationMechanism):
    """Prefix sums with BLT-correlated Gaussian noise (Dvijotham et al. 2024).

    Step t adds ``x_t + y_t`` to a running sum and releases it, where
    ``y = C⁻¹ z`` for i.i.d. ``z_t ~ N(0, σ²)`` and C the BLT matrix of
    :func:`blt_parameters` (d = 3 … 5 buffers). Equivalent to releasing
    ``C x + z`` and post-processing by ``B = A C⁻¹``, so σ is calibrated for
    the largest column norm of C, ``‖c_{0:T}‖₂·Δ`` (the first column; the
    others are its truncations). Release noise std: ``σ·√(Σ_{i<t} b_i²)``,
    exact, by the closed form of ``_Closed``; largest at t = T:
    3.278 σ at ``T = 2^10`` with unit L2 sensitivity.

    Laplace noise is refused: the L1 norm of c grows like ``√T`` (c
    approximates the coefficients of ``(1−x)^{−1/2}``), so Laplace calibration
    would cost a factor ~``√T/log T`` over the tree.

    Exact computation (the reason for ``EXACT = "right_factor"``): the noised
    vector ``C x + z`` is computed in integers, in units of a public power of
    two far below the noise (``FactorisationMechanism._exact_exponent``), with
    z the exact discrete Gaussian of the keyed source, so the accountant's
    Gaussian mechanism is exactly what runs; ``C⁻¹`` and the running sum are
    its post-processing, done in floats. Adding float noise to the exact sum
    instead would let the low-order bits of the release depend on the data.
    The integer rounding costs a relative ``2^-20`` of sensitivity. Each
    integer buffer is kept packed in one int (``_Packing``), so a step costs a
    few big-int operations per buffer rather than a few per coordinate, with
    the same bits. A scalar stream stepped with floats (a release: one per
    stream and step) keeps its d ints unpacked and steps on Python numbers
    (``_step_scalar``), again with the same bits.

    State: d integer buffers of the data side, d float buffers of the
    post-processing and the running release, ``(2d + 1)·dim`` numbers (at
    most ``11·dim``), independent of T. The integer buffers are exact
    weighted sums of the data and must be stored like it. Per step: one
    noise vector, O(d·dim).

    Unbounded streams: epochs of ``2^k`` steps (C-6), each with
    the tabulated parameters of the smallest table horizon >= ``max(2^k,
    2^10)`` (the largest, 2^20, beyond the table), calibrated for the epoch's
    own column norm; any θ, ω give a valid mechanism, the table choice only
    avoids optimising at run time.

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import BLTMechanism, BinaryTreeMechanism, ZeroNoise
    >>> m = BLTMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise(), noise="gaussian", delta=1e-6)
    >>> [round(m.step(x), 6) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> round(m.noise_std(3), 2), round(BinaryTreeMechanism(epsilon=1.0, horizon=8, noise="gaussian", delta=1e-6).noise_std(3), 2)
    (8.26, 15.13)
    """

    name = "blt"
    STATE_VERSION = 2
    LAPLACE = False
    EXACT = "right_factor"

    @classmethod
    def _laplace_refusal(cls):
        return "the L1 norm of the BLT column grows like sqrt(T), so Laplace noise would be far worse than the tree"

    @staticmethod
    def _plan(horizon):
        return _horizon_plan(horizon)

    @staticmethod
    def _var_factor(plan, t):
        return plan.row_sq(t)

    def _core_new(self, plan):
        core = {"buffers": np.zeros((plan.buffers, self._dim)), "total": np.zeros(self._dim)}
        self._set_right(plan, core, [[0] * self._dim for _ in range(plan.buffers)])
        return core

    def _set_right(self, plan, core, right):
        """Store the integer buffers (lists of ints) in the core, packed when the plan allows
        and there is more than one coordinate (a single lane would pack nothing, and a scalar
        stream's :meth:`_scalar_right_step` works on the ints as they are)."""
        if not _packable(plan) or self._dim == 1:
            core["right"] = right
            return
        bound = max((abs(v) for buf in right for v in buf), default=0)
        packing = _packing(plan, self._dim, bound.bit_length() + _SPARE_BITS)
        core.update(packing=packing, packed=[packing.pack(buf) for buf in right], bound=bound)

    @staticmethod
    def _right(core):
        """The integer buffers as lists of ints."""
        if "right" in core:
            return core["right"]
        return [core["packing"].unpack(buf) for buf in core["packed"]]

    @staticmethod
    def _list_step(plan, right, units, noise):
        """One step of the integer buffers kept as lists: ``(C x)_t + z_t``."""
        acc = [0] * len(units)
        for w, buf in zip(plan.omega_num, right):
            acc = [a + w * v for a, v in zip(acc, buf)]
        noised = [u + a + z for u, a, z in zip(units, _round_all(acc, plan.omega_bits), noise)]
        for th, buf in zip(plan.theta_num, right):
            buf[:] = [r + u for r, u in zip(_round_all([th * v for v in buf], plan.theta_bits), units)]
        return noised

    def _packed_step(self, plan, core, units, noise):
        """:meth:`_list_step` on packed buffers: a few big-int operations per buffer."""
        # |round(θv) + u| <= |v| + |u| (θ <= 1): a bound on every new buffer value.
        bound = core["bound"] + max(map(abs, units))
        if bound >= core["packing"].offset:  # repack wider (rare: 2^32-fold growth)
            right = self._right(core)
            core["packing"] = _packing(plan, self._dim, bound.bit_length() + _SPARE_BITS)
            core["packed"] = [core["packing"].pack(buf) for buf in right]
        packing, buffers = core["packing"], core["packed"]
        lanes = packing.lanes
        acc = lanes.unpack(lanes.round_shift(sum(map(operator.mul, plan.omega_num, buffers)), plan.omega_bits))
        shift = packing.omega_offset
        noised = [u + a - shift + z for u, a, z in zip(units, acc, noise)]
        packed_units = lanes.pack_offset(units)
        tb = plan.theta_bits
        core["packed"] = [lanes.round_shift(th * buf, tb) + packed_units + addend
                          for th, buf, addend in zip(plan.theta_num, buffers, packing.addends)]
        core["bound"] = bound
        return noised

    def _core_step(self, plan, core, x, scale):
        # The noised vector y = C x + z, in integer units of 2^e (see
        # FactorisationMechanism._exact_exponent): (C x)_t = x_t + ω·b_{t−1}
        # with b_t = θ b_{t−1} + x_t, each product rounded to a unit.
        exponent = self._exact_exponent(plan)
        units = to_units(x, exponent)
        noise = self._integer_noise(scale, exponent)
        _sync_floats(core)
        if "right" in core:
            noised = self._list_step(plan, core["right"], units, noise)
        else:
            noised = self._packed_step(plan, core, units, noise)
        # Post-processing of y: u = C⁻¹ y (u_t = y_t − ω·b'_{t−1}, b'_t = θ b'_{t−1} + u_t),
        # whose running sum is the release A C⁻¹ y ≈ A x + A C⁻¹ z.
        y = from_units(noised, exponent)
        buffers = core["buffers"]
        u = y - _weighted_rows(plan.omega_list, buffers)
        buffers *= plan.theta_column
        buffers += u
        core["total"] += u

    # -- the scalar stream (dim 1, a float per step) ------------------------------------

    def step(self, x: Union[float, np.ndarray]) -> Union[float, np.ndarray]:
        """Consume the next element x and return the noisy prefix sum through it
        (:meth:`FactorisationMechanism.step`). A float of a scalar stream (what a release
        DoFn passes, once per stream and step) takes :meth:`_step_scalar`: the same
        arithmetic on Python ints and floats, so the same bits, without the small arrays."""
        if type(x) is float and self._dim == 1:
            return self._step_scalar(x)
        return super().step(x)

    def _step_scalar(self, x):
        if not math.isfinite(x):
            raise ValueError(f"x must be finite, got {x!r}")
        t = self._t + 1
        horizon = self._horizon
        if horizon is not None:
            if t > horizon:
                raise ValueError(f"horizon exceeded: horizon is {horizon}, step {t} requested")
            length = horizon
        else:
            _, start, length = self._epoch_of(t)
        plan = self._plan_of(length)
        if horizon is None and t == start:
            self._core = self._core_new(plan)
        total = self._scalar_core_step(plan, self._core, x, self._scale(length))
        self._t = t
        if horizon is not None:
            return total
        # As step's roots + release: one float addition.
        value = float(self._roots[0]) + total
        if t == start + length - 1:
            self._roots = np.array([value])
            self._core = None
        return value

    def _scalar_core_step(self, plan, core, x, scale):
        """:meth:`_core_step` of a scalar stream: the same roundings and float operations."""
        exponent = self._exact_exponent(plan)
        unit = to_unit(x, exponent)
        noise = self._source.integer_noise(self._noise, scale, exponent, 1)[0]
        y = from_unit(self._scalar_right_step(plan, core, unit, noise), exponent)
        floats = core.get("floats")
        if floats is None:
            floats = core["floats"] = core["buffers"][:, 0].tolist() + core["total"].tolist()
        # The array path's operations on Python floats: the same IEEE products and sums in
        # the same order (test_blt_scalar.py checks the bits against the array path), kept
        # in a list until an array path needs them (_sync_floats): a ufunc call on a few
        # numbers costs more than the arithmetic.
        u = y - _weighted_rows(plan.omega_list, floats)
        total = floats.pop() + u
        floats[:] = [b * th + u for b, th in zip(floats, plan.theta_list)]
        floats.append(total)
        return total

    @staticmethod
    def _scalar_right_step(plan, core, unit, noise):
        """``(C x)_t + z_t`` of a scalar stream: :meth:`_list_step` on its one coordinate
        (a scalar core keeps its ints unpacked, see :meth:`_set_right`)."""
        right = core["right"]
        acc = sum([w * buf[0] for w, buf in zip(plan.omega_num, right)])
        noised = unit + round_div_pow2(acc, plan.omega_bits) + noise
        tb = plan.theta_bits
        if tb <= 0:  # θ all integers (θ = 1): products exact, nothing to round
            for th, buf in zip(plan.theta_num, right):
                buf[0] = round_div_pow2(th * buf[0], tb) + unit
            return noised
        half = (1 << (tb - 1)) - 1
        for th, buf in zip(plan.theta_num, right):
            # round_div_pow2(θ·v, tb) inline: a call per buffer costs more than the arithmetic.
            n = th * buf[0]
            buf[0] = ((n + half + ((n >> tb) & 1)) >> tb) + unit
        return noised

    def _core_release(self, plan, core):
        _sync_floats(core)
        return core["total"]

    @staticmethod
    def _core_floats(core):
        # The integer buffers have the shape of the float ones.
        return 2 * core["buffers"].size + core["total"].size

    @classmethod
    def _core_to_state(cls, core):
        _sync_floats(core)
        return BLTCoreState(right=[list(buf) for buf in cls._right(core)], buffers=core["buffers"],
                            total=core["total"]).to_state()

    def _core_from_state(self, plan, data, local):
        record = BLTCoreState.from_state(data)
        right = record.right
        if (not isinstance(right, list) or len(right) != plan.buffers
                or any(not isinstance(buf, list) or len(buf) != self._dim for buf in right)
                or any(isinstance(v, bool) or not isinstance(v, int) for buf in right for v in buf)):
            raise ValueError(f"state right must be {plan.buffers} lists of {self._dim} ints")
        core = {
            "buffers": self._array(record.buffers, (plan.buffers, self._dim), "buffers"),
            "total": self._array(record.total, (self._dim,), "total"),
        }
        self._set_right(plan, core, [list(buf) for buf in right])
        return core

    @classmethod
    def right_factor(cls, horizon: int) -> np.ndarray:
        """The T×T Toeplitz matrix C (for tests)."""
        column = cls._plan(horizon).column()
        return np.array([[column[i - j] if i >= j else 0.0 for j in range(horizon)] for i in range(horizon)])

    @classmethod
    def participation_norm(cls, horizon: int, k: int, b: int) -> float:
        """``max_P ‖Σ_{s∈P} C[:, s]‖₂`` (P: <= k steps, gaps >= b), by the
        greedy pattern: with ω > 0 and θ ∈ (0, 1) the column is positive and
        decreasing after c_1; ``c_1 = Σ ω <= 1`` is checked with the rest, see
        :func:`~dp_beam.mechanisms.counting.participation.toeplitz_participation_norm`."""
        return toeplitz_participation_norm(cls._plan(horizon).column(), k, b)


# -- many streams stepped together ---------------------------------------------


class LockstepBLT(Lockstep):
    """Scalar :class:`BLTMechanism` streams of one configuration and step count, stepped
    together (:mod:`~dp_beam.mechanisms.counting.lockstep`).

    Each step looks the plan, the noise scale and the integer unit up once for
    all the streams. Every stream draws its exact discrete Gaussian from its
    own source and steps its own integer buffers, as
    :meth:`BLTMechanism._scalar_core_step` does; the float post-processing of
    all the streams (``u = y − ω·b``, ``b ← θ b + u``, the running release)
    runs on one ``(buffers + 1) × streams`` array, each element through the
    same IEEE-754 products and sums in the same order, so the releases are
    each stream's own, bit for bit.

    ``mechanisms``: ``BLTMechanism`` streams (not a subclass) with ``dim == 1``,
    the same parameters and the same step count (:meth:`eligible`). Their
    integer buffers are stepped in place (after every draw of the step has
    been made, so a draw that raises changes nothing); their float buffers,
    step counts and the roots of completed epochs are theirs again after
    :meth:`write_back`.

    Privacy cost: none of its own; each stream costs what its mechanism states.
    """

    mechanism_class = BLTMechanism

    def __init__(self, mechanisms: Sequence[BLTMechanism]) -> None:
        super().__init__(mechanisms)
        template = self._template
        self._horizon = template._horizon
        self._kind = template._noise
        # Each stream's floats as its scalar core keeps them: the buffers, then the total.
        cores = [m._core for m in self._members]
        self._floats = (None if cores[0] is None else np.array(
            [c["floats"] if "floats" in c else c["buffers"][:, 0].tolist() + c["total"].tolist()
             for c in cores], dtype=np.float64).T.copy())
        # The streams' own cores (their integer buffers are stepped in place), None between
        # two epochs of unbounded streams.
        self._cores = None if cores[0] is None else cores
        self._roots = (None if self._horizon is not None else
                       np.array([m._roots[0] for m in self._members], dtype=np.float64))

    def step(self, x: Sequence[float], sources: Sequence[Any]) -> list:
        """Each stream's next element in, its noisy prefix sum out (as Python floats); the
        same as ``m.set_noise_source(sources[j])`` then ``m.step(x[j])`` for each stream."""
        n = self._n
        self._check_step(x, sources)
        if not all(math.isfinite(v) for v in x):
            raise ValueError("x must be finite numbers, one per stream")
        template, horizon = self._template, self._horizon
        t = self._t + 1
        if horizon is not None:
            if t > horizon:
                raise ValueError(f"horizon exceeded: horizon is {horizon}, step {t} requested")
            start, length = 1, horizon
        else:
            _, start, length = template._epoch_of(t)
        plan = template._plan_of(length)
        scale = template._scale(length)
        exponent = template._exact_exponent(plan)
        kind = self._kind
        # Every draw first: a draw that raises leaves every stream as it was.
        noise = [source.integer_noise(kind, scale, exponent, 1)[0] for source in sources]
        new_epoch = horizon is None and t == start
        if new_epoch:
            cores = [template._core_new(plan) for _ in range(n)]
            floats = np.zeros((plan.buffers + 1, n))
        else:
            cores, floats = self._cores, self._floats
        right_step = BLTMechanism._scalar_right_step
        y = np.array([from_unit(right_step(plan, core, to_unit(v, exponent), z), exponent)
                      for core, v, z in zip(cores, x, noise)], dtype=np.float64)
        buffers = floats[:-1]
        u = y - _weighted_rows(plan.omega_list, buffers)
        total = floats[-1] + u
        floats = np.vstack([buffers * np.array(plan.theta_list)[:, None] + u, total])
        if new_epoch:
            self._cores = cores
            for member, core in zip(self._members, cores):
                member._core = core
        self._t = t
        self._last_sources = sources
        if horizon is not None:
            self._floats = floats
            return total.tolist()
        value = self._roots + total
        if t == start + length - 1:
            # The epoch is complete: its release becomes the roots, its core is dropped.
            self._roots = value
            self._floats = self._cores = None
            for member in self._members:
                member._core = None
        else:
            self._floats = floats
        return value.tolist()

    def _write_member(self, j, mechanism):
        if self._floats is not None:
            mechanism._core["floats"] = self._floats[:, j].tolist()
        if self._roots is not None:
            mechanism._roots = self._roots[j:j + 1].copy()

    # -- the streams held as arrays only -----------------------------------------

    def arrays(self) -> Dict[str, Any]:
        """Every stream's state in four fields: the step count ``t``, the integer buffers
        ``right`` (a list per stream of its ints, one per buffer: they hold about 64 bits,
        so they stay Python ints), the ``(buffers + 1) × streams`` ``floats`` (the float
        buffers, then the running release) and the unbounded streams' ``roots`` (``None``
        with a horizon); ``right`` and ``floats`` are ``None`` between two epochs of
        unbounded streams. :meth:`from_arrays` takes it back (a streaming shard stores it,
        :mod:`~dp_beam.transforms.shards`)."""
        right = (None if self._cores is None else
                 [[buf[0] for buf in core["right"]] for core in self._cores])
        return {"t": self._t, "right": right, "floats": self._floats, "roots": self._roots}

    @classmethod
    def from_arrays(cls, template: BLTMechanism, arrays: Dict[str, Any]) -> "LockstepBLT":
        """The streams of :meth:`arrays`, without a mechanism per stream.

        ``template``: a ``BLTMechanism`` with the streams' parameters (``dim`` 1; its own
        step count and buffers are not read). It steps and releases as the instance
        the arrays came from; :meth:`write_back` has no mechanism to write to, and
        :meth:`stream_state` gives a stream's state as its own mechanism's ``to_state()``
        would.
        """
        if type(template) is not BLTMechanism or template.dim != 1:
            raise ValueError("template must be a BLTMechanism with dim 1")
        t, right, floats, roots = arrays["t"], arrays["right"], arrays["floats"], arrays["roots"]
        horizon = template._horizon
        n = len(right) if right is not None else (len(roots) if roots is not None else 0)
        if horizon is not None:
            ok = roots is None and right is not None and 0 <= t <= horizon
            length = horizon
        else:
            ok = roots is not None and roots.ndim == 1 and (right is None) == (floats is None)
            length = template._epoch_of(t)[2] if t >= 1 else None
        if ok and right is not None:
            buffers = template._plan_of(length).buffers
            ok = (n > 0 and floats.shape == (buffers + 1, n)
                  and all(len(row) == buffers for row in right))
        if not ok or n < 1:
            raise ValueError("arrays must hold t, right, floats and roots as LockstepBLT.arrays() "
                             "gives them for the template's horizon")
        self = cls._without_members(template, n, t)
        self._horizon = horizon
        self._kind = template._noise
        self._cores = (None if right is None else
                       [{"right": [[v] for v in row]} for row in right])
        self._floats, self._roots = floats, roots
        return self

    def _fresh_member(self, j, mechanism):
        # The integer buffers, in a core of the current epoch's shape (the floats follow).
        if self._cores is None:
            mechanism._core = None
            return
        template = self._template
        length = self._horizon if self._horizon is not None else template._epoch_of(self._t)[2]
        core = mechanism._core_new(template._plan_of(length))
        core["right"] = [list(buf) for buf in self._cores[j]["right"]]
        mechanism._core = core
