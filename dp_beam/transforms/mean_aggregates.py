"""Per-step aggregates of ``ContinualMean`` and where the median samples live.

:class:`MergeAggregates` combines the users' :class:`MeanAggregate` s of one
step (in place, linear in the step's events); :class:`PackedSamples` carries a
step's median samples as arrays; :class:`MedianStoreInLog` keeps Algorithm 7's
samples (``preset="paper"``, docs/privacy/mean.md M-6) in the stream's
append-only log instead of the state rewritten at every step. Nothing here
changes what is released: merging is a sum, and the samples reach the core
unchanged.
"""

import dataclasses
import pickle  # noqa: F401  (the PackedSamples example pickles)
from typing import Any, Dict, Iterable, List, Optional, Union

import apache_beam as beam
import numpy as np

from dp_beam.mechanisms.continual_mean import ContinualMeanCore, MeanAggregate, MeanStep
from dp_beam.mechanisms.continual_mean.core import ContinualMeanState
from dp_beam.mechanisms.state import state_field

__all__ = ["MedianStoreInLog", "MedianStoreState", "MergeAggregates", "PackedSamples", "accumulator",
           "compacted", "expanded", "merge_into", "plain"]


class PackedSamples:
    """The ``(order_key, index, x)`` samples of a :class:`MeanAggregate`, packed for transport.

    The core only iterates over an aggregate's samples (the first 2^{L−1} of
    every user, kept for the medians of M-6), so a step's samples can leave
    a worker as three arrays instead of one tuple and one NumPy array per
    sample: pickling, decoding and the runners' state-size measurement then
    cost per step, not per sample (measured: they were most of the
    transform's time on the flights data). Samples added as triples are kept
    loose (appending is cheap) and packed when pickled. Iteration yields the
    triples, ``order_key = (first_step, uhash)`` as Python ints and ``x`` a
    float64 d-vector; ``+`` and :meth:`extend` concatenate, as the list form does.

    >>> s = PackedSamples([((0, 7), 1, np.array([0.5])), ((0, 7), 2, np.array([0.25]))])
    >>> s = pickle.loads(pickle.dumps(s)) + [((1, 3), 1, np.array([1.0]))]
    >>> [(k, i, x.tolist()) for k, i, x in s]
    [((0, 7), 1, [0.5]), ((0, 7), 2, [0.25]), ((1, 3), 1, [1.0])]
    """

    __slots__ = ("_chunks", "_loose")

    def __init__(self, triples: Iterable[Any] = (), chunks: Iterable[Any] = ()) -> None:
        self._chunks = list(chunks)
        self._loose = list(triples)

    def _pack(self):
        if self._loose:
            loose = self._loose
            keys = np.array([k for k, _, _ in loose], dtype=np.int64).reshape(-1, 2)
            idx = np.array([i for _, i, _ in loose], dtype=np.int64)
            xs = np.array([np.asarray(x, dtype=np.float64).reshape(-1) for _, _, x in loose])
            self._chunks.append((keys, idx, xs))
            self._loose = []
        return self._chunks

    def __len__(self) -> int:
        return sum(len(idx) for _, idx, _ in self._chunks) + len(self._loose)

    def __bool__(self) -> bool:
        return bool(self._loose) or any(len(idx) for _, idx, _ in self._chunks)

    def __iter__(self):
        for keys, idx, xs in self._chunks:
            for (first, uhash), i, x in zip(keys.tolist(), idx.tolist(), xs):
                yield (first, uhash), i, x
        yield from self._loose

    def extend(self, other: Iterable[Any]) -> None:
        if isinstance(other, PackedSamples):
            if other._chunks:
                self._pack()
                self._chunks.extend(other._chunks)
            self._loose.extend(other._loose)
        else:
            self._loose.extend(other)

    def __add__(self, other: Iterable[Any]) -> "PackedSamples":
        out = PackedSamples(self._loose, self._chunks)
        out.extend(other)
        return out

    def __radd__(self, other: Iterable[Any]) -> "PackedSamples":
        out = PackedSamples(other)
        out.extend(self)
        return out

    def __reduce__(self):
        if not self._loose and not self._chunks:
            # Most steps' accumulators carry no samples (every level active, or no medians).
            return (PackedSamples, ())
        chunks = self._pack()
        if len(chunks) > 1:
            # One chunk on the wire: a step's samples arrive from many workers.
            keys, idx, xs = zip(*chunks)
            chunks[:] = [(np.concatenate(keys), np.concatenate(idx), np.concatenate(xs))]
        return (PackedSamples, ((), chunks))


_MERGED_FIELDS = ("events", "counts", "low", "n_low", "prefix", "proj", "a_inc", "samples", "max_count")


def merge_into(acc: MeanAggregate, agg: MeanAggregate) -> MeanAggregate:
    """Adds ``agg`` into the accumulator ``acc`` in place; ``agg`` is left unchanged.

    ``MeanAggregate.merge`` builds a new aggregate and copies the sample list
    each time, which made a step's combine quadratic in its events. Arrays of
    ``agg`` may be stored in ``acc`` but are never modified in place (sums make
    new arrays), so inputs stay intact. ``acc.samples`` must be ``acc``'s own
    (a list or :class:`PackedSamples`), or the empty tuple of an aggregate without
    samples, which the first samples merged in replace by a :class:`PackedSamples`.
    """
    if MeanAggregate.__slots__ != _MERGED_FIELDS:
        # A field this in-place merge does not know: the mechanism's own merge.
        merged = acc.merge(agg)
        for name in MeanAggregate.__slots__:
            setattr(acc, name, getattr(merged, name))
        return acc
    acc.events += agg.events
    # The six sums written out: a per-event loop over field names cost more than the sums.
    if agg.counts:
        _add_into(acc.counts, agg.counts)
    if agg.low:
        _add_into(acc.low, agg.low)
    if agg.n_low:
        _add_into(acc.n_low, agg.n_low)
    if agg.prefix:
        _add_into(acc.prefix, agg.prefix)
    if agg.proj:
        _add_into(acc.proj, agg.proj)
    if agg.a_inc:
        _add_into(acc.a_inc, agg.a_inc)
    if agg.samples:
        if type(acc.samples) is tuple:
            acc.samples = PackedSamples()
        acc.samples.extend(agg.samples)
    if agg.max_count > acc.max_count:
        acc.max_count = agg.max_count
    return acc


def _add_into(mine: Dict[Any, Any], other: Dict[Any, Any]) -> None:
    for key, val in other.items():
        mine[key] = mine[key] + val if key in mine else val


def accumulator() -> MeanAggregate:
    """An empty aggregate for :func:`merge_into`. Its samples are the empty tuple until
    the first ones arrive (then a :class:`PackedSamples` of its own): a step's
    accumulator usually has none, and three tracked objects fewer per (key, step) cost
    the garbage collector measurably less while a bundle's table is alive."""
    return MeanAggregate()


class MergeAggregates(beam.CombineFn):
    """Merges the :class:`MeanAggregate` s of a step (:func:`merge_into`).

    An accumulator leaves a bundle compacted to :meth:`MeanAggregate.fields`
    (:meth:`compact`, which Beam's lifted combine calls before the shuffle, and
    :class:`~dp_beam.transforms.mean_users.WithholdReleaseTotals` before the
    shard's grouping): plain dicts and numbers that the runner's coder writes
    itself, where an aggregate object is pickled. Encoding and decoding a step's
    partial took a quarter of the time that way (2.3 µs against 10.5 µs, timed on
    aggregates recorded from a ``benchmarks/scale.py`` mean run). :meth:`merge_accumulators`
    and :meth:`extract_output` take either form; the sums are the same.

    >>> fn = MergeAggregates()
    >>> a = fn.add_input(fn.create_accumulator(), MeanAggregate())
    >>> fn.extract_output(fn.merge_accumulators([fn.compact(a), a])).events
    0
    """

    def create_accumulator(self):
        return accumulator()

    def add_input(self, acc, agg):
        return merge_into(acc, agg)

    def merge_accumulators(self, accs):
        out = accumulator()
        for a in accs:
            merge_into(out, expanded(a))
        return out

    def compact(self, acc):
        return compacted(acc)

    def extract_output(self, acc):
        return expanded(acc)


def compacted(acc: MeanAggregate) -> tuple:
    """An accumulator as it crosses a grouping: its :meth:`~MeanAggregate.fields`."""
    return acc.fields()


def expanded(acc: Union[MeanAggregate, tuple]) -> MeanAggregate:
    """The :class:`MeanAggregate` of an accumulator in either form (:func:`compacted`)."""
    return acc if type(acc) is MeanAggregate else MeanAggregate.from_fields(acc)


def plain(x: Any) -> Union[float, List[float]]:
    """A core output (float or d-array) as a float or a list of floats (JSON-serialisable)."""
    if isinstance(x, np.ndarray):
        return [float(v) for v in x.ravel()]
    return float(x)


class _LoggedSamples(dict):
    """The core's median sample store (``ContinualMeanCore.store``), its history in a
    :class:`~dp_beam.transforms.bag_log.BagLog`.

    Holds this step's new samples; the samples of earlier steps are read
    from the log only when the core iterates the store (the step where a
    level activates and runs its private median, at most once per level).
    """

    def __init__(self, log, stored):
        super().__init__()
        self._log = log
        self._stored = stored   # log entries 1..stored hold the earlier steps' samples
        self.loaded = False

    def new_samples(self):
        """This step's samples as ``[(order key, index, x as a list)]`` (before any load)."""
        return self._new if self.loaded else [
            (key, i, x.tolist()) for key, samples in dict.items(self) for i, x in samples]

    def items(self):
        if not self.loaded:
            self._new = self.new_samples()
            self.clear()
            for entry in self._log.read(0, self._stored) + [self._new]:
                for key, i, x in entry:
                    self.setdefault(key, []).append((i, np.asarray(x, dtype=np.float64)))
            self.loaded = True
        return super().items()


@dataclasses.dataclass(frozen=True)
class MedianStoreState(ContinualMeanState):
    """The state of a :class:`MedianStoreInLog`: its core's, then how many entries of samples
    the log holds (None once the store is dropped; a state without it reads as 0)."""

    store_entries: Optional[int] = state_field(default=0, kw_only=True)


class MedianStoreInLog:
    """A :class:`ContinualMeanCore` (``preset="paper"``) whose sample store lives in a log.

    Algorithm 7's medians read each user's first samples, so the core keeps
    them until every level is active: with ``preset="paper"`` that store
    grew with the data (11 KB to 535 KB over 300 steps of 100 samples) and
    was rewritten at every firing. Here each step's new samples are appended
    once to the stream's append-only log (a ``BagState``), read back only at
    an activation, and dropped when the store is (all levels active); the
    rewritten state holds no samples.
    """

    def __init__(self, core: ContinualMeanCore, log: Any, stored: Optional[int] = 0) -> None:
        self.core = core
        self._log = log
        self._stored = stored

    @property
    def t(self) -> int:
        return self.core.t

    def step(self, agg: Optional[MeanAggregate] = None) -> MeanStep:
        core = self.core
        live = core.store is not None and self._stored is not None
        store = core.store = _LoggedSamples(self._log, self._stored or 0) if live else {}
        out = core.step(agg)
        if live:
            if core.store is store:
                # Consecutive log indices: one entry per step while the store lives.
                self._stored += 1
                self._log.append(self._stored, store.new_samples())
            else:
                # Every level is active: the samples are never read again.
                self._log.release_before(self._stored + 1)
                self._stored = None
        core.store = {}
        return out

    def to_state(self) -> Dict[str, Any]:
        """The core's state and the number of log entries (:class:`MedianStoreState`)."""
        core = self.core.state_record()
        fields = {f.name: getattr(core, f.name) for f in dataclasses.fields(core)}
        return MedianStoreState(**fields, store_entries=self._stored).to_state()
