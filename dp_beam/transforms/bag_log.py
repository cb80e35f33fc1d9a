"""A per-key append-only log over a Beam ``BagState``, for mechanisms that keep data for later.

The release DoFn rewrites a mechanism's state cell at every firing, so that
state must stay small; a spec with ``ReleaseSpec.uses_log`` (the ERM streams,
``docs/design.md`` D1.3) keeps its raw blocks in a :class:`BagLog` instead,
appended once and read back only in the firings that need them.
"""

from typing import Any, List, Optional

__all__ = ["BagLog"]


class BagLog:
    """A per-key append-only log in a Beam ``BagState``, read lazily (``docs/design.md`` D1.3).

    For a spec with ``uses_log``: the mechanism appends entries ``(index,
    payload)`` with consecutive int indices, reads back ranges of them, and
    says below which index it will never read again
    (``dp_beam.mechanisms.erm.BlockLog`` is the protocol). What the mechanism
    needs is then never rewritten at each firing:

    * appends are buffered and added to the bag once, at :meth:`flush` (the
      end of the firing); a read of an entry appended in the same firing is
      answered from that buffer;
    * the bag is read only when a read asks for an older entry (or to
      compact), at most once per firing;
    * released entries stay in the bag until they are at least as many as the
      live ones; then the bag is cleared and the live entries are added again
      (all entries released: cleared without reading). So the bag holds fewer
      than twice the live entries plus one firing's appends, and a compaction
      rewrites the live entries once per at least as many released ones:
      amortised O(1) state I/O per appended entry.

    Bookkeeping (entries stored, the oldest stored index, the release bound)
    lives in the small ``meta`` cell, so nothing else is read to decide.

    ``bag`` and ``meta`` are Beam state objects or anything with the same
    ``read``/``add``/``clear`` and ``read``/``write`` methods:

    >>> class Cell:
    ...     def __init__(self): self.v = None
    ...     def read(self): return self.v
    ...     def write(self, v): self.v = v
    >>> class Bag(list):
    ...     def read(self): return list(self)
    ...     def add(self, v): self.append(v)
    >>> bag, meta = Bag(), Cell()
    >>> log = BagLog(bag, meta)
    >>> for i in (1, 2, 3): log.append(i, f"block {i}")
    >>> log.read(1, 3), len(bag)            # the new entries, before they are written
    (['block 2', 'block 3'], 0)
    >>> log.release_before(2); log.flush(); [i for i, _ in bag]
    [2, 3]
    >>> log = BagLog(bag, meta)             # next firing
    >>> log.append(4, "block 4"); log.release_before(4); log.flush(); [i for i, _ in bag]
    [4]
    """

    def __init__(self, bag: Any, meta: Any, reads: Optional[Any] = None,
                 compactions: Optional[Any] = None) -> None:
        self._bag = bag
        self._meta = meta
        stored = meta.read()
        # (entries in the bag, index of the oldest one, release bound)
        self._stored, self._first, self._keep = stored if stored is not None else (0, None, None)
        self._read_meta = stored
        self._loaded = None
        self._pending = {}
        self._reads, self._compactions = reads, compactions
        self.bag_reads = 0

    def append(self, index: int, payload: Any) -> None:
        self._pending[index] = payload

    def release_before(self, keep: int) -> None:
        self._keep = keep if self._keep is None else max(self._keep, keep)

    def _load(self):
        if self._loaded is None:
            self._loaded = {i: payload for i, payload in self._bag.read()}
            self.bag_reads += 1
            if self._reads is not None:
                self._reads.inc(len(self._loaded))
        return self._loaded

    def read(self, lo: int, hi: int) -> List[Any]:
        """Payloads of entries lo+1..hi, in order (the bag is read only for older entries)."""
        out = []
        for i in range(lo + 1, hi + 1):
            if i in self._pending:
                out.append(self._pending[i])
                continue
            stored = self._load()
            if i not in stored:
                raise KeyError(f"log entry {i} was released or never appended")
            out.append(stored[i])
        return out

    @property
    def stored(self) -> int:
        """Entries in the bag (after :meth:`flush`)."""
        return self._stored

    def flush(self) -> None:
        """Writes this firing's appends (and compacts); call once, at the end of the firing."""
        keep = self._keep if self._keep is not None else 1
        indices = sorted(self._pending)
        if self._stored:
            last = self._first + self._stored - 1
        else:
            last = None
        if indices:
            last = indices[-1]
        if last is None:
            self._write_meta()
            return
        total = self._stored + len(indices)
        live = max(0, last - keep + 1)
        released = total - live
        if live == 0:
            if self._stored:
                self._bag.clear()
            self._stored, self._first = 0, None
        elif released and released >= live:
            entries = dict(self._load()) if self._stored else {}
            entries.update(self._pending)
            self._bag.clear()
            for i in range(keep, last + 1):
                self._bag.add((i, entries[i]))
            self._stored, self._first = live, keep
            if self._compactions is not None:
                self._compactions.inc()
        else:
            for i in indices:
                if i >= keep:
                    self._bag.add((i, self._pending[i]))
                    if self._first is None or not self._stored:
                        self._first = i
                    self._stored += 1
        self._pending = {}
        self._write_meta()

    def _write_meta(self):
        meta = (self._stored, self._first, self._keep)
        if meta != self._read_meta:
            self._meta.write(meta)
