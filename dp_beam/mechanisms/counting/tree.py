"""The binary (tree) mechanism for continual release of prefix sums.

Chan, Shi, Song 2010 (Alg. 2) and Dwork, Naor, Pitassi, Rothblum 2010, with
the doubling construction for unbounded streams of
:mod:`~dp_beam.mechanisms.counting.doubling`. The privacy argument is
``docs/privacy/counting.md``, C-3 to C-7 and C-9. :class:`LockstepTrees` steps
many scalar trees of one configuration together, with each one's releases.
"""

import dataclasses
import functools
import math
import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ...accounting.cost import Cost
from ..calibration import noise_scale
from ..halfwidths import gaussian_halfwidth
from ..noise import NoiseSource, make_noise
from ..noise_grid import grid_exponent, grid_padded_scale, round_on_exponent, round_to_grid
from .doubling import epoch_of, epoch_steps, release_intervals, release_levels
from .intervals import laplace_release_halfwidth
from .lockstep import Lockstep
from .parameters import (
    CounterConfig,
    CounterParameters,
    CounterState,
    NOISE_KINDS,
    privacy_cost,
    restore_parameters,
)

__all__ = ["BinaryTreeMechanism", "LockstepTrees", "NOISE_KINDS", "TreeState"]


def _trailing_zeros(c):
    return (c & -c).bit_length() - 1


@dataclasses.dataclass(frozen=True)
class TreeState(CounterState):
    """The state of a :class:`BinaryTreeMechanism`: the counter fields, then the noisy nodes
    of the open tree (None between epochs of an unbounded stream) and the sum of the closed
    epochs' roots (None for a bounded horizon), each as stored (arrays written as lists)."""

    nodes: Optional[Any]
    roots: Optional[Any]


@functools.lru_cache(maxsize=256)
def _grid_of(scale):
    """``grid_exponent`` of a node scale: a tree has one scale per level count."""
    return grid_exponent(scale)


@functools.lru_cache(maxsize=1024)
def _node_scale(noise, levels, sensitivity, epsilon, delta, calibration):
    # Calibrated for the node sensitivity padded by one grid step: with an
    # exact-grid source every node is rounded to the noise grid before it is
    # noised (BinaryTreeMechanism._noised). Cached across instances because a
    # release DoFn restores a fresh mechanism at every step.
    # A leaf is in `levels` nodes: L1 norm levels·s, L2 norm √levels·s.
    return grid_padded_scale(sensitivity, lambda s: noise_scale(
        noise, levels * s, math.sqrt(levels) * s, epsilon, delta, calibration))


class BinaryTreeMechanism(CounterParameters):
    """Noisy running sums (prefix sums) of a stream of scalars or vectors.

    After the t-th :meth:`step` it releases ``Σ_{s<=t} x_s + noise``, where the
    noise is the sum of the noises of the ``popcount(t)`` dyadic nodes that
    tile ``[1, t]`` (``docs/privacy/counting.md``, C-3, C-7). Every node
    draws its noise exactly once, when it is created, and keeps it; reading a
    release again never draws new noise (AC-4). All releases are
    post-processing of the vector of noisy nodes, so calibrating that vector
    covers the whole output sequence (C-4, C-5).

    Parameters
    ----------
    epsilon:
        Privacy parameter ε > 0 of the whole output sequence.
    sensitivity:
        Bound Δ on the total change a privacy unit can cause to the input,
        summed over all steps: ``Σ_t ‖x_t − x'_t‖₁ <= Δ`` for Laplace,
        ``Σ_t ‖x_t − x'_t‖₂ <= Δ`` for Gaussian. The caller folds the number
        of records per unit into Δ (C-1, C-2). The nodes of one level cover
        disjoint steps and each node's change is the sum of the unit's changes
        at its steps, so one level moves by at most Δ in L1 (resp. in the
        Euclidean norm, as √(Σ‖·‖²) <= Σ‖·‖); over h levels the node vector
        moves by at most ``h·Δ`` in L1 and ``√h·Δ`` in L2.
    horizon:
        Number of steps T (an int >= 1), giving ``h = T.bit_length()`` levels
        (C-3); step T+1 raises. ``None`` means an unbounded stream (doubling
        with complete trees, C-6; :mod:`~dp_beam.mechanisms.counting.doubling`).
    noise:
        ``"laplace"``: pure ε-DP, node noise ``Lap(h·Δ/ε)`` (C-4); ``delta``
        must be None or 0. ``"gaussian"``: (ε, δ)-DP, node noise ``N(0, σ²)``
        with σ calibrated for the node vector's L2 sensitivity ``√h·Δ`` by
        :func:`~dp_beam.mechanisms.calibration.gaussian_sigma`.
    delta:
        δ in (0, 1), required for Gaussian noise.
    dim:
        Length of each input vector (coordinates share nodes but get
        independent noise; Δ bounds the norm of the whole vector).
    rng:
        ``None`` for secure noise (production); an int seed, a NumPy
        ``Generator`` or a :class:`~dp_beam.mechanisms.noise.NoiseSource` for
        tests (see :func:`~dp_beam.mechanisms.noise.make_noise`).
    calibration:
        For Gaussian noise, ``"zcdp"`` (σ from ρ-zCDP) or ``"analytic"``
        (Balle & Wang 2018), both C-5. The accountant reads it back
        from :meth:`to_state`.

    Unbounded streams (C-6)
        Epoch k covers steps ``2^k … 2^{k+1}−1`` with its own tree of horizon
        ``2^k``, ``h_k = k+1`` levels and node scale ``(k+1)·Δ/ε`` (Laplace)
        or σ for L2 sensitivity ``√(k+1)·Δ`` (Gaussian); the release sums the
        noisy roots of the completed epochs and the current tree's release.
        Every epoch is calibrated for the whole Δ and no budget is split; the
        argument is in :mod:`~dp_beam.mechanisms.counting.doubling`.

    State (C-3; not a privacy claim)
        Chan, Shi and Song's state keeps an exact and a noisy p-sum per level
        (``2·h`` vectors). Only ``h`` vectors are needed: for each level ``i``
        the state holds one vector ``v[i]``,

        * if bit i of the count c is 1: the noisy node ``â[i]`` (what releases
          read);
        * if bit i of c is 0: the exact sum of the nodes at the set bits below
          i — the part of the next level-i node already seen (what node
          creation needs).

        At step c with ``i = ν2(c)`` the bits below i of c−1 are all 1 and bit i
        is 0, so the new node's exact value is ``x + v[i]``; every 0 bit above i
        gains x; bits below i become 0 with nothing below them. The exact
        values of the set-bit nodes are never needed on their own, only these
        partial sums. A bounded mechanism therefore holds ``h·dim`` floats; an
        unbounded one at step t holds ``(⌊log2 t⌋ + 2)·dim`` (the current
        epoch's ``k+1`` levels plus the running sum of noisy roots). The state
        contains exact partial sums and must be stored like the data it came
        from; only releases are public.

    Privacy cost: ε-DP (Laplace), or (ε, δ)-DP and ρ-zCDP (Gaussian), for
    the whole output sequence; :meth:`privacy_cost` states it.

    Exact releases: with the transforms' keyed source
    (:class:`~dp_beam.mechanisms.noise_key.KeyedNoise`) every node is rounded
    to the grid of its noise before the noise is added, so the node is the
    integer output of a discrete Laplace (Gaussian) mechanism times the grid
    step, computed without floating-point rounding, and a release is its
    post-processing. Rounding can move a node's sensitivity by one grid step
    (``<= 2^-29`` of the scale), so node scales are calibrated for ``Δ`` plus
    that pad (:func:`~dp_beam.mechanisms.noise_grid.grid_padded_scale`, C-9): they
    exceed ``levels·Δ/ε`` by a relative ``2^-29·scale/Δ`` at most.

    Example (``ZeroNoise`` switches noise off to show the sums; it is not
    private, and production code leaves ``rng=None``):

    >>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
    >>> m = BinaryTreeMechanism(epsilon=1.0, horizon=8, rng=ZeroNoise())
    >>> [m.step(x) for x in (1, 2, 3)]
    [1.0, 3.0, 6.0]
    >>> m.levels, [round(b, 6) for b in m.noise_scales(3)]   # t = 3 = 0b11: two nodes of Lap(4·1/1)
    (4, [4.0, 4.0])
    >>> round(m.noise_std(3), 6)      # √(2·2)·4
    8.0
    >>> dict(m.privacy_cost())
    {'epsilon': 1.0, 'delta': 0.0, 'rho': 0.5}
    """

    name = "tree"
    STATE_VERSION = 1

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
        self._configure(config, rng)
        self._scales = {}
        self._last_scales = None  # (t, scales) of the last noise_scales call
        self._t = 0
        if self._horizon is not None:
            self._nodes = np.zeros((self._horizon.bit_length(), self._dim), dtype=np.float64)
            self._roots = None
        else:
            # The tree of an epoch is allocated by its first step, so that
            # between epochs only the running sum of roots is held.
            self._nodes = None
            self._roots = np.zeros(self._dim, dtype=np.float64)

    # A stream stepped through the list paths (_step_scalar, _step_rows) keeps its nodes
    # as Python floats between steps, the authoritative copy while set; the array is
    # brought up to date when anything else reads it. A release DoFn steps every
    # stream of a shard once per step, and the array round trip (a view, tolist,
    # a slice assignment) cost more than the step's arithmetic.
    @property
    def _nodes(self):
        mirror = self._mirror
        if mirror is not None:
            self._mirror = None
            if self._dim == 1:
                self._node_array[:, 0] = mirror
            else:
                self._node_array[:] = mirror
        return self._node_array

    @_nodes.setter
    def _nodes(self, value):
        self._node_array = value
        self._mirror = None

    @property
    def levels(self) -> int:
        """Tree depth h: ``horizon.bit_length()``, or for an unbounded stream
        the depth of the epoch tree that holds the current (or, before any
        step, the first) step."""
        if self._horizon is not None:
            return self._horizon.bit_length()
        return max(self._t, 1).bit_length()

    # -- noise bookkeeping ----------------------------------------------------

    def _node_scale(self, levels):
        """Scale (Laplace b or Gaussian σ) of a node in a tree of ``levels`` levels (C-4, C-5, C-9)."""
        scale = self._scales.get(levels)
        if scale is None:
            scale = _node_scale(self._noise, levels, self._sensitivity, self._epsilon, self._delta,
                                self._calibration)
            self._scales[levels] = scale
        return scale

    def set_noise_source(self, rng: Any) -> None:
        """Draw all later noise from ``rng`` (resolved like the constructor's).

        The state is unchanged, so this equals ``from_state(to_state(), rng)``
        without the round trip; a release DoFn gives every step its own keyed
        source this way.
        """
        self._source = make_noise(rng)

    def _draw(self, scale):
        if self._noise == "laplace":
            return self._source.laplace(scale, self._dim)
        return self._source.gaussian(scale, self._dim)

    def _noised(self, exact, scale):
        """A node's noisy value: ``exact`` plus one noise vector of ``scale``.

        With an exact-grid source (:class:`~dp_beam.mechanisms.noise_key.KeyedNoise`)
        the exact value is first rounded to the noise's grid, so the sum is a
        multiple of the grid computed without rounding (below 2^53 grid
        steps): the node is the output of the discrete mechanism itself and
        its low-order bits carry nothing about the data (Mironov 2012).
        Without the rounding, a value off the grid would show through as the
        sum's offset from it. The one grid step this can add to the node
        sensitivity is in the calibration (:meth:`_node_scale`).
        """
        if self._source.exact_grid:
            exact = round_to_grid(exact, scale)
        return exact + self._draw(scale)

    def release_nodes(self, t: int) -> List[Tuple[int, int, int]]:
        """Nodes summed in the release at step t, as ``(first, last, level)`` step intervals.

        Bounded: the ``popcount(t)`` nodes ``(i, ⌊t/2^i⌋)`` for the set bits i
        of t, highest level first (``docs/privacy/counting.md``, C-3). Unbounded:
        the roots of the completed epochs, then the nodes of the current
        epoch's tree (C-6). A node is created, and its noise drawn, at step
        ``last``. The order matches :meth:`noise_scales`. Public: depends
        only on t (:func:`~dp_beam.mechanisms.counting.doubling.release_intervals`).
        """
        return release_intervals(self._check_t(t), self._horizon)

    def noise_scales(self, t: int) -> List[float]:
        """Scales (Laplace b or Gaussian σ) of the independent noises in the release at step t.

        One entry per node of :meth:`release_nodes` (C-7: the error is a sum
        of ``popcount`` independent noises; C-6 adds one root per completed
        epoch). Public: depends only on t and the parameters.
        """
        t = self._check_t(t)
        last = self._last_scales
        if last is not None and last[0] == t:
            # A release asks twice per step (noise_std and ci_halfwidth).
            return list(last[1])
        scales = [self._node_scale(levels) for levels in release_levels(t, self._horizon)]
        self._last_scales = (t, tuple(scales))
        return scales

    def noise_std(self, t: int) -> float:
        """Standard deviation of each coordinate of the release at step t (1-based).

        Laplace: ``√(Σ 2 b_j²)`` (``√(2·popcount(t))·b`` for a bounded tree);
        Gaussian: ``√(Σ σ_j²)`` (``σ·√popcount(t)``); C-7.
        """
        scales = self.noise_scales(t)
        factor = 2.0 if self._noise == "laplace" else 1.0
        return math.sqrt(factor * sum(s * s for s in scales))

    def ci_halfwidth(self, t: int, level: float = 0.95) -> float:
        """Half-width x with ``P(|noise| <= x) = level`` for each coordinate at step t.

        Exact, not a tail bound: the Laplace case inverts the distribution of
        the sum of the node noises (:func:`~dp_beam.mechanisms.halfwidths.laplace_sum_halfwidth`),
        the Gaussian case uses the normal quantile (C-7).
        """
        if self._noise == "laplace":
            return laplace_release_halfwidth(tuple(self.noise_scales(t)), float(level))
        return gaussian_halfwidth(self.noise_std(t), level)

    def privacy_cost(self) -> Cost:
        """Privacy of the whole (unbounded or horizon-long) output sequence.

        A :class:`~dp_beam.accounting.cost.Cost` (it reads as
        ``{"epsilon": ε, "delta": δ (0 for Laplace), "rho": ρ}``): Laplace is
        ε-DP and hence ε²/2-zCDP; Gaussian is (ε, δ)-DP and ρ-zCDP, ρ as in
        :attr:`rho` (C-4, C-5). Charged once for the mechanism; reads are free.
        """
        return privacy_cost(self._epsilon, self._delta, self._rho)

    def state_size(self) -> int:
        """Number of floats in the state (class docstring, "State"): ``h·dim`` bounded,
        ``(⌊log2 t⌋ + 2)·dim`` at most when unbounded."""
        size = 0 if self._nodes is None else self._nodes.size
        if self._roots is not None:
            size += self._roots.size
        return int(size)

    # -- the mechanism --------------------------------------------------------

    @staticmethod
    def _tree_sum(nodes, count):
        levels = np.arange(nodes.shape[0])
        live = ((count >> levels) & 1).astype(bool)
        return nodes[live].sum(axis=0)

    def _tree_add(self, nodes, count, x, scale):
        """Add the count-th element x to a tree (C-3, in the h-vector form of the class docstring)."""
        i = _trailing_zeros(count)
        exact = x + nodes[i]
        # Bits above i are the same in count−1 and count; each open (0) level
        # there will create a node that contains x. (A loop: the trees are a
        # few dozen levels at most, and NumPy's index arrays cost more.)
        for level in range(i + 1, nodes.shape[0]):
            if not (count >> level) & 1:
                nodes[level] += x
        nodes[:i] = 0.0
        nodes[i] = self._noised(exact, scale)

    def step(self, x: Union[float, np.ndarray]) -> Union[float, np.ndarray]:
        """Consume the next element x and return the noisy prefix sum through it.

        x is a number (dim 1) or an array of shape ``(dim,)``, finite. Returns
        a float when ``dim == 1``, else a new array of shape ``(dim,)``.
        Exactly one node is created per step, so one noise vector is drawn.
        """
        if type(x) is float and self._dim == 1:
            return self._step_scalar(x)
        if type(x) is list and len(x) == self._dim > 1 and all(type(v) is float for v in x):
            return self._step_rows(x)
        arr = self._check_x(x)
        t = self._t + 1
        if self._horizon is not None:
            if t > self._horizon:
                raise ValueError(f"horizon exceeded: horizon is {self._horizon}, step {t} requested")
            self._tree_add(self._nodes, t, arr, self._node_scale(self._nodes.shape[0]))
            self._t = t
            return self._output(self._tree_sum(self._nodes, t))

        k, count = epoch_of(t)
        if count == 1:
            self._nodes = np.zeros((k + 1, self._dim), dtype=np.float64)
        self._tree_add(self._nodes, count, arr, self._node_scale(k + 1))
        self._t = t
        if count == 1 << k:
            self._close_epoch(k)
            return self._output(self._roots)
        return self._output(self._roots + self._tree_sum(self._nodes, count))

    def _next_position(self):
        """``(t, count, levels, k)`` of the next step of the Python-number paths: its index in
        its tree, the tree's depth and (unbounded) its epoch, whose tree is allocated at
        the epoch's first step (as :meth:`step` does)."""
        t = self._t + 1
        if self._horizon is not None:
            if t > self._horizon:
                raise ValueError(f"horizon exceeded: horizon is {self._horizon}, step {t} requested")
            return t, t, self._node_array.shape[0], None
        k, count = epoch_of(t)
        if count == 1:
            self._nodes = np.zeros((k + 1, self._dim), dtype=np.float64)
        return t, count, k + 1, k

    def _step_scalar(self, x: float) -> float:
        """:meth:`step` of a scalar stream on Python floats: the same additions in the same
        order (IEEE-754 doubles either way, so the same bits), without the small arrays
        that cost more than the arithmetic. A release DoFn steps every stream once per step."""
        if not math.isfinite(x):
            raise ValueError(f"x must be finite, got {x!r}")
        t, count, levels, k = self._next_position()
        # A copy, so that a step that raises (a draw past float64) leaves the state as it was.
        values = self._mirror
        values = self._node_array[:, 0].tolist() if values is None else values.copy()
        i = _trailing_zeros(count)
        exact = x + values[i]
        for level in range(i + 1, levels):
            if not (count >> level) & 1:
                values[level] += x
        for level in range(i):
            values[level] = 0.0
        scale = self._node_scale(levels)
        if self._source.exact_grid:
            exact = round_on_exponent(exact, _grid_of(scale))
        values[i] = exact + self._source.float_noise(self._noise, scale, 1)[0]
        self._mirror = values
        self._t = t
        if self._horizon is None and count == 1 << k:
            self._close_epoch(k)
            return float(self._roots[0])
        total = self._scalar_sum(values, count)
        return total if self._horizon is not None else float(self._roots[0]) + total

    def _scalar_sum(self, values, count):
        """``_tree_sum`` of a scalar tree: NumPy adds fewer than 8 rows one by one from 0.0,
        as here; from 8 on it sums pairwise, so those (rare) sums are left to it."""
        if bin(count).count("1") >= 8:
            return float(self._tree_sum(self._nodes, count)[0])
        total = 0.0
        level = 0
        while count:
            if count & 1:
                total += values[level]
            count >>= 1
            level += 1
        return total

    def _step_rows(self, x: List[float]) -> np.ndarray:
        """:meth:`step` of a short vector given as a list of floats (C-3): :meth:`_tree_add` and
        :meth:`_tree_sum` per coordinate on Python floats, the same additions in the same
        order (so the same bits), without the small-array calls that cost more than the
        arithmetic. Returns a new array, as :meth:`step` does."""
        if not all(math.isfinite(v) for v in x):
            raise ValueError(f"x must be finite, got {x!r}")
        t, count, levels, k = self._next_position()
        # Rows are replaced, never changed in place: a shallow copy keeps a step that
        # raises from changing the state, as in _step_scalar.
        rows = self._mirror
        rows = self._node_array.tolist() if rows is None else rows.copy()
        i = _trailing_zeros(count)
        exact = [a + b for a, b in zip(x, rows[i])]
        for level in range(i + 1, levels):
            if not (count >> level) & 1:
                rows[level] = [a + b for a, b in zip(rows[level], x)]
        for level in range(i):
            rows[level] = [0.0] * self._dim
        scale = self._node_scale(levels)
        if self._source.exact_grid:
            grid = _grid_of(scale)
            exact = [round_on_exponent(v, grid) for v in exact]
        rows[i] = [a + b for a, b in zip(exact, self._source.float_noise(self._noise, scale, self._dim))]
        self._mirror = rows
        self._t = t
        if self._horizon is None and count == 1 << k:
            self._close_epoch(k)
            return self._output(self._roots)
        if bin(count).count("1") >= 8:
            # NumPy's pairwise summation: left to it, as in _scalar_sum.
            total = self._tree_sum(self._nodes, count)
        else:
            # NumPy sums the live rows one by one from 0.0, as here.
            total = [0.0] * self._dim
            level = 0
            while count:
                if count & 1:
                    total = [a + b for a, b in zip(total, rows[level])]
                count >>= 1
                level += 1
            total = np.array(total, dtype=np.float64)
        return total if self._horizon is not None else self._roots + total

    def _close_epoch(self, k):
        # The epoch's root is its only live node; folding it into the running
        # sum of roots frees the tree until the next epoch.
        self._roots = self._roots + self._nodes[k]
        self._nodes = None

    def _tree_skip(self, nodes, c0, c1, scale):
        """Move a tree's h-vector state from count c0 to c1 over zero inputs.

        Level i changes only if ``c0 >> i != c1 >> i``. Then, if bit i of c1
        is set, the live level-i node at c1 was created during the skip; its
        exact value is the part of it seen by c0, which the state holds at
        level i when that node began by c0 (``c0 >> i == (c1 >> i) − 1``: bit
        i of c0 is then 0, so ``nodes[i]`` is that partial sum), and 0 when it
        lies wholly in the skipped steps. If bit i of c1 is 0, the partial sum
        of the next level-i node covers skipped steps only: 0. Levels that do
        not change keep their noisy node or partial sum, exactly as ``step``
        with zeros would (adding 0 to an open level changes nothing).
        """
        for i in range(nodes.shape[0]):
            a, b = c0 >> i, c1 >> i
            if a == b:
                continue
            if b & 1:
                partial = nodes[i] if a == b - 1 else 0.0
                nodes[i] = self._noised(partial, scale)
            else:
                nodes[i] = 0.0

    def skip(self, n: int) -> None:
        """Advance by n steps whose inputs are all zero, drawing O(log t) noises.

        The state afterwards has exactly the distribution it would have after
        ``n`` calls of ``step(0)``, so every future release does too; only the
        releases of the skipped steps are not produced. Use: a counter that
        must be aligned to a public start although its data began later (it
        is the counter run from the start on zeros).

        Why it is exact: the state holds, per level, either a live noisy node
        or the exact partial sum of the next node (class docstring, "State").
        A node created during the skip holds the inputs before the skip that
        it covers (read from the partial sum) plus one fresh noise of the
        same scale that ``step`` would have drawn; a level whose next node
        lies in the skipped steps holds 0. Nodes created and superseded within
        the skip are read by no later release and are never drawn. Unbounded
        streams finish each epoch as ``step`` does: its root (partial sum plus
        noise) is folded into the running sum of roots and the tree freed; an
        epoch skipped whole contributes one fresh root noise of its scale.

        Draws: at most one per level of each epoch the skip touches, i.e. at
        most ``h`` (bounded) or ``⌊log2 t⌋ + 1`` plus one root per completed
        epoch (unbounded), instead of ``n``. Works at any ``t``, before or
        after steps; ``n = 0`` does nothing. Raises ``ValueError`` if ``n`` is
        not an int >= 0 or ``t + n`` exceeds the horizon (the state is then
        unchanged). Returns None; :meth:`current` reads the release at the
        new ``t``.

        >>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
        >>> m = BinaryTreeMechanism(epsilon=1.0, horizon=16, rng=ZeroNoise())
        >>> m.step(2.0)
        2.0
        >>> m.skip(5)
        >>> m.t, m.current(), m.step(1.0)
        (6, 2.0, 3.0)
        """
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        t1 = self._t + int(n)
        if self._horizon is None:
            self._skip_epochs(t1)
            return None
        if t1 > self._horizon:
            raise ValueError(f"horizon exceeded: horizon is {self._horizon}, skip to step {t1} requested")
        self._tree_skip(self._nodes, self._t, t1, self._node_scale(self._nodes.shape[0]))
        self._t = t1
        return None

    def _skip_epochs(self, t1):
        """:meth:`skip` of an unbounded stream to step t1, one epoch at a time."""
        t = self._t
        while t < t1:
            # Epoch k holds the next step t+1; the skip runs to its end or to t1.
            k = epoch_of(t + 1)[0]
            first, last = epoch_steps(k)
            stop = min(t1, last)
            if self._nodes is None:
                self._nodes = np.zeros((k + 1, self._dim), dtype=np.float64)
            self._tree_skip(self._nodes, t - first + 1, stop - first + 1, self._node_scale(k + 1))
            if stop == last:
                self._close_epoch(k)
            t = stop
            self._t = t

    def current(self) -> Union[float, np.ndarray]:
        """The current release, without consuming input.

        Pure post-processing of stored noisy nodes: no noise is drawn and
        repeated calls return identical values. 0 before the first step.
        """
        t = self._t
        if self._horizon is not None:
            value = self._tree_sum(self._nodes, t) if t else np.zeros(self._dim)
        elif self._nodes is None:
            value = self._roots
        else:
            value = self._roots + self._tree_sum(self._nodes, epoch_of(t)[1])
        return self._output(value)

    # -- serialisation --------------------------------------------------------

    def to_state(self) -> Dict[str, Any]:
        """Plain dict (ints, floats, strings, lists, None) holding everything
        needed to continue; JSON- and pickle-friendly. The noise source is not
        included: a restored mechanism gets its own (:meth:`from_state`)."""
        return TreeState(**self._state_header(), nodes=self._nodes, roots=self._roots).to_state()

    @classmethod
    def from_state(cls, state: dict, rng: Any = None) -> "BinaryTreeMechanism":
        """Rebuild a mechanism from :meth:`to_state` output.

        ``rng`` is resolved like the constructor's (None → secure noise). With
        a noise source positioned where the original's was, the restored
        mechanism releases exactly what the original would have.
        """
        mech, t, record = restore_parameters(cls, state, rng, TreeState)
        nodes, roots = record.nodes, record.roots
        dim = mech._dim
        if mech._horizon is not None:
            if t > mech._horizon:
                raise ValueError(f"state t={t} exceeds horizon {mech._horizon}")
            expected = (mech._horizon.bit_length(), dim)
            if nodes is None or roots is not None:
                raise ValueError("state of a bounded tree needs nodes and no roots")
        else:
            if roots is None:
                raise ValueError("state of an unbounded tree needs roots")
            k = t.bit_length() - 1
            epoch_done = t == 0 or t == epoch_steps(k)[1]
            expected = None if epoch_done else (k + 1, dim)
            if (nodes is None) != (expected is None):
                raise ValueError(f"state nodes do not match t={t} of an unbounded tree")
            roots_arr = np.asarray(roots, dtype=np.float64)
            if roots_arr.shape != (dim,) or not np.all(np.isfinite(roots_arr)):
                raise ValueError(f"state roots must be {dim} finite floats")
            mech._roots = roots_arr.copy()
        if expected is not None:
            nodes_arr = np.asarray(nodes, dtype=np.float64)
            if nodes_arr.shape != expected or not np.all(np.isfinite(nodes_arr)):
                raise ValueError(f"state nodes must be finite floats of shape {expected}")
            mech._nodes = nodes_arr.copy()
        else:
            mech._nodes = None
        mech._t = t
        return mech

    def __repr__(self) -> str:
        return (
            f"BinaryTreeMechanism(epsilon={self._epsilon!r}, sensitivity={self._sensitivity!r}, "
            f"horizon={self._horizon!r}, noise={self._noise!r}, delta={self._delta!r}, "
            f"dim={self._dim!r}, calibration={self._calibration!r}, t={self._t})"
        )


# -- many streams stepped together ---------------------------------------------

# Integers beyond 2^53 are not all floats: a rounded value past it is kept as is,
# as round_on_exponent keeps it (such a float is already a multiple of the grid).
_EXACT_INT = float(1 << 53)


def _round_on_exponent(values: np.ndarray, k: int) -> np.ndarray:
    """:func:`~dp_beam.mechanisms.noise_grid.round_on_exponent` of each element: the same
    exact scaling by 2^-k, rounding half to even and scaling back; an element whose scaled
    value overflows or exceeds 2^53 is kept, as there."""
    with np.errstate(over="ignore"):
        scaled = np.ldexp(values, -k)
    # + 0.0: Python's round gives the int 0 where rint gives -0.0; 0.0 is what it scales back to.
    rounded = np.rint(scaled) + 0.0
    keep = ~(np.abs(rounded) <= _EXACT_INT)   # also true where the scaling overflowed
    out = np.ldexp(rounded, k)
    if keep.any():
        out[keep] = values[keep]
    return out


class LockstepTrees(Lockstep):
    """Scalar :class:`BinaryTreeMechanism` streams of one configuration and step count,
    stepped together (:mod:`~dp_beam.mechanisms.counting.lockstep`).

    At a common step count every tree has the same shape, so the nodes of all
    the streams live in one ``levels × streams`` array and a step is a few
    array operations: each element goes through the same IEEE-754 additions
    in the same order as in :meth:`BinaryTreeMechanism.step`, the rounding to
    the noise grid is the same exact rounding, and each stream draws its node
    noise from its own source by the same call, so the releases are each
    stream's own, bit for bit.

    ``mechanisms``: the streams, each a ``BinaryTreeMechanism`` (not a
    subclass) with ``dim == 1``, all with the same parameters and the same
    number of steps consumed (:meth:`eligible` says whether they are). Their
    states are copied in; the mechanisms themselves are not changed until
    :meth:`write_back`, which gives each its state after the steps taken here.

    Privacy cost: none of its own. Each stream's releases are those its own
    mechanism would give (same noise sources, same bits), so each stream
    costs what its mechanism states in ``privacy_cost()``.
    """

    mechanism_class = BinaryTreeMechanism

    def __init__(self, mechanisms: Sequence[BinaryTreeMechanism]) -> None:
        super().__init__(mechanisms)
        template = self._template
        self._horizon = template._horizon
        self._kind = template._noise
        nodes = template._nodes
        # Each stream's node column, as reading its `_nodes` writes back a list-path mirror.
        self._nodes = (None if nodes is None else
                       np.array([m._nodes[:, 0] for m in self._members], dtype=np.float64).T.copy())
        self._roots = (None if self._horizon is not None else
                       np.array([m._roots[0] for m in self._members], dtype=np.float64))

    def step(self, x: Sequence[float], sources: Sequence[NoiseSource]) -> List[float]:
        """Each stream's next element (``x[j]`` for stream j, finite) in, each stream's noisy
        prefix sum out, as Python floats; stream j draws its node noise from ``sources[j]``.

        The same as ``[m.step(x[j])]`` for each stream j after
        ``m.set_noise_source(sources[j])``. A step that raises (a bad input, the horizon
        passed, a draw that fails) leaves the streams as they were.
        """
        n = self._n
        self._check_step(x, sources)
        xs = np.array(x, dtype=np.float64)
        if xs.shape != (n,) or not np.isfinite(xs).all():
            raise ValueError("x must be finite numbers, one per stream")
        t = self._t + 1
        horizon = self._horizon
        if horizon is not None:
            if t > horizon:
                raise ValueError(f"horizon exceeded: horizon is {horizon}, step {t} requested")
            count, k = t, None
            nodes = self._nodes.copy()
        else:
            k, count = epoch_of(t)
            # An epoch's tree is allocated by its first step, as BinaryTreeMechanism does.
            nodes = np.zeros((k + 1, n)) if count == 1 else self._nodes.copy()
        levels = nodes.shape[0]
        i = _trailing_zeros(count)
        exact = xs + nodes[i]
        for level in range(i + 1, levels):
            if not (count >> level) & 1:
                nodes[level] += xs
        nodes[:i] = 0.0
        scale = self._template._node_scale(levels)
        exact = self._on_grid(exact, scale, sources)
        kind = self._kind
        noise = [source.float_noise(kind, scale, 1)[0] for source in sources]
        nodes[i] = exact + np.array(noise, dtype=np.float64)
        # Nothing above can raise now: the step is committed.
        self._t = t
        self._last_sources = sources
        if horizon is None and count == 1 << k:
            self._roots = self._roots + nodes[k]
            self._nodes = None
            return self._roots.tolist()
        self._nodes = nodes
        total = self._sum(nodes, count)
        return (total if horizon is not None else self._roots + total).tolist()

    @staticmethod
    def _on_grid(exact, scale, sources):
        """``exact`` rounded to the noise grid for the streams whose source is exact-grid."""
        grid = [source.exact_grid for source in sources]
        if not any(grid):
            return exact
        k = _grid_of(scale)
        if all(grid):
            return _round_on_exponent(exact, k)
        return np.array([round_on_exponent(v, k) if g else v
                         for v, g in zip(exact.tolist(), grid)], dtype=np.float64)

    def _sum(self, nodes, count):
        """Each stream's sum of its live nodes, as its own mechanism adds them."""
        if bin(count).count("1") >= 8:
            # The per-stream path leaves these sums to NumPy's pairwise summation of the
            # stream's (levels, 1) node array: the same call on each stream's column.
            return np.array([BinaryTreeMechanism._tree_sum(np.ascontiguousarray(nodes[:, j:j + 1]),
                                                           count)[0]
                             for j in range(self._n)], dtype=np.float64)
        # Fewer live nodes: added one by one from 0.0, lowest level first.
        total = np.zeros(self._n)
        level = 0
        while count:
            if count & 1:
                total = total + nodes[level]
            count >>= 1
            level += 1
        return total

    def _write_member(self, j, mechanism):
        nodes, roots = self._nodes, self._roots
        mechanism._nodes = None if nodes is None else np.ascontiguousarray(nodes[:, j:j + 1])
        if roots is not None:
            mechanism._roots = roots[j:j + 1].copy()

    # -- the streams held as arrays only -----------------------------------------

    def arrays(self) -> Dict[str, Any]:
        """Every stream's state in three fields: the step count ``t``, the ``levels ×
        streams`` ``nodes`` (``None`` between two epochs of unbounded trees) and the
        unbounded trees' ``roots`` (``None`` with a horizon). :meth:`from_arrays` takes
        it back; a streaming shard stores it instead of one state per stream
        (:mod:`~dp_beam.transforms.shards`). The arrays are not copied: a step replaces
        them rather than writing into them."""
        return {"t": self._t, "nodes": self._nodes, "roots": self._roots}

    @classmethod
    def from_arrays(cls, template: BinaryTreeMechanism, arrays: Dict[str, Any]) -> "LockstepTrees":
        """The streams of :meth:`arrays`, without a mechanism per stream.

        ``template``: a ``BinaryTreeMechanism`` with the streams' parameters (``dim``
        1; its own step count and nodes are not read). It steps and releases as the
        instance the arrays came from; :meth:`write_back` has no mechanism to write
        to, and :meth:`stream_state` gives a stream's state as its own mechanism's
        ``to_state()`` would.
        """
        if type(template) is not BinaryTreeMechanism or template.dim != 1:
            raise ValueError("template must be a BinaryTreeMechanism with dim 1")
        t, nodes, roots = arrays["t"], arrays["nodes"], arrays["roots"]
        horizon = template._horizon
        if horizon is not None:
            ok = (roots is None and nodes is not None and nodes.ndim == 2
                  and nodes.shape[0] == horizon.bit_length() and 0 <= t <= horizon)
        else:
            ok = roots is not None and roots.ndim == 1 and (
                nodes is None or (nodes.ndim == 2 and nodes.shape[1] == roots.shape[0]))
        if not ok:
            raise ValueError("arrays must hold t, nodes and roots as LockstepTrees.arrays() "
                             "gives them for the template's horizon")
        self = cls._without_members(template, nodes.shape[1] if nodes is not None else
                                    roots.shape[0], t)
        self._horizon = horizon
        self._kind = template._noise
        self._nodes, self._roots = nodes, roots
        return self
