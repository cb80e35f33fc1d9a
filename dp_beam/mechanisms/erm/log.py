"""The block log: where an ERM stream keeps its complete blocks of raw points.

``docs/design.md`` D1.3 (per-key state; seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*).
:class:`BlockLog` is the protocol an engine implements (the Beam transforms
back it with a ``BagState``); :class:`MemoryBlockLog` is the engine-free
default.
"""

from typing import List, Optional, Tuple

import numpy as np

__all__ = ["BlockLog", "MemoryBlockLog"]


class BlockLog:
    """Where an ERM stream keeps its complete blocks of raw points (design D1.3, per-key state).

    design D1.3, notes of the per-key state table: Alg. 4 and Alg. 2 need the
    history, "store it in a durable per-key log, not in memory". The stream
    splits its state in two: the *small state* of :meth:`ERMStream.to_state`
    (the partial block, the O(log t) models, counters) that an engine rewrites
    at every firing, and this log of full blocks, which only grows by appends
    and is read back only by the trainings that use old blocks.

    The stream talks to it through three calls:

    * :meth:`append` — block ``index`` (1-based count) is complete;
    * :meth:`read` — the blocks of the block interval ``(lo, hi]``, in order,
      when a model trains on them (the newest block is read back too, so a log
      may answer from what it has not yet written);
    * :meth:`release_before` — blocks below ``keep`` are never read again
      (the stream's retention bound); a log may drop them at once or later.

    A block is ``(X, y)``: clipped features ``(block_size, d)`` and class
    indices ``(block_size,)``. Engines provide their own implementation (the
    Beam transforms: a ``BagState``, see ``dp_beam.transforms.release.BagLog``;
    any object with these three methods will do); :class:`MemoryBlockLog` is
    the default.
    """

    def append(self, index: int, block: Tuple[np.ndarray, np.ndarray]) -> None:
        raise NotImplementedError

    def read(self, lo: int, hi: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError

    def release_before(self, keep: int) -> None:
        raise NotImplementedError


class MemoryBlockLog(BlockLog):
    """The default, in-memory :class:`BlockLog`: drops released blocks at once.

    Its blocks are part of the stream's :meth:`~ERMStream.to_state` (that is
    the engine-free behaviour: one self-contained state).

    >>> import numpy as np
    >>> log = MemoryBlockLog()
    >>> for i in (1, 2, 3):
    ...     log.append(i, (np.full((2, 1), float(i)), np.zeros(2, dtype=np.int64)))
    >>> [float(X[0, 0]) for X, _ in log.read(1, 3)]
    [2.0, 3.0]
    >>> log.release_before(3); sorted(log.blocks)
    [3]
    """

    def __init__(self, blocks: Optional[dict] = None) -> None:
        self.blocks = dict(blocks or {})

    def append(self, index: int, block: Tuple[np.ndarray, np.ndarray]) -> None:
        self.blocks[index] = block

    def read(self, lo: int, hi: int) -> List[Tuple[np.ndarray, np.ndarray]]:
        return [self.blocks[b] for b in range(lo + 1, hi + 1)]

    def release_before(self, keep: int) -> None:
        for b in [b for b in self.blocks if b < keep]:
            del self.blocks[b]
