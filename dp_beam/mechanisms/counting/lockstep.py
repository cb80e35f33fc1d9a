"""Many scalar counting streams stepped together: one call per step for all of them.

A shard of a release holds many streams of one configuration (the declared
keys of a ``ContinualCount`` or ``ContinualSum``). On bounded input they all
open at the schedule's first step, so they release the same steps, and a
release can step them together instead of one stream at a time, with its
bookkeeping once per step rather than once per stream and step.

* :class:`LockstepTrees`: binary-tree streams (the default with Laplace
  noise). At every step they have the same count and hence the same tree
  shape: the same node is created, the same open levels gain the input and
  the same nodes are summed. Their nodes live in one ``levels × streams``
  array, and each step is a handful of array operations.
* :class:`LockstepStreams`: any other scalar counter with a swappable noise
  source (BLT, Honaker, smooth binary, square-root Toeplitz), each stream
  stepped by its own mechanism.

The releases are those of each stream's own mechanism, bit for bit: every
element goes through the same IEEE-754 operations in the same order, the
rounding to the noise grid is the same exact rounding (half to even), and
each stream's noise is drawn from that stream's own source by the same call
(:meth:`~dp_beam.mechanisms.noise.NoiseSource.float_noise`). The draws are
still made one by one: each is an exact sampler on its stream's own keyed
stream (``docs/privacy/counting.md``, C-3, C-9). Nothing about the privacy
argument changes: this is an evaluation order, not a mechanism.

>>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
>>> trees = [BinaryTreeMechanism(1.0, horizon=8, rng=ZeroNoise()) for _ in range(2)]
>>> lock = LockstepTrees(trees)
>>> [lock.step([1.0, 2.0], [ZeroNoise(), ZeroNoise()]) for _ in range(3)]
[[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]
>>> lock.write_back(); [m.t for m in trees], trees[1].step(2.0)
([3, 3], 8.0)
"""

from typing import List, Sequence

import numpy as np

from ..noise import NoiseSource
from ..noise_grid import round_on_exponent
from .doubling import epoch_of
from .parameters import CounterParameters
from .tree import BinaryTreeMechanism, _grid_of, _trailing_zeros

__all__ = ["LockstepStreams", "LockstepTrees", "lockstep"]

# Integers beyond 2^53 are not all floats: a rounded value past it is kept as is,
# as round_on_exponent keeps it (such a float is already a multiple of the grid).
_EXACT_INT = float(1 << 53)


def _config(mechanism):
    return (mechanism._epsilon, mechanism._sensitivity, mechanism._horizon, mechanism._noise,
            mechanism._delta, mechanism._calibration)


def _check_step(n, x, sources):
    if len(x) != n or len(sources) != n:
        raise ValueError(f"x and sources must have one entry per stream ({n}), "
                         f"got {len(x)} and {len(sources)}")


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


class LockstepTrees:
    """Scalar :class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism` streams of one
    configuration and step count, stepped together.

    ``mechanisms``: the streams, each a ``BinaryTreeMechanism`` (not a
    subclass) with ``dim == 1``, all with the same parameters and the same
    number of steps consumed (:meth:`eligible` says whether they are). Their
    states are copied in; the mechanisms themselves are not changed until
    :meth:`write_back`, which gives each its state after the steps taken here.

    Privacy cost: none of its own. Each stream's releases are those its own
    mechanism would give (same noise sources, same bits), so each stream
    costs what its mechanism states in ``privacy_cost()``.
    """

    def __init__(self, mechanisms: Sequence[BinaryTreeMechanism]) -> None:
        mechanisms = list(mechanisms)
        if not self.eligible(mechanisms):
            raise ValueError("mechanisms must be one or more BinaryTreeMechanism streams with "
                             "dim 1, the same parameters and the same step count")
        self._members = mechanisms
        template = self._template = mechanisms[0]
        self._n = len(mechanisms)
        self._t = template._t
        self._horizon = template._horizon
        self._kind = template._noise
        nodes = template._nodes
        # Each stream's node column, as reading its `_nodes` writes back a list-path mirror.
        self._nodes = (None if nodes is None else
                       np.array([m._nodes[:, 0] for m in mechanisms], dtype=np.float64).T.copy())
        self._roots = (None if self._horizon is not None else
                       np.array([m._roots[0] for m in mechanisms], dtype=np.float64))
        self._last_sources = None

    @staticmethod
    def eligible(mechanisms: Sequence[object]) -> bool:
        """Whether ``mechanisms`` can be stepped together (see the class docstring)."""
        if not mechanisms:
            return False
        first = mechanisms[0]
        if type(first) is not BinaryTreeMechanism or first._dim != 1:
            return False
        config, t = _config(first), first._t
        return all(type(m) is BinaryTreeMechanism and m._dim == 1 and m._t == t
                   and _config(m) == config for m in mechanisms)

    @property
    def t(self) -> int:
        """Steps consumed by every stream."""
        return self._t

    @property
    def template(self) -> BinaryTreeMechanism:
        """The first stream's mechanism, for the public functions of the shared parameters
        (``noise_std(t)``, ``ci_halfwidth(t)``, ``name``)."""
        return self._template

    def __len__(self) -> int:
        return self._n

    def step(self, x: Sequence[float], sources: Sequence[NoiseSource]) -> List[float]:
        """Each stream's next element (``x[j]`` for stream j, finite) in, each stream's noisy
        prefix sum out, as Python floats; stream j draws its node noise from ``sources[j]``.

        The same as ``[m.step(x[j])]`` for each stream j after
        ``m.set_noise_source(sources[j])``. A step that raises (a bad input, the horizon
        passed, a draw that fails) leaves the streams as they were.
        """
        n = self._n
        _check_step(n, x, sources)
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

    def write_back(self) -> None:
        """Gives every stream's mechanism its state after the steps taken here (and, as after
        its own steps, the source of its last draw)."""
        t, nodes, roots, sources = self._t, self._nodes, self._roots, self._last_sources
        for j, mechanism in enumerate(self._members):
            mechanism._t = t
            mechanism._nodes = None if nodes is None else np.ascontiguousarray(nodes[:, j:j + 1])
            if roots is not None:
                mechanism._roots = roots[j:j + 1].copy()
            if sources is not None:
                mechanism.set_noise_source(sources[j])


class LockstepStreams:
    """Scalar counting streams of one mechanism class, configuration and step count, each
    stepped by its own mechanism, all in one call per step.

    ``mechanisms``: the streams (:meth:`eligible` says whether they qualify):
    each a :class:`~dp_beam.mechanisms.counting.parameters.CounterParameters`
    with ``dim == 1`` that can swap its noise source (``set_noise_source``),
    all of one class with the same parameters and step count. A step is each
    stream's ``set_noise_source(sources[j])`` then ``step(x[j])``, so the
    mechanisms are stepped in place (:meth:`write_back` has nothing to do).
    If a stream's step raises, the streams before it have taken the step
    (each stream's own step leaves it unchanged when it raises).

    Privacy cost: none of its own; each stream costs what its mechanism states.
    """

    def __init__(self, mechanisms: Sequence[object]) -> None:
        mechanisms = list(mechanisms)
        if not self.eligible(mechanisms):
            raise ValueError("mechanisms must be one or more scalar counters of one class with "
                             "set_noise_source, the same parameters and the same step count")
        self._members = mechanisms
        self._n = len(mechanisms)

    @staticmethod
    def eligible(mechanisms: Sequence[object]) -> bool:
        """Whether ``mechanisms`` can be stepped together (see the class docstring)."""
        if not mechanisms:
            return False
        first = mechanisms[0]
        cls = type(first)
        if not (isinstance(first, CounterParameters) and hasattr(first, "set_noise_source")
                and first._dim == 1):
            return False
        config, t = first.config, first.t
        return all(type(m) is cls and m.t == t and m.config == config for m in mechanisms)

    @property
    def t(self) -> int:
        return self._members[0].t

    @property
    def template(self) -> object:
        """The first stream's mechanism (public functions of the shared parameters)."""
        return self._members[0]

    def __len__(self) -> int:
        return self._n

    def step(self, x: Sequence[float], sources: Sequence[NoiseSource]) -> List[float]:
        """``[m.step(x[j])]`` for each stream j after ``m.set_noise_source(sources[j])``."""
        _check_step(self._n, x, sources)
        out = []
        for mechanism, value, source in zip(self._members, x, sources):
            mechanism.set_noise_source(source)
            out.append(float(mechanism.step(value)))
        return out

    def write_back(self) -> None:
        """Nothing to do: every stream was stepped by its own mechanism."""


def lockstep(mechanisms: Sequence[object]):
    """The fastest way to step these streams together: :class:`LockstepTrees` for tree
    streams, else :class:`LockstepStreams`, or ``None`` when they cannot be."""
    if LockstepTrees.eligible(mechanisms):
        return LockstepTrees(mechanisms)
    if LockstepStreams.eligible(mechanisms):
        return LockstepStreams(mechanisms)
    return None
