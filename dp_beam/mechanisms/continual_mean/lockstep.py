"""Many continual-mean streams of one configuration stepped together: :class:`MeanLockstep`.

A shard of a ``ContinualMean`` release holds the streams of many keys. On
bounded input they all open at the schedule's first step and release the same
steps, so at each step the count trees of all of them, then their value trees
j = 0, 1, ..., can be stepped as one (:func:`~dp_beam.mechanisms.counting.lockstep_of`:
binary-tree streams as one array, BLT streams with their float part as one
array) instead of one tree of one stream at a time. Everything else a stream
does at a step (its public counters, the prior query, activations, the
estimate) is its own :class:`~.core.ContinualMeanCore` code, in the three parts
of :meth:`~.core.ContinualMeanCore.step`.

The releases are each stream's own, bit for bit: the tree steps give each
tree's own values (``docs/privacy/counting.md`` C-3: the same IEEE-754
operations in the same order, noise from the stream's own source), and every
stream draws in the order of its own step (the prior query, then the count
tree, then a median, then the value trees). This is an evaluation order, not a
mechanism: nothing about the privacy argument of ``docs/privacy/mean.md``
changes.

>>> from dp_beam.mechanisms.continual_mean import ContinualMeanCore, MeanParams
>>> from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
>>> params = MeanParams(10, 4, 1.0)
>>> key = NoiseKey.from_bytes(bytes(32))
>>> def source(j, t):
...     return KeyedNoise(key, ("doc", j, t))
>>> alone = [ContinualMeanCore(params) for _ in range(3)]
>>> lock = MeanLockstep([ContinualMeanCore(params) for _ in range(3)])
>>> for t in range(4):
...     mine = []
...     for j, core in enumerate(alone):
...         core.set_noise_source(source(j, t))
...         mine.append(core.step().estimate)
...     theirs = [out.estimate for out in lock.step([None] * 3, [source(j, t) for j in range(3)])]
...     assert mine == theirs
>>> lock.write_back()
>>> [core.to_state() == mine.to_state() for core, mine in zip(lock.cores, alone)]
[True, True, True]
"""

from typing import Any, List, Optional, Sequence

from ..counting.lockstep import lockstep_of
from ..noise import NoiseSource
from .aggregate import MeanAggregate
from .core import ContinualMeanCore, MeanStep

__all__ = ["MeanLockstep"]


class MeanLockstep:
    """Continual-mean streams (:class:`~.core.ContinualMeanCore`, not a subclass) of one
    configuration and step count, stepped together (see the module docstring).

    The cores are stepped in place, their trees' nodes kept in the counters' arrays
    until :meth:`write_back`: after it each core holds the state its own ``step`` would
    have given it, and its trees draw from the last source given for it.
    :meth:`eligible` says whether streams qualify: the same parameters, bounds, horizon
    and step count, and trees whose noise source can be swapped.

    Privacy cost: none of its own; each stream costs what its core states.
    """

    def __init__(self, cores: Sequence[ContinualMeanCore]) -> None:
        cores = list(cores)
        if not self.eligible(cores):
            raise ValueError("cores must be one or more ContinualMeanCore streams with the same "
                             "parameters, bounds, horizon and step count, whose trees can swap "
                             "their noise source")
        self._cores = cores
        first = cores[0]
        # Per tree role (the count tree, then value tree j): every stream's tree, and the
        # counters' way of stepping them together, or None for one by one (vector trees).
        # Kept from step to step: building it copies every tree's nodes in, and
        # write_back copies them out, which cost more than the step itself.
        roles = ([[c.count_tree for c in cores]] if first.count_tree is not None else [])
        roles += [[c.tree_list[j] for c in cores] for j in range(len(first.tree_list))]
        self._roles = roles
        self._locks = [lockstep_of(trees) if len(trees) > 1 else None for trees in roles]

    @staticmethod
    def eligible(cores: Sequence[Any]) -> bool:
        """Whether ``cores`` can be stepped together."""
        if not cores or any(type(c) is not ContinualMeanCore for c in cores):
            return False
        first = cores[0]
        # One parameter object: a transform builds its streams' cores from its own.
        return all(
            c.p is first.p and c.t == first.t and c.horizon == first.horizon and c.can_swap_source()
            and (c.lower == first.lower).all() and (c.upper == first.upper).all()
            for c in cores)

    def __len__(self) -> int:
        return len(self._cores)

    @property
    def cores(self) -> List[ContinualMeanCore]:
        return list(self._cores)

    def write_back(self) -> None:
        """Gives every core's trees their state after the steps taken here. The cores
        themselves are stepped in place; until this is called, their trees hold only their
        step counts (enough for the public noise figures a step reads), and a core's
        ``to_state()`` would be stale."""
        for lock in self._locks:
            if lock is not None:
                lock.write_back()

    def step(self, aggregates: Sequence[Optional[MeanAggregate]],
             sources: Sequence[NoiseSource]) -> List[MeanStep]:
        """Each stream's :meth:`~.core.ContinualMeanCore.step` of ``aggregates[j]`` (None: an
        empty step) after ``set_noise_source(sources[j])``, in stream order."""
        cores = self._cores
        if len(aggregates) != len(cores) or len(sources) != len(cores):
            raise ValueError(f"aggregates and sources must have one entry per stream "
                             f"({len(cores)}), got {len(aggregates)} and {len(sources)}")
        aggs = [a if a is not None else MeanAggregate() for a in aggregates]
        for core, source in zip(cores, sources):
            core.set_noise_source(source)
        # A stream's trees draw from its core's source (set_noise_source wraps it).
        wrapped = [core.source for core in cores]
        counts = [core.step_begin(agg) for core, agg in zip(cores, aggs)]
        if cores[0].count_tree is None:
            noisy, first = counts, 0
        else:
            noisy, first = self._step_role(0, counts, wrapped), 1
        inputs = [core.step_middle(agg, n) for core, agg, n in zip(cores, aggs, noisy)]
        released = [self._step_role(first + j, [x[j] for x in inputs], wrapped)
                    for j in range(len(inputs[0]))]
        return [core.step_end(agg, list(rel))
                for core, agg, rel in zip(cores, aggs, zip(*released))]

    def _step_role(self, role, xs, sources):
        """Every stream's tree of ``role`` stepped with its input ``xs[j]``, drawing from
        ``sources[j]``."""
        lock = self._locks[role]
        if lock is None:
            return [tree.step(x) for tree, x in zip(self._roles[role], xs)]
        out = lock.step(xs, sources)
        # The next part of a core's step may read its tree's step count (activation margins).
        lock.write_counts()
        return out
