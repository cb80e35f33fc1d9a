"""The ordered release DoFn: one per stream, generic over the mechanism.

``docs/design.md`` D1.3, D2: per-event work is combined per step upstream, so this
stateful DoFn sees one aggregate per step per stream (plus late panes). It
buffers the aggregates in a BagState and releases on an event-time timer, in
step order, once the watermark has passed a step; a looping timer releases the
empty steps; late aggregates (their step already released) are deferred into
the next unreleased step or dropped to ``invalid``. All mechanism state lives in
Beam state cells, so a restarted or rebalanced worker loses nothing.

The DoFn knows nothing about DP: a
:class:`~dp_beam.transforms.release_spec.ReleaseSpec` says how to build and
restore the mechanism, how to merge aggregates and what to emit per step.

The mechanism's state cell is rewritten at every firing, so it must stay small.
A mechanism that must keep data for later (the ERM streams keep raw blocks,
``docs/design.md`` D1.3) sets
``ReleaseSpec.uses_log``: :func:`~dp_beam.transforms.streams.release_in_order` then runs
:class:`LoggedReleaseDoFn`, which gives it a per-key append-only
:class:`~dp_beam.transforms.bag_log.BagLog` (a ``BagState``) read only when
needed. Specs without it run
:class:`OrderedReleaseDoFn` with exactly its own state cells.
"""

from typing import Any, NamedTuple, Optional, Union

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms import NoiseSource, make_noise
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
from dp_beam.mechanisms.stable_hash import stable_hash
from dp_beam.progress import ReleaseProgress
from dp_beam.records import InvalidElement
from dp_beam.transforms.bag_log import BagLog
from dp_beam.transforms.events import INVALID, NAMESPACE
from dp_beam.transforms.release_spec import (ACCOUNTING, CLOSED, NOT_ADMITTED, ReleaseSpec,
                                             key_label)
from dp_beam.transforms.schedule import NotAdmitted, StreamStart
from dp_beam.transforms.steps import global_element

__all__ = ["LoggedReleaseDoFn", "OrderedReleaseDoFn"]

#: Stream keys whose base noise source a release DoFn keeps (each a few hundred bytes).
_SOURCE_CACHE = 4096
#: Steps whose release timestamp a release DoFn keeps.
_STAMP_CACHE = 1 << 16


class _Firing(NamedTuple):
    """A started firing of one stream (:meth:`OrderedReleaseDoFn._fire_start`): its key, the
    first and last step it releases, the stream's first step, its pending aggregates per
    step, its mechanism (``None``: restored at the first release), the log arguments and
    the cells it finishes with (buffer, mechanism state, next step, timer)."""
    key: Any
    nxt: int
    until: int
    first: int
    pending: dict
    mechanism: Any
    with_log: dict
    log: Any
    cells: tuple


@beam.typehints.with_output_types(Any)
class OrderedReleaseDoFn(beam.DoFn):
    """Releases each stream's steps in order, every step, on the public schedule.

    Input: ``(key, (step, aggregate))`` in the global window, where a
    :class:`~dp_beam.transforms.schedule.StreamStart` aggregate opens the
    stream of ``key`` at ``step`` (the declared ``start`` for declared keys;
    the admission step for privately selected keys). Main output: the spec's
    release records; tagged outputs ``accounting`` (ledger entries, once per
    stream when it opens) and ``invalid``.

    The schedule is public (``docs/design.md`` D2): a stream releases every
    step from the step it opens at through ``end_step − 1``, events or not.
    Aggregates of a stream that has not opened yet wait in the buffer; those of
    steps before the opening step are merged into it (the first release covers
    everything before). For bounded input all timers fire after all input is
    in, so one firing at the end of step ``end_step − 1`` releases the whole
    stream. For unbounded input a looping timer releases each step as soon as
    the watermark passes its end; without ``end_step`` it never stops. No
    pause or stop depends on the data.

    ``opens="data"`` (private key selection only) instead opens a stream at its
    earliest step with data; its outputs are then only what the spec's
    :meth:`ReleaseSpec.release` yields (admissions), and a spec whose
    :meth:`ReleaseSpec.done` turns true stops its stream.

    ``late``: ``"defer"`` adds a late aggregate to the next unreleased step;
    ``"drop"`` sends it to ``invalid`` (as one record standing for its events).
    With ``allowed_lateness`` (seconds; ``None``: unbounded), ``"defer"``
    sends an aggregate to ``invalid`` instead when the stream had already
    released a step ending more than ``allowed_lateness`` after the end of
    the aggregate's step (the watermark was at least that far past it). The
    windows upstream keep unbounded lateness, so every late event reaches
    this decision: none is dropped by the runner without a record.
    An aggregate that arrives after its stream's last step goes to ``invalid``.
    A :class:`~dp_beam.transforms.schedule.NotAdmitted` aggregate closes a
    stream that never opened: its buffered events go to ``invalid``.

    Noise (``docs/design.md`` D5): with ``seed=None``
    (production) every draw is a function of the secret ``noise_key`` and
    the draw's identity (transform label, stream key, step, and whether the
    stream opens or steps there), through :class:`KeyedNoise`: the mechanism
    is restored with that step's source before each step, so a bundle
    retried from committed state, a replay or a second worker releases
    bit-identical values, never a second draw. ``seed``: test-only; an int
    makes the noise of step k of key K come from a NumPy generator seeded by
    (seed, hash(K), k) in the same way; a ``NoiseSource`` (e.g.
    ``ZeroNoise``) is used as is.
    """

    BUFFER = BagStateSpec("buffer", PickleCoder())
    MECHANISM = ReadModifyWriteStateSpec("mechanism", PickleCoder())
    NEXT = ReadModifyWriteStateSpec("next_step", VarIntCoder())
    FIRST = ReadModifyWriteStateSpec("first_step", VarIntCoder())
    EARLIEST = ReadModifyWriteStateSpec("earliest_step", VarIntCoder())
    TIMER = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, spec: ReleaseSpec, bounded: bool, late: str = "defer",
                 seed: Union[None, int, NoiseSource] = None, end_step: Optional[int] = None,
                 opens: str = "start", noise_key: Optional[NoiseKey] = None,
                 allowed_lateness: Optional[float] = None) -> None:
        if late not in ("defer", "drop"):
            raise ValueError(f"late must be 'defer' or 'drop', got {late!r}")
        if opens not in ("start", "data"):
            raise ValueError(f"opens must be 'start' or 'data', got {opens!r}")
        if bounded and end_step is None:
            raise ValueError("end_step is required for bounded input")
        self._spec = spec
        self._bounded = bounded
        self._late = late
        self._seed = seed
        if seed is None and noise_key is None:
            # Drawn here, it travels with the pickled DoFn: retries still agree.
            noise_key = NoiseKey.generate()
        self._noise_key = noise_key if seed is None else None
        self._end = end_step
        self._opens = opens
        self._allowed_lateness = allowed_lateness
        label = spec.transform
        self._released = Metrics.counter(NAMESPACE, f"{label}.released_steps")
        self._empty = Metrics.counter(NAMESPACE, f"{label}.empty_steps")
        self._late_deferred = Metrics.counter(NAMESPACE, f"{label}.late_deferred_events")
        self._late_dropped = Metrics.counter(NAMESPACE, f"{label}.late_dropped_events")
        self._too_late = Metrics.counter(NAMESPACE, f"{label}.beyond_lateness_events")
        self._progress = ReleaseProgress(label)  # rate-limited progress lines, events_used
        self._noise = None
        self._sources = {}
        self._stamps = {}

    def setup(self):
        if self._seed is not None and not isinstance(self._seed, int):
            self._noise = make_noise(self._seed)

    def _per_step_seed(self):
        return self._noise_key is not None or isinstance(self._seed, int)

    def _rng(self, key, step, phase="step"):
        """The noise source of ``key``'s draws at ``step``; ``phase`` separates the draws made
        when a stream opens from those of its first step."""
        if self._noise_key is not None:
            return self._key_source(key).for_identity(step, phase)
        if not self._per_step_seed():
            return self._noise
        # Python's hash() is salted per process: a test seed must give every key the
        # same noise on every worker and every run.
        entropy = [self._seed, stable_hash(key), step & (2**63 - 1)]
        return make_noise(np.random.default_rng(entropy if phase == "step" else entropy + [1]))

    def _key_source(self, key):
        """The keyed source of identity ``(transform, key)``, whose children name the draws of
        one step: kept for the most recent keys, so a key's label is encoded once, not at
        every step (a sharded release cycles through its shard's keys)."""
        sources = self._sources
        source = sources.get(key)
        if source is None:
            if len(sources) >= _SOURCE_CACHE:
                sources.clear()
            source = sources[key] = KeyedNoise(self._noise_key, (self._spec.transform, key_label(key)))
        return source

    def _end_micros(self, step):
        return int(round(self._spec.window_end(step) * 1e6)) / 1e6

    def _end_stamp(self, step):
        """``Timestamp.of(_end_micros(step))``, kept per step: every stream of a shard or
        worker releases the same steps."""
        stamps = self._stamps
        stamp = stamps.get(step)
        if stamp is None:
            if len(stamps) >= _STAMP_CACHE:
                stamps.clear()
            stamp = stamps[step] = Timestamp.of(self._end_micros(step))
        return stamp

    def _closed(self, nxt):
        return nxt is not None and (nxt >= CLOSED or (self._end is not None and nxt >= self._end))

    def _invalid(self, key, step, aggregate, reason, released_through=None):
        """The dead letter of an aggregate's events (``None`` if it holds none).

        A late aggregate records ``released_through``, the last step released
        when it arrived: it tells two late aggregates of one step apart (and
        so their ids) in all but the same firing."""
        n = self._spec.events(aggregate)
        if not n:
            return None
        element = {"key": key, "step": step, "aggregate": aggregate}
        if released_through is not None:
            element["released_through"] = released_through
        return pvalue.TaggedOutput(INVALID, InvalidElement.of(
            self._spec.transform, reason, element, self._spec.window_end(step), count=n))

    def _beyond_lateness(self, step, nxt):
        """How far (seconds) the released steps reach past the end of ``step``, when that is
        more than ``allowed_lateness``; else ``None``."""
        if self._allowed_lateness is None:
            return None
        behind = self._spec.window_end(nxt - 1) - self._spec.window_end(step)
        return behind if behind > self._allowed_lateness else None

    def process(self, element,
                buffer=beam.DoFn.StateParam(BUFFER),
                next_state=beam.DoFn.StateParam(NEXT),
                first_state=beam.DoFn.StateParam(FIRST),
                earliest_state=beam.DoFn.StateParam(EARLIEST),
                timer=beam.DoFn.TimerParam(TIMER)):
        yield from self._process(element, buffer, next_state, first_state, earliest_state, timer)

    def _process(self, element, buffer, next_state, first_state, earliest_state, timer):
        key, (step, aggregate) = element
        nxt = next_state.read()
        if isinstance(aggregate, StreamStart):
            self._start(step, nxt, next_state, first_state, timer)
            return
        if isinstance(aggregate, NotAdmitted):
            yield from self._not_admitted(key, nxt, buffer, next_state)
            return
        if self._closed(nxt):
            out = self._invalid(key, step, aggregate, self._closed_reason(first_state))
            if out is not None:
                yield out
            return
        if nxt is not None and step < nxt and nxt > first_state.read():
            # Late: its step was already released. (Before the first release,
            # earlier steps simply merge into the opening step.)
            step = yield from self._late_step(key, step, aggregate, nxt)
            if step is None:
                return
        buffer.add((step, aggregate))
        if nxt is None and self._opens == "data":
            self._hold_earliest(step, earliest_state, timer)

    def _start(self, step, nxt, next_state, first_state, timer):
        """Opens a stream that has not opened yet at ``step`` and sets its first timer."""
        if nxt is None:
            first_state.write(step)
            next_state.write(step)
            timer.set(self._end_micros(self._end - 1 if self._bounded else step))

    def _not_admitted(self, key, nxt, buffer, next_state):
        """Closes a stream that never opened; its buffered events go to ``invalid``."""
        if nxt is None:
            for s, agg in buffer.read():
                out = self._invalid(key, s, agg, NOT_ADMITTED)
                if out is not None:
                    yield out
            buffer.clear()
            next_state.write(CLOSED)

    def _closed_reason(self, first_state):
        """Why an aggregate of a closed stream is invalid."""
        if first_state.read() is None:
            return NOT_ADMITTED
        if self._end is not None:
            return f"late: the stream ended at step {self._end - 1}"
        return "the stream is closed"

    def _late_step(self, key, step, aggregate, nxt):
        """Yields the dead letter of a late aggregate that is dropped or beyond the allowed
        lateness and returns ``None``; else returns the step it is deferred into."""
        n = self._spec.events(aggregate)
        if self._late == "drop":
            self._late_dropped.inc(n)
            out = self._invalid(key, step, aggregate,
                                f"late: step {step} was already released", nxt - 1)
            if out is not None:
                yield out
            return None
        behind = self._beyond_lateness(step, nxt)
        if behind is not None:
            self._too_late.inc(n)
            out = self._invalid(
                key, step, aggregate,
                f"late beyond allowed_lateness ({self._allowed_lateness:g} s): step {step} "
                f"ended {behind:g} s before the end of the last released step {nxt - 1}",
                nxt - 1)
            if out is not None:
                yield out
            return None
        self._late_deferred.inc(n)
        return nxt

    def _hold_earliest(self, step, earliest_state, timer):
        """With ``opens="data"``: moves the timer of a stream not yet open to its earliest step."""
        earliest = earliest_state.read()
        if earliest is None or step < earliest:
            earliest_state.write(step)
            timer.set(self._end_micros(self._end - 1 if self._bounded else step))

    @on_timer(TIMER)
    def on_release(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
                   buffer=beam.DoFn.StateParam(BUFFER),
                   mech_state=beam.DoFn.StateParam(MECHANISM),
                   next_state=beam.DoFn.StateParam(NEXT),
                   first_state=beam.DoFn.StateParam(FIRST),
                   earliest_state=beam.DoFn.StateParam(EARLIEST),
                   timer=beam.DoFn.TimerParam(TIMER)):
        yield from self._fire(key, fire, buffer, mech_state, next_state, first_state,
                              earliest_state, timer)

    def _open(self, key, first, with_log):
        """The new mechanism of a stream opening at ``first``, and its ledger entries."""
        mechanism = self._spec.new_mechanism(self._rng(key, first, "open"), first=first, **with_log)
        entries = [pvalue.TaggedOutput(ACCOUNTING, beam.window.TimestampedValue(
            entry, self._end_micros(first))) for entry in self._spec.ledger(key)]
        return mechanism, entries

    def _fire(self, key, fire, buffer, mech_state, next_state, first_state, earliest_state,
              timer, log=None, final=False):
        """Releases the stream's due steps. ``final``: no later firing reads this stream's
        cells (the timer-free batch release fires each stream exactly once), so the
        mechanism's state is not serialised for one."""
        firing = yield from self._fire_start(key, fire, buffer, mech_state, next_state,
                                             first_state, earliest_state, timer, log)
        if firing is None:
            return
        mechanism, step, done = yield from self._release_steps(
            key, firing.nxt, firing.until, firing.pending, firing.mechanism, mech_state,
            firing.with_log)
        yield from self._fire_finish(firing, mechanism, step, done, final)

    def _fire_start(self, key, fire, buffer, mech_state, next_state, first_state,
                    earliest_state, timer, log=None):
        """A firing up to its first release: opens the stream if due (yielding its ledger
        entries) and returns its :class:`_Firing`, or ``None`` if it releases nothing."""
        spec = self._spec
        with_log = {} if log is None else {"log": log}
        nxt = next_state.read()
        pending = self._pending(buffer)
        if nxt is None:
            nxt = self._open_on_data(pending, first_state, earliest_state)
            if nxt is None:
                return None
        if self._closed(nxt):
            return None
        first = first_state.read()
        mechanism = None
        if nxt == first and mech_state.read() is None:
            mechanism, entries = self._open(key, first, with_log)
            yield from entries
        # Aggregates that waited for the stream to open belong to its first step.
        for step in [s for s in pending if s < nxt]:
            aggregate = pending.pop(step)
            pending[nxt] = spec.merge(pending[nxt], aggregate) if nxt in pending else aggregate
        return _Firing(key, nxt, self._until(fire, first), first, pending, mechanism, with_log,
                       log, (buffer, mech_state, next_state, timer))

    def _fire_finish(self, firing, mechanism, step, done, final):
        """A firing after its releases: stores the mechanism, then closes the stream or keeps
        what is left for the next firing."""
        buffer, mech_state, next_state, timer = firing.cells
        if mechanism is not None and not final:
            # A stream's to_state costs about as much as a tenth of its 72 steps.
            mech_state.write(mechanism.to_state())
        if firing.log is not None:
            firing.log.flush()
        horizon = self._spec.horizon
        last = firing.first + horizon - 1 if horizon is not None else None
        if done or (last is not None and step > last):
            yield from self._close(firing.key, done, firing.pending, buffer, next_state)
            return
        self._carry(step, firing.pending, buffer, next_state, timer)

    def _fire_together(self, firings, final=False):
        """Completes the started firings (:meth:`_fire_start`), stepping together the streams
        whose mechanisms the spec can step as one (:meth:`ReleaseSpec.lockstep`): streams
        that release the same steps. Each stream's records, ledger, invalid elements and
        state are those its own firing gives; only the order of the records across
        streams differs (step by step instead of stream by stream)."""
        groups = {}
        for firing in firings:
            groups.setdefault((firing.nxt, firing.until), []).append(firing)
        for (nxt, until), group in groups.items():
            results = None
            if len(group) > 1 and self._per_step_seed() and nxt <= until:
                results = yield from self._release_lockstep(group, nxt, until)
            if results is None:
                for firing in group:
                    # Finished one by one: a stream's restored mechanism is let go before
                    # the next is restored (holding them all made the collector's passes
                    # a fifth of a streaming shard's firing).
                    mechanism, step, done = yield from self._release_steps(
                        firing.key, nxt, until, firing.pending, firing.mechanism,
                        firing.cells[1], firing.with_log)
                    yield from self._fire_finish(firing, mechanism, step, done, final)
                continue
            for firing, (mechanism, step, done) in zip(group, results):
                yield from self._fire_finish(firing, mechanism, step, done, final)

    def _release_lockstep(self, group, nxt, until, lockstep=None):
        """:meth:`_release_steps` of every stream of ``group`` (all releasing steps
        ``nxt``..``until``, each from its own keyed source at each step), step by step
        across the streams; returns their ``(mechanism, next step, done)``, or ``None``
        (nothing released) when the spec cannot step their mechanisms together. Only
        streams opened by this firing qualify (the batch release's: each fires once);
        a stored stream is restored and steps on its own.

        ``lockstep``: the streams of ``group`` (in its order) already held as one
        (a streaming shard's stored arrays, :mod:`~dp_beam.transforms.shards`); their
        mechanisms are then ``None``, and the state stays in ``lockstep``."""
        spec = self._spec
        rng = self._rng
        mechanisms = [firing.mechanism for firing in group]
        if lockstep is None:
            if any(mechanism is None for mechanism in mechanisms):
                return None
            lockstep = spec.lockstep(mechanisms)
            if lockstep is None:
                return None
        keys = [firing.key for firing in group]
        pendings = [firing.pending for firing in group]
        used = [0] * len(group)
        empty = 0
        end_stamp, zero, events = self._end_stamp, spec.zero, spec.events
        for step in range(nxt, until + 1):
            aggregates = []
            for j, pending in enumerate(pendings):
                aggregate = pending.pop(step, None)
                if aggregate is None:
                    empty += 1
                    aggregate = zero()
                used[j] += events(aggregate)
                aggregates.append(aggregate)
            sources = [rng(key, step) for key in keys]
            stamp = end_stamp(step)
            for record in spec.release_lockstep(lockstep, keys, step, aggregates, sources):
                # As in _release_steps: tagged outputs as they are, records in the global window.
                if isinstance(record, pvalue.TaggedOutput):
                    yield record
                else:
                    yield global_element(record, stamp)
        lockstep.write_back()
        released = until - nxt + 1
        progress, window_end = self._progress, spec.window_end(until)
        for key, n in zip(keys, used):
            progress.released(key, until, window_end, n, released)
        self._released.inc(released * len(group))
        progress.report()
        if empty:
            self._empty.inc(empty)
        return [(mechanism, until + 1, False) for mechanism in mechanisms]

    def _pending(self, buffer):
        """The buffered aggregates merged per step."""
        spec = self._spec
        pending = {}
        for step, aggregate in buffer.read():
            pending[step] = spec.merge(pending[step], aggregate) if step in pending else aggregate
        return pending

    def _open_on_data(self, pending, first_state, earliest_state):
        """With ``opens="data"``: the step a stream with buffered data opens at (``None``: it
        stays unopened)."""
        if self._opens != "data" or not pending:
            return None
        nxt = min(pending)
        first_state.write(nxt)
        earliest_state.clear()
        return nxt

    def _until(self, fire, first):
        """The last step this firing may release."""
        spec = self._spec
        if self._bounded:
            until = self._end - 1
        else:
            # Steps whose end the watermark has passed: end(k) = (k+1)·step <= fire.
            until = int(np.floor(fire.micros / 1e6 / spec.step_seconds + 1e-9)) - 1
            if self._end is not None:
                until = min(until, self._end - 1)
        if spec.horizon is not None:
            until = min(until, first + spec.horizon - 1)
        return until

    def _release_steps(self, key, nxt, until, pending, mechanism, mech_state, with_log):
        """Yields the records of steps ``nxt``..``until`` (fewer once the spec is done); returns
        the mechanism, the next unreleased step and whether the spec is done."""
        spec = self._spec
        done = False
        step = nxt
        # Counted here and added once per firing: a metric update per step
        # costs more than the rest of the bookkeeping.
        released = empty = used = 0
        # Looked up once per firing, not per step (a sharded release steps many streams).
        per_step, progress, rng, end_stamp = (self._per_step_seed(), self._progress, self._rng,
                                              self._end_stamp)
        while step <= until and not done:
            if mechanism is None:
                mechanism = spec.restore(mech_state.read(), rng(key, step), **with_log)
            elif per_step:
                # Every step draws from its own keyed source (or test generator).
                mechanism = spec.reseed(mechanism, rng(key, step), **with_log)
            aggregate = pending.pop(step, None)
            if aggregate is None:
                empty += 1
                aggregate = spec.zero()
            released += 1
            used += spec.events(aggregate)
            # Stamped at the step's end, the moment of release and the timer's
            # watermark hold: one microsecond earlier and a downstream window
            # closing at that end would already be expired, and drop it.
            for record in spec.release(mechanism, key, step, aggregate):
                if isinstance(record, pvalue.TaggedOutput):
                    yield record
                else:
                    # The release runs in the global window (streams.release_in_order), so the
                    # record is placed there directly: the same element a TimestampedValue
                    # would give, without a WindowFn assignment per record.
                    yield global_element(record, end_stamp(step))
            done = spec.done(mechanism)
            step += 1
        if released:
            progress.released(key, step - 1, spec.window_end(step - 1), used, released)
            self._released.inc(released)
            progress.report()
        if empty:
            self._empty.inc(empty)
        return mechanism, step, done

    def _close(self, key, done, pending, buffer, next_state):
        """Nothing more will be released: closes the stream; what is left goes to ``invalid``."""
        next_state.write(CLOSED)
        buffer.clear()
        for s, aggregate in sorted(pending.items()):
            out = self._invalid(key, s, aggregate,
                                "the stream is closed" if done else
                                f"step {s} is beyond the horizon of {self._spec.horizon} steps")
            if out is not None:
                yield out

    def _carry(self, step, pending, buffer, next_state, timer):
        """Keeps the unreleased aggregates for the next firing at ``step`` and sets its timer."""
        next_state.write(step)
        buffer.clear()
        for s, aggregate in pending.items():
            buffer.add((s, aggregate))
        if not self._bounded and not self._closed(step):
            timer.set(self._end_micros(step))


@beam.typehints.with_output_types(Any)
class LoggedReleaseDoFn(OrderedReleaseDoFn):
    """:class:`OrderedReleaseDoFn` plus a per-key append-only log, for specs with ``uses_log``.

    The mechanism's ``to_state()`` (its small state) is rewritten at every
    firing as in the base class; what it keeps for later trainings goes to a
    :class:`BagLog` over the ``log`` BagState, appended once and read back only
    in the firings that need it. A separate class so that specs without a log
    run the base DoFn with exactly its state cells.
    """

    # Beam attaches a timer's callback to its spec: this class needs its own.
    TIMER = TimerSpec("release", TimeDomain.WATERMARK)
    BUFFER = OrderedReleaseDoFn.BUFFER
    MECHANISM = OrderedReleaseDoFn.MECHANISM
    NEXT = OrderedReleaseDoFn.NEXT
    FIRST = OrderedReleaseDoFn.FIRST
    EARLIEST = OrderedReleaseDoFn.EARLIEST
    LOG = BagStateSpec("log", PickleCoder())
    LOG_META = ReadModifyWriteStateSpec("log_meta", PickleCoder())

    def __init__(self, spec: ReleaseSpec, bounded: bool, late: str = "defer",
                 seed: Union[None, int, NoiseSource] = None, end_step: Optional[int] = None,
                 opens: str = "start", noise_key: Optional[NoiseKey] = None,
                 allowed_lateness: Optional[float] = None) -> None:
        super().__init__(spec, bounded, late, seed, end_step, opens, noise_key, allowed_lateness)
        self._log_reads = Metrics.counter(NAMESPACE, f"{spec.transform}.log_entries_read")
        self._log_compactions = Metrics.counter(NAMESPACE, f"{spec.transform}.log_compactions")

    def process(self, element,
                buffer=beam.DoFn.StateParam(BUFFER),
                next_state=beam.DoFn.StateParam(NEXT),
                first_state=beam.DoFn.StateParam(FIRST),
                earliest_state=beam.DoFn.StateParam(EARLIEST),
                timer=beam.DoFn.TimerParam(TIMER)):
        yield from self._process(element, buffer, next_state, first_state, earliest_state, timer)

    @on_timer(TIMER)
    def on_release(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
                   buffer=beam.DoFn.StateParam(BUFFER),
                   mech_state=beam.DoFn.StateParam(MECHANISM),
                   next_state=beam.DoFn.StateParam(NEXT),
                   first_state=beam.DoFn.StateParam(FIRST),
                   earliest_state=beam.DoFn.StateParam(EARLIEST),
                   timer=beam.DoFn.TimerParam(TIMER),
                   log_bag=beam.DoFn.StateParam(LOG),
                   log_meta=beam.DoFn.StateParam(LOG_META)):
        yield from self._fire(key, fire, buffer, mech_state, next_state, first_state,
                              earliest_state, timer, log=self.stream_log(log_bag, log_meta))

    def stream_log(self, bag: Any, meta: Any) -> BagLog:
        """A firing's :class:`BagLog` over the ``log`` and ``log_meta`` cells (or stand-ins of
        them, as the timer-free shard release passes), counting into this DoFn's metrics."""
        return BagLog(bag, meta, self._log_reads, self._log_compactions)
