"""Many scalar counting streams stepped together: one call per step for all of them.

A shard of a release holds many streams of one configuration (the declared
keys of a ``ContinualCount`` or ``ContinualSum``). On bounded input they all
open at the schedule's first step, so they release the same steps, and a
release can step them together instead of one stream at a time, with its
bookkeeping once per step rather than once per stream and step.

* :class:`~dp_beam.mechanisms.counting.tree.LockstepTrees` (in :mod:`.tree`, whose
  node layout it shares): binary-tree streams (the default with Laplace noise).
  At every step they have the same count and hence the same tree shape: the
  same node is created, the same open levels gain the input and the same
  nodes are summed. Their nodes live in one ``levels × streams`` array, and
  each step is a handful of array operations.
* :class:`~dp_beam.mechanisms.counting.blt.LockstepBLT` (in :mod:`.blt`): BLT
  streams (the default with Gaussian noise). Each draws its exact discrete
  Gaussian and steps its integer buffers on its own; the plan, scale and
  integer unit are looked up once per step, and the float post-processing
  runs on one array for all of them.
* :class:`LockstepStreams`: any other scalar counter with a swappable noise
  source (Honaker, smooth binary, square-root Toeplitz), each stream stepped
  by its own mechanism.

The releases are those of each stream's own mechanism, bit for bit: a tree
element goes through the same IEEE-754 operations in the same order, with the
same exact rounding to the noise grid (half to even) and its noise drawn from
its stream's own source by the same call
(:meth:`~dp_beam.mechanisms.noise.NoiseSource.float_noise`); every other
counter steps by its own code (BLT's float post-processing through the same
products and sums in the same order), from its stream's own source. The draws are
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

from ..noise import NoiseSource
from .blt import LockstepBLT
from .parameters import CounterParameters
from .tree import LockstepTrees

__all__ = ["LockstepBLT", "LockstepStreams", "LockstepTrees", "lockstep"]


def _check_step(n, x, sources):
    if len(x) != n or len(sources) != n:
        raise ValueError(f"x and sources must have one entry per stream ({n}), "
                         f"got {len(x)} and {len(sources)}")


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
    streams, :class:`LockstepBLT` for BLT streams, else :class:`LockstepStreams`, or
    ``None`` when they cannot be."""
    if LockstepTrees.eligible(mechanisms):
        return LockstepTrees(mechanisms)
    if LockstepBLT.eligible(mechanisms):
        return LockstepBLT(mechanisms)
    if LockstepStreams.eligible(mechanisms):
        return LockstepStreams(mechanisms)
    return None
