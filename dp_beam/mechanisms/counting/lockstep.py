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

Tree and BLT streams can also live as their arrays alone (``arrays()``,
``from_arrays(template, arrays)``, ``stream_state(j)``): a streaming shard
stores those between its firings instead of one state per stream.

>>> from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
>>> trees = [BinaryTreeMechanism(1.0, horizon=8, rng=ZeroNoise()) for _ in range(2)]
>>> from dp_beam.mechanisms.counting import LockstepTrees
>>> lock = LockstepTrees(trees)
>>> [lock.step([1.0, 2.0], [ZeroNoise(), ZeroNoise()]) for _ in range(3)]
[[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]]
>>> lock.write_back(); [m.t for m in trees], trees[1].step(2.0)
([3, 3], 8.0)
"""

from typing import Any, Dict, List, Optional, Sequence

from ..noise import NoiseSource, ZeroNoise
from .parameters import CounterParameters

__all__ = ["Lockstep", "LockstepStreams", "lockstep_of"]


class Lockstep:
    """What every way of stepping streams together shares: the streams, scalar counters
    (``dim == 1``) of one class with a swappable noise source (``set_noise_source``),
    the same parameters and the same step count (:meth:`eligible`), and the step count,
    the first stream's mechanism and each stream's last source after a step.

    ``mechanism_class``: the exact class a subclass steps (``None``: any such
    counter). A subclass's ``step(x, sources)`` takes each stream's element
    ``x[j]`` and noise source ``sources[j]`` and returns each stream's release,
    what ``m.set_noise_source(sources[j])`` then ``m.step(x[j])`` returns;
    :meth:`write_back` then gives each mechanism the state of the steps taken
    (a subclass adds its own part in :meth:`_write_member`).

    Privacy cost: none of its own; each stream costs what its mechanism states.
    """

    mechanism_class: Optional[type] = None

    def __init__(self, mechanisms: Sequence[CounterParameters]) -> None:
        mechanisms = list(mechanisms)
        if not self.eligible(mechanisms):
            name = getattr(self.mechanism_class, "__name__", "scalar counter")
            raise ValueError(f"mechanisms must be one or more {name} streams of one class with "
                             "dim 1, the same parameters and the same step count")
        self._members = mechanisms
        self._template = mechanisms[0]
        self._n = len(mechanisms)
        self._t = self._template.t
        self._last_sources = None

    @classmethod
    def _without_members(cls, template: CounterParameters, n: int, t: int) -> "Lockstep":
        """An instance for ``n`` streams at step ``t`` held by the subclass's own arrays, with
        no mechanism per stream (its ``from_arrays`` sets the arrays): :meth:`write_back`
        has nothing to write to."""
        self = cls.__new__(cls)
        self._members = []
        self._template = template
        self._n, self._t = int(n), int(t)
        self._last_sources = None
        return self

    @classmethod
    def eligible(cls, mechanisms: Sequence[object]) -> bool:
        """Whether ``mechanisms`` can be stepped together by this class."""
        if not mechanisms:
            return False
        first = mechanisms[0]
        kind = type(first)
        if cls.mechanism_class is not None and kind is not cls.mechanism_class:
            return False
        if not (isinstance(first, CounterParameters) and hasattr(first, "set_noise_source")
                and first.dim == 1):
            return False
        config, t = first.config, first.t
        return all(type(m) is kind and m.t == t and m.config == config for m in mechanisms)

    @property
    def t(self) -> int:
        """Steps consumed by every stream."""
        return self._t

    @property
    def template(self) -> CounterParameters:
        """The first stream's mechanism, for the public functions of the shared parameters
        (``noise_std(t)``, ``ci_halfwidth(t)``, ``name``)."""
        return self._template

    def __len__(self) -> int:
        return self._n

    def _check_step(self, x, sources):
        n = self._n
        if len(x) != n or len(sources) != n:
            raise ValueError(f"x and sources must have one entry per stream ({n}), "
                             f"got {len(x)} and {len(sources)}")

    def write_back(self) -> None:
        """Gives every stream's mechanism its state after the steps taken here (and, as after
        its own steps, the source of its last draw)."""
        sources = self._last_sources
        for j, mechanism in enumerate(self._members):
            mechanism._t = self._t
            self._write_member(j, mechanism)
            if sources is not None:
                mechanism.set_noise_source(sources[j])

    def write_counts(self) -> None:
        """Gives every stream's mechanism the step count of the steps taken here, and nothing
        else: enough for what is a public function of the parameters and the step count
        (``noise_std(t)``, ``ci_halfwidth(t)`` at ``m.t``) between two steps, at a fraction
        of :meth:`write_back`'s cost. The streams' states stay here until :meth:`write_back`."""
        t = self._t
        for mechanism in self._members:
            mechanism._t = t

    def _write_member(self, j, mechanism):
        """A subclass's part of :meth:`write_back` for stream j."""

    def stream_state(self, j: int) -> Dict[str, Any]:
        """Stream j's state: what its own mechanism's ``to_state()`` gives after the same steps
        (for streams held as arrays only, whose mechanisms are not kept)."""
        template = self._template
        mechanism = type(template).from_config(template.config, rng=ZeroNoise())
        mechanism._t = self._t
        self._fresh_member(j, mechanism)
        self._write_member(j, mechanism)
        return mechanism.to_state()

    def _fresh_member(self, j, mechanism):
        """Gives a new mechanism (:meth:`stream_state`) the part of stream j's state that
        :meth:`_write_member` does not write."""


class LockstepStreams(Lockstep):
    """Scalar counting streams (see :class:`Lockstep`), each stepped by its own mechanism,
    all in one call per step.

    A step is each stream's ``set_noise_source(sources[j])`` then
    ``step(x[j])``, so the mechanisms are stepped in place. If a stream's step
    raises, the streams before it have taken the step (each stream's own
    step leaves it unchanged when it raises).

    Privacy cost: none of its own; each stream costs what its mechanism states.
    """

    def step(self, x: Sequence[float], sources: Sequence[NoiseSource]) -> List[float]:
        """``[m.step(x[j])]`` for each stream j after ``m.set_noise_source(sources[j])``."""
        self._check_step(x, sources)
        out = []
        for mechanism, value, source in zip(self._members, x, sources):
            mechanism.set_noise_source(source)
            out.append(float(mechanism.step(value)))
        return out

    @property
    def t(self) -> int:
        """Steps consumed by every stream (the first stream's own count)."""
        return self._template.t

    def write_back(self) -> None:
        """Nothing to do: every stream was stepped in place by its own mechanism (writing
        a step count back would undo the steps of a partly failed call)."""

    def write_counts(self) -> None:
        """Nothing to do, as for :meth:`write_back`."""


def lockstep_of(mechanisms: Sequence[object]) -> Optional[Lockstep]:
    """The fastest way to step these streams together:
    :class:`~dp_beam.mechanisms.counting.tree.LockstepTrees` for tree streams,
    :class:`~dp_beam.mechanisms.counting.blt.LockstepBLT` for BLT streams, else
    :class:`LockstepStreams`, or ``None`` when they cannot be."""
    # Imported here: both build on Lockstep, defined above.
    from .blt import LockstepBLT
    from .tree import LockstepTrees

    for cls in (LockstepTrees, LockstepBLT, LockstepStreams):
        if cls.eligible(mechanisms):
            return cls(mechanisms)
    return None
