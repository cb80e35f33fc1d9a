"""The ordered release for many keys: one stateful DoFn and one timer per *shard* of keys.

:class:`~dp_beam.transforms.release.OrderedReleaseDoFn` keeps one stream per
Beam key, so a runner fires one timer per key per release and keeps the
state of every key in its own cells. At thousands of keys the per-firing cost
of the runner (state reads and writes, the timer, the cache's size estimate
of each value) dominates the release itself. Here the streams are routed to
a bounded number of shards by a public hash of their key
(:func:`shard_of`), and one stateful DoFn per shard keeps the state of all
its streams in one cell and sets a single timer: the earliest step end any
of its streams waits for. When it fires, every stream whose own timer is
due is released.

The per-stream logic is not re-implemented: :class:`ShardedReleaseDoFn` runs
the per-key DoFn's own ``_process`` and ``_fire`` on in-memory stand-ins for
its state cells and timer, with the stream key as the key. So the
schedule, the late-data policy, key admission, ledger entries, invalid
records and the noise identities (transform, stream key, step) are those of
the per-key path, and the releases are bit-for-bit the same for the same
noise key or test seed (tests/transforms/test_shards.py checks it on
batch and streaming input).

On streaming input a firing releases one step per stream, and restoring each
stream's mechanism from its state and writing it back cost more than the step.
Tree and BLT streams that open together (the declared keys of a shard, at the
public start) are therefore kept as arrays with a column per stream (a
*group*, :meth:`~dp_beam.mechanisms.counting.tree.LockstepTrees.arrays`,
:meth:`~dp_beam.mechanisms.counting.blt.LockstepBLT.arrays`) and stepped from
them, with the same records bit for bit; a group breaks up into streams with
their own states as soon as its streams stop firing together.

Bounded input needs no state or timers at all: every timer of the per-key
path fires only after all input is in. :class:`BatchShardReleaseDoFn` takes
a shard's whole input after one ``GroupByKey`` and fires each stream once;
given the combine fn of the transform, it also combines the raw events per
(key, step) itself, so a bounded count or sum groups its events once, by
shard, instead of once per (key, step) and again per stream.

The shard of a key is public (a hash of the key, which is public: declared
or privately selected), so routing reveals nothing. Specs that keep a
per-key log (the ERM streams, the paper preset of the mean) are sharded only
on bounded input: each stream fires once there, so its log lives in memory
for that one firing, while a streaming shard would rewrite every stream's
log with its one state cell at every firing; streaming, they keep the
per-key path and its ``BagState`` log.
"""

import itertools
from typing import Any, Dict, FrozenSet, NamedTuple, Optional, Tuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.counting import LockstepBLT, LockstepTrees
from dp_beam.mechanisms.noise_key import encode_identity
from dp_beam.transforms.release import LoggedReleaseDoFn, OrderedReleaseDoFn
from dp_beam.transforms.release_spec import key_label
from dp_beam.transforms.schedule import NotAdmitted, StreamStart
# Routing lives with the keys (the partial totals route by shard before the release).
from dp_beam.transforms.stream_keys import KEYS_PER_SHARD, default_shards, shard_of

__all__ = ["shard_of", "default_shards", "ShardedReleaseDoFn", "BatchShardReleaseDoFn",
           "AbsentShardReleaseDoFn", "KEYS_PER_SHARD", "RELEASED_SHARDS"]

#: The output of :class:`BatchShardReleaseDoFn` given the markers as a side input: the
#: shards it released.
RELEASED_SHARDS = "released_shards"


class _Cell:
    """A ReadModifyWriteState stand-in over one field of a stream's entry."""

    def __init__(self, entry: Dict[str, Any], name: str):
        self._entry, self._name = entry, name

    def read(self):
        return self._entry.get(self._name)

    def write(self, value):
        self._entry[self._name] = value

    def clear(self):
        self._entry.pop(self._name, None)


class _Bag:
    """A BagState stand-in over one list field of a stream's entry (its buffered aggregates,
    or its log)."""

    def __init__(self, entry: Dict[str, Any], name: str = "buffer"):
        self._entry, self._name = entry, name

    def read(self):
        return list(self._entry.get(self._name, ()))

    def add(self, value):
        self._entry.setdefault(self._name, []).append(value)

    def clear(self):
        self._entry.pop(self._name, None)


class _Timer:
    """A watermark-timer stand-in: remembers the stream's next firing time (seconds)."""

    def __init__(self, entry: Dict[str, Any]):
        self._entry = entry

    def set(self, when):
        self._entry["timer"] = float(when)

    def clear(self):
        self._entry.pop("timer", None)


#: The ways of stepping streams together that can hold them as arrays only, by the exact
#: class of the mechanisms they step.
_ARRAY_LOCKSTEPS = {cls.mechanism_class: cls for cls in (LockstepTrees, LockstepBLT)}


class _Column(NamedTuple):
    """A stream's mechanism cell while its state is column ``index`` of the shard's group
    ``group`` (:class:`ShardedReleaseDoFn`)."""
    group: int
    index: int


@beam.typehints.with_output_types(Any)
class ShardedReleaseDoFn(beam.DoFn):
    """The per-key ordered release of ``inner`` for every stream of a shard, one timer per shard.

    Input: ``(shard, (key, (step, aggregate)))``; outputs: those of ``inner``
    (releases, and the ``accounting`` and ``invalid`` tags). State: one cell
    mapping each stream key to its stand-in cells (buffer, mechanism state,
    next/first/earliest step, due time), rewritten once per element or
    firing. The shard's timer is always the earliest due time of its streams;
    a firing at time F releases every stream due at or before F, each with
    its own due time as the firing time (as its own timer would have fired),
    repeating while a stream re-arms at or before F.

    Streams that open in the same firing and release the same steps (every
    declared key of the shard, which all open at the public start) are
    stepped together when the spec can hold them as arrays (tree and BLT
    streams, ``LockstepTrees.arrays``, ``LockstepBLT.arrays``): they form a
    *group*, kept in a second cell as arrays with a column per stream, and
    each stream's mechanism cell names its column (:class:`_Column`). A
    firing then steps the whole group from its arrays, with no state to
    restore or write per stream. The group lasts while all its streams fire
    together over the same steps; otherwise each stream gets its own state
    (the state its own mechanism would have) and is released on its own from
    then on. The records are the per-key path's either way, bit for bit.
    """

    STREAMS = ReadModifyWriteStateSpec("streams", PickleCoder())
    #: The arrays of the shard's groups of streams stepped together.
    GROUPS = ReadModifyWriteStateSpec("groups", PickleCoder())
    #: The time the shard's timer is set for (so an element need not scan all streams).
    ARMED = ReadModifyWriteStateSpec("armed", PickleCoder())
    TIMER = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, inner: OrderedReleaseDoFn) -> None:
        if not isinstance(inner, OrderedReleaseDoFn) or getattr(inner._spec, "uses_log", False):
            raise ValueError("inner must be an OrderedReleaseDoFn over a spec without a log")
        self._inner = inner
        self._template = None

    def setup(self):
        self._inner.setup()

    @staticmethod
    def _cells(entry):
        return (_Bag(entry), _Cell(entry, "mechanism"), _Cell(entry, "next"), _Cell(entry, "first"),
                _Cell(entry, "earliest"), _Timer(entry))

    def process(self, element, streams_state=beam.DoFn.StateParam(STREAMS),
                armed_state=beam.DoFn.StateParam(ARMED), timer=beam.DoFn.TimerParam(TIMER)):
        _, (key, value) = element
        streams = streams_state.read() or {}
        entry = streams.setdefault(key, {})
        buffer, _, nxt, first, earliest, stream_timer = self._cells(entry)
        yield from self._inner._process((key, value), buffer, nxt, first, earliest, stream_timer)
        streams_state.write(streams)
        # Only this stream's due time can have moved, and only to an earlier or
        # a first time (a stream's timer is set when it opens or sees data).
        due, armed = entry.get("timer"), armed_state.read()
        if due is not None and (armed is None or due < armed):
            timer.set(due)
            armed_state.write(due)

    @on_timer(TIMER)
    def on_release(self, fire=beam.DoFn.TimestampParam,
                   streams_state=beam.DoFn.StateParam(STREAMS),
                   groups_state=beam.DoFn.StateParam(GROUPS),
                   armed_state=beam.DoFn.StateParam(ARMED),
                   timer=beam.DoFn.TimerParam(TIMER)):
        streams = streams_state.read() or {}
        groups = groups_state.read() or {}
        had_groups = bool(groups)
        now = fire.micros / 1e6
        inner = self._inner
        while True:
            # The streams due earliest fire first, all at that time (each stream's firings
            # stay in the order of its due times, as its own timer's would).
            due = [e["timer"] for e in streams.values()
                   if e.get("timer") is not None and e["timer"] <= now]
            if not due:
                break
            when = min(due)
            firings = []
            for key, entry in streams.items():
                if entry.get("timer") == when:
                    del entry["timer"]
                    stored = entry.get("mechanism")
                    if stored is not None and not isinstance(stored, _Column):
                        # A stream with a state of its own fires alone, as on the per-key path.
                        yield from inner._fire(key, Timestamp(when), *self._cells(entry))
                        continue
                    firing = yield from inner._fire_start(key, Timestamp(when),
                                                          *self._cells(entry))
                    if firing is not None:
                        firings.append(firing)
            yield from self._fire(firings, streams, groups)
        streams_state.write(streams)
        if groups:
            groups_state.write(groups)
        elif had_groups:
            groups_state.clear()
        due = [e["timer"] for e in streams.values() if e.get("timer") is not None]
        if due:
            timer.set(min(due))
            armed_state.write(min(due))
        else:
            armed_state.clear()

    def _fire(self, firings, streams, groups):
        """Completes the started firings: each group whose streams all fire over the same
        steps from its arrays; streams opened here that can be held as arrays as a new
        group; every other stream on its own (a group that cannot fire whole gives each
        of its streams its own state first)."""
        inner = self._inner
        members, alone = {}, []
        for firing in firings:
            column = firing.cells[1].read()
            if isinstance(column, _Column):
                members.setdefault(column.group, {})[column.index] = firing
            else:
                alone.append(firing)
        for gid, by_index in members.items():
            group = groups[gid]
            ordered = [by_index.get(j) for j in range(len(group["keys"]))]
            if (all(f is not None for f in ordered)
                    and len({(f.nxt, f.until) for f in ordered}) == 1
                    and ordered[0].nxt <= ordered[0].until):
                yield from self._fire_group(gid, group, ordered, streams, groups)
            else:
                self._ungroup(gid, streams, groups)
                alone.extend(ordered[j] for j in sorted(by_index))
        alone = yield from self._group_opened(alone, streams, groups)
        yield from inner._fire_together(alone)

    def _fire_group(self, gid, group, firings, streams, groups):
        """Releases a whole group from its arrays and stores them again."""
        lockstep = self._group_lockstep(group)
        results = yield from self._inner._release_lockstep(firings, firings[0].nxt,
                                                           firings[0].until, lockstep=lockstep)
        yield from self._keep_group(gid, lockstep, firings, results, streams, groups)

    def _keep_group(self, gid, lockstep, firings, results, streams, groups):
        """Stores group ``gid``'s arrays after its release and finishes each stream's firing
        (its mechanism cell names its column: no state of its own to write)."""
        inner = self._inner
        keys = [firing.key for firing in firings]
        groups[gid] = {"keys": keys, "arrays": lockstep.arrays()}
        for j, (firing, (_, step, done)) in enumerate(zip(firings, results)):
            firing.cells[1].write(_Column(gid, j))
            yield from inner._fire_finish(firing, None, step, done, False)
        if any(inner._closed(streams[key].get("next")) for key in keys):
            # A group whose streams close (the end of the schedule or of the horizon) is
            # not stepped again; each stream keeps its final state, as on its own.
            self._ungroup(gid, streams, groups, lockstep)

    def _group_opened(self, firings, streams, groups):
        """Releases as new groups the streams opened by this firing that release the same
        steps and that the spec can hold as arrays; returns the other firings."""
        inner = self._inner
        if not inner._per_step_seed():
            return firings
        by_steps, rest = {}, []
        for firing in firings:
            if firing.mechanism is not None and firing.nxt <= firing.until:
                by_steps.setdefault((firing.nxt, firing.until), []).append(firing)
            else:
                rest.append(firing)
        for (nxt, until), group in by_steps.items():
            lockstep = (inner._spec.lockstep([f.mechanism for f in group])
                        if len(group) > 1 else None)
            if type(lockstep) not in _ARRAY_LOCKSTEPS.values():
                rest.extend(group)
                continue
            results = yield from inner._release_lockstep(group, nxt, until, lockstep=lockstep)
            yield from self._keep_group(max(groups, default=-1) + 1, lockstep, group, results,
                                        streams, groups)
        return rest

    def _group_lockstep(self, group):
        """A group's streams, stepped from its arrays."""
        template = self._template
        if template is None:
            # Public parameters only (the spec's configuration): no noise is drawn from it.
            template = self._template = self._inner._spec.new_mechanism(ZeroNoise())
        return _ARRAY_LOCKSTEPS[type(template)].from_arrays(template, group["arrays"])

    def _ungroup(self, gid, streams, groups, lockstep=None):
        """Gives each stream of group ``gid`` its own state (its column, as its own
        mechanism's state) and drops the group."""
        group = groups.pop(gid)
        if lockstep is None:
            lockstep = self._group_lockstep(group)
        for j, key in enumerate(group["keys"]):
            entry = streams.get(key)
            if entry is not None and entry.get("mechanism") == _Column(gid, j):
                entry["mechanism"] = lockstep.stream_state(j)


@beam.typehints.with_output_types(Any)
class BatchShardReleaseDoFn(beam.DoFn):
    """The release of ``inner`` for a whole shard of bounded input: no state, no timers.

    Input: ``(shard, iterable of (key, (step, aggregate)))`` after a
    ``GroupByKey``, i.e. all of the shard's input at once, as it is for
    bounded input, where every per-key timer fires only after all input is
    in. Each element is fed to the per-key DoFn's own ``_process`` on
    in-memory stand-ins, then each stream whose timer was set is fired
    once at that time with ``_fire``, exactly as the stateful path would
    when the watermark reaches the end of input (its last firing: the mechanism's
    state is not serialised, as nothing reads it again; a spec with a log gets
    :class:`~dp_beam.transforms.bag_log.BagLog` over in-memory stand-ins of
    the log cells, empty as the per-key log is at that one firing). So the records (releases,
    ledger, invalid) are the same bit for bit, without a state read or
    write per element or a timer per shard. Streams are fired in the order
    of their keys' canonical encoding, so that the order does not depend on
    the runner's grouping. The streams (without a log) that release the same
    steps are released together, step by step, where the spec can step their
    mechanisms as one (:meth:`OrderedReleaseDoFn._fire_together`,
    :mod:`~dp_beam.mechanisms.counting.lockstep`).

    ``combine_fn``: the input is then lists of stream markers and partial
    accumulators ``[(key, step, accumulator), ...]`` of ``combine_fn`` (each
    bundle's totals of the shard, :class:`~dp_beam.transforms.steps.StepTotals`),
    and the aggregate of each (key, step) is their merge, as the combine
    upstream of the per-key path computes it (exactly the same for the
    order-free combines of the continual totals).
    """

    def __init__(self, inner: OrderedReleaseDoFn,
                 combine_fn: Optional[beam.CombineFn] = None) -> None:
        if not isinstance(inner, OrderedReleaseDoFn) or (
                getattr(inner._spec, "uses_log", False) and not isinstance(inner, LoggedReleaseDoFn)):
            raise ValueError("inner must be an OrderedReleaseDoFn (a LoggedReleaseDoFn for a spec "
                             "with a log)")
        if not inner._bounded:
            raise ValueError("the timer-free release needs bounded input (inner must be bounded)")
        self._inner = inner
        self._combine_fn = combine_fn

    def setup(self):
        self._inner.setup()

    def _aggregated(self, values):
        """With ``combine_fn``: the input holds lists of partial accumulators per (key, step),
        merged here (one grouping instead of a combine's and the release's); the stream
        markers pass through first, the merged aggregates follow key by key."""
        fn = self._combine_fn
        if fn is None:
            return values
        markers, partials = [], {}
        for entries in values:
            for key, step, value in entries:
                if isinstance(value, (StreamStart, NotAdmitted)):
                    markers.append((key, (step, value)))
                    continue
                steps = partials.get(key)
                if steps is None:
                    partials[key] = {step: value}
                elif step in steps:
                    # Another bundle's total of this (key, step); the merge is exact and
                    # order-free, so merging as they come equals merging all at once.
                    steps[step] = fn.merge_accumulators([steps[step], value])
                else:
                    steps[step] = value
        return itertools.chain(markers, self._merged(partials))

    def _merged(self, partials):
        """``(key, (step, aggregate))`` of the merged accumulators, made as they are consumed
        (few live objects: the collector's pauses grow with them)."""
        extract = self._combine_fn.extract_output
        for key, steps in partials.items():
            for step, acc in steps.items():
                yield key, (step, extract(acc))

    def process(self, element, markers=None):
        """``markers`` (a side input; only with ``combine_fn``): the stream markers of every
        shard, ``{shard: [(key, step, marker), ...]}`` (:meth:`~dp_beam.transforms.schedule.
        DeclaredKeys.shard_seeds`), for a grouping of the partial totals alone; the shard
        then also goes to :data:`RELEASED_SHARDS`, for :class:`AbsentShardReleaseDoFn`."""
        shard, values = element
        if markers is not None:
            values = itertools.chain((markers.get(shard, ()),), values)
            yield pvalue.TaggedOutput(RELEASED_SHARDS, shard)
        inner = self._inner
        # Each stream's entry and its stand-in cells, made once per stream (not per aggregate).
        streams: Dict[Any, Tuple[Dict[str, Any], tuple]] = {}
        for key, value in self._aggregated(values):
            stream = streams.get(key)
            if stream is None:
                entry = {}
                stream = streams[key] = (entry, ShardedReleaseDoFn._cells(entry))
            buffer, _, nxt, first, earliest, stream_timer = stream[1]
            yield from inner._process((key, value), buffer, nxt, first, earliest, stream_timer)
        logged = isinstance(inner, LoggedReleaseDoFn)
        firings = []
        for key in sorted(streams, key=lambda k: encode_identity((key_label(k),))):
            # Taken out as it fires: a stream that fires alone (with a log) is done after
            # its firing, and its buffered aggregates and log, a whole history of points
            # for ERM, are then freed before the next stream's firing instead of all at the end.
            entry, cells = streams.pop(key)
            # Bounded: a stream's timer is set once, at the end of its last
            # step, and its firing does not set another.
            due = entry.pop("timer", None)
            if due is None:
                continue
            if logged:
                log = inner.stream_log(_Bag(entry, "log"), _Cell(entry, "log_meta"))
                yield from inner._fire(key, Timestamp(due), *cells, final=True, log=log)
                continue
            firing = yield from inner._fire_start(key, Timestamp(due), *cells)
            if firing is not None:
                firings.append(firing)
        # The streams that release the same steps (on bounded input, every declared key's)
        # are released step by step together, where the spec can step them as one.
        yield from inner._fire_together(firings, final=True)


class AbsentShardReleaseDoFn(BatchShardReleaseDoFn):
    """The release of the shards that no partial total reached, for
    :class:`BatchShardReleaseDoFn` given its markers as a side input.

    Input: the routed markers ``(shard, [(key, step, marker), ...])``, one element per shard
    that has streams; side input: the shards the grouped release released
    (:data:`RELEASED_SHARDS`). A shard among them is skipped; any other is released from its
    markers alone, so its streams release every step of the schedule with empty aggregates,
    as they would have through the grouping. Together the two release every shard that has
    streams exactly once, whatever the data.
    """

    def __init__(self, inner: OrderedReleaseDoFn, combine_fn: beam.CombineFn) -> None:
        super().__init__(inner, combine_fn)
        self._seen: Optional[Tuple[Any, FrozenSet[int]]] = None

    def process(self, element, released):
        shard, markers = element
        # The side input is the same object for every element of a bundle: one set per bundle.
        if self._seen is None or self._seen[0] is not released:
            self._seen = (released, frozenset(released))
        if shard in self._seen[1]:
            return
        yield from super().process((shard, [markers]))
