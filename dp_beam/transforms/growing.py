"""``GrowingSynthetic`` and ``GrowingQueries``: differential privacy for growing databases as Beam transforms.

``docs/privacy/growing.md`` (seed 000, Cummings et al.; neighbours G-1); the
mapping to a streaming engine is ``docs/design.md`` D2. The database is the
multiset of records seen so far, each mapped to a cell of a public universe of
N cells by ``universe_fn``; it grows as records arrive, and its size t is the
paper's clock.

Shape (docs/design.md D2): validate every record (→ ``(key, cell)``) and
every query (→ ``(key, vector)``) in parallel → one per-step combine in
event-time fixed windows that holds the step's cell counts and its queries →
the ordered release DoFn (:class:`~dp_beam.transforms.release.OrderedReleaseDoFn`),
one stream per declared key, which feeds each step to the engine-free
mechanism of :mod:`dp_beam.mechanisms.growing`. Within a step the records
arrive first (one batched update: the closed-form PMWG mix, or one
black-box run), then the step's queries in event-time order, ties broken
by query id (G-1). The step is the time resolution: a query is answered on
the database at the end of its step.

Neighbours and what is public. The guarantee is the paper's (G-1): two
inputs are neighbours when they differ in the *cell* of one record, that
record keeping its event time and key. So the number of records per step
(the database size at every time) is public, as are the queries (chosen by
the analyst); the ledger says so (``relation="replace"``), and
:class:`~dp_beam.transforms.accounting.CombineAccounting` composes it with
the other transforms under the replace relation (add/remove charges count
twice there; a replace charge says nothing about add/remove). What releases
exist is decided by public data only: ``GrowingSynthetic`` releases at the
runs its schedule triggers (a function of the sizes), ``GrowingQueries``
answers every query, and both open one stream per declared key at ``start``.
``.invalid``, Beam state and metrics hold exact data and are not releases.
Records whose ``universe_fn`` fails are rejected before the database sees
them: the neighbour relation is stated for the valid, mapped records.

The threshold-noise secret Z of PMWG lives in the release DoFn's state, like
the exact counts; it is never part of a release, a ledger entry or a log line.
"""

import datetime
import hashlib
import numbers
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type, Union

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import FixedWindows, GlobalWindows

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.checks import check_int
from dp_beam.mechanisms.growing import (BBImprover, BBScheduler, BlackBox, PMWG, PMWGParams,
                                        as_query)
from dp_beam.mechanisms.noise import NoiseSource
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import LedgerEntry
from dp_beam.records_growing import (HISTOGRAM, HistogramRelease, QueryAnswer, SyntheticRelease,
                                     answer_linear_query)
from dp_beam.transforms.event_ids import id_key
from dp_beam.transforms.events import (INVALID, TRANSIENT_ERRORS, UNBOUNDED_LATENESS,
                                       ValidatingDoFn, check_callable, check_transient_errors)
from dp_beam.transforms.release_spec import ReleaseSpec
from dp_beam.transforms.steps import StepOf, in_global_window
from dp_beam.transforms.stream_keys import KV, StreamKey
from dp_beam.transforms.streams import (private_keys, release_streams, set_release_options,
                                        validation)

__all__ = ["GrowingSynthetic", "GrowingQueries", "answer_linear_query", "HISTOGRAM", "NEIGHBOURS"]

NEIGHBOURS = ("replace one record's cell (its event time and key are public: the database size "
              "at every time is public, time = size)")

_RECORD, _QUERY = 0, 1


@beam.typehints.with_output_types(KV)
class _PrepareRecords(ValidatingDoFn):
    """A record → ``(key, (RECORD, cell))`` at its event time; bad records → ``invalid``."""

    def __init__(self, transform, universe_fn, universe_size, key_fn, timestamp_fn, schedule,
                 keys, transient_errors):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._universe_fn, self._n_cells = universe_fn, universe_size

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        ts, key, err = self._time_and_key(element, micros, declared)
        if not err:
            cell, err = self._call("universe_fn", self._universe_fn, element)
        if not err and (isinstance(cell, (bool, np.bool_)) or not isinstance(cell, numbers.Integral)
                        or not 0 <= int(cell) < self._n_cells):
            err = f"universe_fn returned {cell!r:.60}, not a cell index in [0, {self._n_cells})"
        if err:
            yield self._reject(element, err, micros)
            return
        yield beam.window.TimestampedValue((key, (_RECORD, int(cell))), ts)


@beam.typehints.with_output_types(KV)
class _PrepareQueries(ValidatingDoFn):
    """A query element → ``(key, (QUERY, (ts, order, id, vector | HISTOGRAM)))``; bad ones →
    ``invalid``. Queries are public, so their content may order them."""

    def __init__(self, transform, query_fn, query_id_fn, universe_size, key_fn, timestamp_fn,
                 schedule, keys, transient_errors, histograms):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._query_fn, self._id_fn = query_fn, query_id_fn
        self._n_cells, self._histograms = universe_size, histograms

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        ts, key, err = self._time_and_key(element, micros, declared)
        if not err:
            raw, err = (element, None) if self._query_fn is None else self._call(
                "query_fn", self._query_fn, element)
        if not err:
            if isinstance(raw, str) and raw == HISTOGRAM:
                if not self._histograms:
                    err = "histogram requests are answered by GrowingQueries only"
                query = HISTOGRAM
            else:
                try:
                    query = as_query(raw, self._n_cells)
                except self._transient:
                    raise
                except Exception as e:  # a bad query is a data error of that element
                    err = f"query: {e}"
        qid = None
        if not err and self._id_fn is not None:
            qid, err = self._call("query_id_fn", self._id_fn, element)
            if not err:
                order, err = id_key(qid)
        if err:
            yield self._reject(element, err, micros)
            return
        if self._id_fn is None:
            content = b"histogram" if isinstance(query, str) else query.tobytes()
            qid = hashlib.blake2b(repr(ts).encode() + content, digest_size=8).hexdigest()
            order = (2, qid)
        yield beam.window.TimestampedValue((key, (_QUERY, (ts, order, qid, query))), ts)


def _empty_step():
    """The input of a step without records or queries: ``({cell: count}, records, [queries])``."""
    return ({}, 0, [])


def _add_counts(total, counts):
    """Adds the cell counts ``counts`` into the dict ``total`` (in place) and returns it."""
    for cell, v in counts.items():
        total[cell] = total.get(cell, 0) + v
    return total


def _in_order(queries):
    """A step's queries in their public order: event time, then id order."""
    return sorted(queries, key=lambda q: (q[0], q[1]))


class _StepInput(beam.CombineFn):
    """One step's input: ``({cell: count}, records, [queries])``."""

    def create_accumulator(self):
        return _empty_step()

    def add_input(self, acc, item):
        kind, payload = item
        if kind == _RECORD:
            acc[0][payload] = acc[0].get(payload, 0) + 1
            return (acc[0], acc[1] + 1, acc[2])
        acc[2].append(payload)
        return acc

    def merge_accumulators(self, accs):
        counts, n, queries = _empty_step()
        for c, k, q in accs:
            _add_counts(counts, c)
            n += k
            queries.extend(q)
        return (counts, n, queries)

    def extract_output(self, acc):
        return acc


class _GrowingSpec(ReleaseSpec):
    """Feeds each step (records first, then queries in order) to a growing-database mechanism."""

    def __init__(self, transform, step_seconds, ledger_template, alpha, mechanism):
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = None
        self._ledger = ledger_template
        self._alpha = alpha
        self._name = mechanism

    def zero(self):
        return _empty_step()

    def merge(self, a, b):
        return (_add_counts(dict(a[0]), b[0]), a[1] + b[1], list(a[2]) + list(b[2]))

    def events(self, aggregate):
        return int(aggregate[1]) + len(aggregate[2])

    def ledger(self, key):
        return [self._ledger._replace(key=key)]

    def _where(self, key, step, t):
        return dict(key=key, step=step, window_start=step * self.step_seconds,
                    window_end=(step + 1) * self.step_seconds, t=t)

    def _answer(self, where, query, kind, value, noise_std=0.0, hard=0, cap=0, within=True,
                alpha=None):
        ts, _, qid, _ = query
        return QueryAnswer(**where, query_id=qid, query_time=ts, kind=kind, value=value,
                           noise_std=noise_std, hard=hard, cap=cap, within_budget=within,
                           alpha=self._alpha if alpha is None else alpha, mechanism=self._name,
                           transform=self.transform)


class _SyntheticSpec(_GrowingSpec):
    def __init__(self, transform, step_seconds, ledger_template, box, scheduler, args):
        name = f"{'bbscheduler' if scheduler == 'epochs' else 'bbimprover'}({box.name})"
        super().__init__(transform, step_seconds, ledger_template, None, name)
        self._box, self._cls, self._args = box, (BBScheduler if scheduler == "epochs" else BBImprover), args

    def new_mechanism(self, rng, first=None):
        return self._cls(self._box, rng=rng, **self._args)

    def restore(self, state, rng):
        return self._cls.from_state(state, self._box, rng=rng)

    def release(self, mechanism, key, step, aggregate):
        counts, n, queries = aggregate
        if n:
            run = mechanism.extend(counts)
            if run is not None:
                out = run.output
                yield SyntheticRelease(
                    **self._where(key, step, run.t), run=run.index, epoch=run.epoch,
                    epsilon=run.epsilon, beta=run.beta, alpha=run.alpha, pooled=run.pooled,
                    kind=self._box.output_kind,
                    output=tuple(float(v) for v in np.asarray(out, dtype=np.float64)),
                    mechanism=self._name, transform=self.transform)
        where = self._where(key, step, mechanism.t)
        for query in _in_order(queries):
            latest = mechanism.latest
            if latest is None:
                yield self._answer(where, query, "refused", None)
            else:
                yield self._answer(where, query, "synthetic", mechanism.answer(query[3]),
                                   alpha=latest.alpha)


class _QueriesSpec(_GrowingSpec):
    def __init__(self, transform, step_seconds, ledger_template, params, options):
        super().__init__(transform, step_seconds, ledger_template, params.alpha, "pmwg")
        self._params, self._options = params, options

    def new_mechanism(self, rng, first=None):
        return PMWG(self._params, rng=rng, **self._options)

    def restore(self, state, rng):
        return PMWG.from_state(state, rng=rng)

    def release(self, mechanism, key, step, aggregate):
        counts, n, queries = aggregate
        if n:
            mechanism.extend(counts)
        for query in _in_order(queries):
            where = self._where(key, step, mechanism.t)
            if isinstance(query[3], str):
                yield HistogramRelease(**where, query_id=query[2],
                                       weights=tuple(float(v) for v in mechanism.histogram),
                                       mechanism=self._name, transform=self.transform)
                continue
            a = mechanism.query(query[3])
            yield self._answer(where, query, a.kind, a.value, a.noise_std, a.hard, a.cap,
                               a.within_budget)


#: The options every growing transform takes and hands to :class:`_GrowingTransform`.
_COMMON_OPTIONS = ("start", "end", "key_fn", "keys", "timestamp_fn", "queries", "query_fn",
                   "query_id_fn", "query_timestamp_fn", "query_key_fn", "allowed_lateness", "late",
                   "rng", "noise_key", "transient_errors", "label")


def _common_options(arguments: dict) -> dict:
    """The common options out of a transform constructor's ``locals()``."""
    return {name: arguments[name] for name in _COMMON_OPTIONS}


class _GrowingTransform(beam.PTransform):
    """Common construction: the options of every continual transform, two inputs, the plan."""

    def __init__(self, universe_fn, universe_size, step, *, start, end, key_fn, keys,
                 timestamp_fn, queries, query_fn, query_id_fn, query_timestamp_fn, query_key_fn,
                 allowed_lateness, late, rng, noise_key, transient_errors, label):
        super().__init__(label)
        self._universe_fn = check_callable("universe_fn", universe_fn, required=True)
        self._n_cells = check_int("universe_size", universe_size, 2)
        set_release_options(self, step, allowed_lateness, late, rng, start=start, end=end,
                            key_fn=key_fn, keys=keys, noise_key=noise_key)
        if private_keys(self) is not None:
            raise ValueError("keys=PrivateKeys(...) is not available for growing databases: their "
                             "neighbours replace one record's cell (sizes public), while private "
                             "key selection is stated for adding or removing a unit; declare the "
                             "keys (keys=[...])")
        self._key_fn = check_callable("key_fn", key_fn)
        self._timestamp_fn = check_callable("timestamp_fn", timestamp_fn)
        self._query_fn = check_callable("query_fn", query_fn)
        self._query_id_fn = check_callable("query_id_fn", query_id_fn)
        self._query_timestamp_fn = check_callable("query_timestamp_fn", query_timestamp_fn)
        self._query_key_fn = check_callable("query_key_fn", query_key_fn)
        if (key_fn is None) != (query_key_fn is None):
            raise ValueError("query_key_fn is required with key_fn (and only then): every query "
                             "is answered on the database of its key")
        if queries is not None and not isinstance(queries, beam.PCollection):
            raise ValueError(f"queries must be a PCollection, got {type(queries).__name__}")
        self._queries = queries
        self._transient = check_transient_errors(transient_errors)

    def _inputs(self, inputs):
        if isinstance(inputs, dict):
            unknown = set(inputs) - {"records", "queries"}
            if unknown or "records" not in inputs:
                raise ValueError("the input dict must have 'records' (and optionally 'queries'), "
                                 f"got {sorted(inputs)}")
            records, queries = inputs["records"], inputs.get("queries")
        elif isinstance(inputs, (tuple, list)):
            if len(inputs) != 2:
                raise ValueError("the input must be records, or (records, queries)")
            records, queries = inputs
        else:
            records, queries = inputs, None
        if queries is not None and self._queries is not None:
            raise ValueError("queries were given twice: as an input and as queries=")
        return records, queries if queries is not None else self._queries

    def _plan_entry(self, label, cost, mechanism, noise) -> LedgerEntry:
        return LedgerEntry(
            transform=label, unit="event", neighbours=NEIGHBOURS,
            epsilon=float(cost["epsilon"]), delta=float(cost["delta"]), rho=float(cost["rho"]),
            mechanism=mechanism, scope="key" if self._key_fn is not None else "stream", key=None,
            sensitivity=1.0, noise=noise, calibration="", relation="replace")

    def _expand(self, inputs, spec, entry, histograms):
        label = self.label
        records, queries = self._inputs(inputs)
        # The schedule decides the steps, not the input's windows (design D2.1).
        records = in_global_window(records, "RecordWindow")
        if queries is not None:
            queries = in_global_window(queries, "QueryWindow")
        schedule, declared, side = validation(self)
        prepared = records | "Validate" >> beam.ParDo(_PrepareRecords(
            label, self._universe_fn, self._n_cells, self._key_fn, self._timestamp_fn, schedule,
            declared, self._transient), **side).with_outputs(INVALID, main="valid")
        invalids, parts = [prepared[INVALID]], [prepared.valid]
        if queries is not None:
            asked = queries | "ValidateQueries" >> beam.ParDo(_PrepareQueries(
                label, self._query_fn, self._query_id_fn, self._n_cells, self._query_key_fn,
                self._query_timestamp_fn, schedule, declared, self._transient, histograms),
                **side).with_outputs(INVALID, main="valid")
            invalids.append(asked[INVALID])
            parts.append(asked.valid)
        merged = tuple(parts) | "Merge" >> beam.Flatten().with_output_types(KV)
        # Unbounded lateness: the release applies `late` and `allowed_lateness`.
        aggregates = (merged
                      | "StepWindows" >> beam.WindowInto(
                          FixedWindows(self._step), allowed_lateness=UNBOUNDED_LATENESS)
                      | "PerStep" >> beam.CombinePerKey(_StepInput())
                      | "StepIndex" >> beam.ParDo(StepOf(self._step_micros))
                      .with_output_types(Tuple[StreamKey, Tuple[int, Any]])
                      | "Rewindow" >> beam.WindowInto(GlobalWindows()))
        return release_streams(self, merged, aggregates, spec, entry, invalids)


_COMMON_DOC = """
      step: event-time step (seconds or ``timedelta``): the time resolution at which records
        and queries are merged (records of a step first, then its queries).
      start, end: the public schedule, as ``ContinualCount`` (``end`` required for bounded
        input); records and queries outside it go to ``.invalid``.
      key_fn, keys: optional: one growing database per declared key (``keys=[...]``), each
        record feeding one; queries then need ``query_key_fn``. Private key selection is not
        offered (it is stated for add/remove neighbours).
      timestamp_fn: record → event time in epoch seconds (default: the Beam timestamp).
      queries: optional PCollection of queries (or pass ``(records, queries)`` as the input).
      query_fn: query element → a vector in [0, 1]^N, a predicate on cell indices
        (``lambda i: ...``, evaluated when the query is validated){histogram}; default: the
        element itself. Anything else goes to ``.invalid``.
      query_id_fn: query element → a public id (int, finite float, str, bytes or tuples of
        these) echoed in the answer and ordering queries with the same event time; default
        a hash of the query's time and content.
      query_timestamp_fn, query_key_fn: as ``timestamp_fn`` and ``key_fn``, for queries.
      allowed_lateness, late: as ``ContinualCount``: a late record or query joins the next
        unreleased step.
      rng: ``None`` (production noise from ``noise_key``); tests only: an int seed or a
        ``NoiseSource``.
      noise_key: the secret key of every noise draw (transform label, key, step), as
        ``ContinualCount``: a retried step releases the same values.
      transient_errors, label: as ``ContinualCount``.
"""


class GrowingSynthetic(_GrowingTransform):
    __doc__ = """A synthetic database (or model) of a growing database, re-released as it grows.

    BBScheduler (``scheduler="epochs"``, growing.md G-3, G-4) or BBImprover
    (``scheduler="every_step"``, G-5; needs ``delta`` in (0, 1/e)) around an
    ε-DP ``black_box`` from :mod:`dp_beam.mechanisms.growing`
    (``MWEMHistogram``, ``SmallDB``, ``LaplaceHistogram``, ``ERMBox`` for
    ERMG, or your own ``BlackBox``). Releases a
    :class:`~dp_beam.records_growing.SyntheticRelease` at every run the
    schedule triggers; a run due inside a step is made once at the end of the
    step on the database then, with the budget of the runs it replaces
    (the sizes are public, so which runs happen is public). Any linear query is
    answered from the latest release for free: pass ``queries`` (answers are
    ``QueryAnswer`` records of kind ``"synthetic"``) or call
    ``release.answer(f)`` / ``dpb.answer_linear_query``.

    Cost, for the whole unbounded stream, per key: ε-DP (pure BBScheduler) or
    (ε, δ)-DP with ρ*(ε, δ)-zCDP, for neighbours that replace one record's cell.

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms.growing import LaplaceHistogram
    >>> test_seed = 0   # tests only; production leaves rng=None
    >>> records = [{"ts": float(i), "cell": i % 3} for i in range(60)]
    >>> synth = dpb.GrowingSynthetic(lambda r: r["cell"], 3, black_box=LaplaceHistogram(3),
    ...                              epsilon=1.0, n=10, gamma=1.0, step=10, start=0, end=60,
    ...                              timestamp_fn=lambda r: r["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(records) | synth
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.t, r.epoch, round(r.epsilon, 3)))
    0 10 0 0.293
    1 20 1 0.207
    3 40 2 0.146

    Args:
      universe_fn: record → its cell, an int in [0, ``universe_size``).
      universe_size: N, the number of cells (public).
      black_box: a :class:`~dp_beam.mechanisms.growing.BlackBox` over N cells.
      scheduler: ``"epochs"`` (BBScheduler) or ``"every_step"`` (BBImprover).
      epsilon, delta: the privacy of the whole unbounded run (``delta=0``: pure, epochs only).
      n: the database size at which the first run happens (the paper's starting size).
      beta: failure probability of the accuracy guarantee.
      gamma, schedule: BBScheduler's epoch growth (default the γ of growing.md G-4) and ε_i
        schedule (``"sqrt"`` or ``"alt_a"``).
      eta, normaliser: BBImprover's η ∈ (0, 1] and Z (``"bound"`` or ``"zeta"``).
""" + _COMMON_DOC.format(histogram="")

    def __init__(self, universe_fn: Callable[[Any], int], universe_size: int, *,
                 black_box: BlackBox, epsilon: float, step: Union[float, datetime.timedelta],
                 n: int, start: Any = None, scheduler: str = "epochs", delta: float = 0.0,
                 beta: float = 0.05, gamma: Optional[float] = None, schedule: str = "sqrt",
                 eta: float = 0.1, normaliser: str = "bound", end: Any = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 queries: Optional[beam.PCollection] = None,
                 query_fn: Optional[Callable[[Any], Any]] = None,
                 query_id_fn: Optional[Callable[[Any], Any]] = None,
                 query_timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 query_key_fn: Optional[Callable[[Any], Any]] = None,
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 label: Optional[str] = None) -> None:
        super().__init__(universe_fn, universe_size, step, **_common_options(locals()))
        if not isinstance(black_box, BlackBox):
            raise ValueError(f"black_box must be a dp_beam.mechanisms.growing.BlackBox, got "
                             f"{type(black_box).__name__}")
        if black_box.universe_size != self._n_cells:
            raise ValueError(f"black_box works on {black_box.universe_size} cells, but "
                             f"universe_size is {self._n_cells}")
        if scheduler == "epochs":
            args = dict(epsilon=epsilon, n=n, delta=delta, beta=beta, gamma=gamma,
                        schedule=schedule)
        elif scheduler == "every_step":
            args = dict(epsilon=epsilon, delta=delta, n=n, beta=beta, eta=eta,
                        normaliser=normaliser)
        else:
            raise ValueError(f"scheduler must be 'epochs' or 'every_step', got {scheduler!r}")
        self._box, self._scheduler, self._args = black_box, scheduler, args
        cls = BBScheduler if scheduler == "epochs" else BBImprover
        self._probe = cls(black_box, rng=ZeroNoise(), **args)   # validates every parameter

    @property
    def params(self):
        """The public schedule (``BBSchedulerParams`` or ``BBImproverParams``)."""
        return self._probe.params

    def plan_entry(self, label) -> LedgerEntry:
        name = f"{self._probe.name}({self._box.name})"
        return self._plan_entry(label, self._probe.privacy_cost(), name, self._box.name)

    def expand(self, inputs):
        if self._inputs(inputs)[1] is not None and self._box.output_kind != "histogram":
            raise ValueError(f"queries: black_box {self._box.name!r} releases a "
                             f"{self._box.output_kind}, which does not answer linear queries")
        entry = self.plan_entry(self.label)
        spec = _SyntheticSpec(self.label, self._step, entry, self._box, self._scheduler,
                              self._args)
        return self._expand(inputs, spec, entry, histograms=False)


class GrowingQueries(_GrowingTransform):
    __doc__ = """PMWG (growing.md G-8): answers a stream of linear queries on a growing database.

    Two inputs: the records and the queries (``(records, queries) |
    dpb.GrowingQueries(...)``, or ``queries=``). Every query gets a
    :class:`~dp_beam.records_growing.QueryAnswer`: ``easy`` (f(y) from the
    public histogram, exact), ``hard`` (f(x_t) plus Laplace noise; the
    histogram then makes a multiplicative-weights step), ``abort`` (the
    hard-query cap was exceeded: permanent, G-8) or ``refused`` (the database
    has fewer than ``n`` records, or the query is over the budget with
    ``enforce_budget``). A query element for which ``query_fn`` returns
    ``dpb.HISTOGRAM`` releases the public histogram (``HistogramRelease``).
    Every constant of :class:`~dp_beam.mechanisms.growing.PMWGParams` can be
    set (``pmwg_options``); ξ_n is recomputed from them, so the cost below
    holds for every setting (G-8).

    Cost, for the whole unbounded stream of records and queries, per key:
    ε-DP (``delta=0``) or (ε, δ)-DP with ρ*(ε, δ)-zCDP, for neighbours that
    replace one record's cell.

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms import ZeroNoise   # noise off: for the example only
    >>> records = [{"ts": float(i % 30), "cell": int(i % 7 == 0)} for i in range(3000)]
    >>> queries = [{"ts": 11.0 + i / 4, "f": [1, 0]} for i in range(30)]   # f(x) = 6/7 each time
    >>> queries.append({"ts": 26.0, "f": "histogram"})
    >>> pmwg = dpb.GrowingQueries(lambda r: r["cell"], 2, alpha=0.2, epsilon=1.0, n=1000, step=10,
    ...                           start=0, end=30, timestamp_fn=lambda r: r["ts"],
    ...                           query_fn=lambda q: q["f"], query_timestamp_fn=lambda q: q["ts"],
    ...                           rng=ZeroNoise())
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = (p | "records" >> beam.Create(records), p | "queries" >> beam.Create(queries)) | pmwg
    ...     _ = (out.releases | beam.Map(lambda a: (a.t, getattr(a, "kind", "histogram")))
    ...          | beam.combiners.Count.PerElement() | beam.combiners.ToList()
    ...          | beam.Map(lambda kinds: print(sorted(kinds))))
    [((2000, 'easy'), 12), ((2000, 'hard'), 18), ((3000, 'histogram'), 1)]

    Args:
      universe_fn: record → its cell, an int in [0, ``universe_size``).
      universe_size: N, the number of cells (public).
      alpha: the accuracy target α ∈ (0, 1] (sets T, α', η and the cap, G-8).
      epsilon, delta: the privacy of the whole unbounded run (``delta=0``: pure ε-DP).
      n: the database size from which queries are answered (before it: ``refused``).
      K, beta: the query budget base and failure probability (accuracy only, G-9).
      enforce_budget: refuse queries beyond Budget(t) (free: the counts are public).
      clip: clip hard answers to [0, 1] (post-processing).
      pmwg_options: other :class:`~dp_beam.mechanisms.growing.PMWGParams` fields (``c``,
        ``threshold_frac``, ``accuracy_frac``, ``eta_frac``, the noise multipliers,
        ``cap_b``, ``xi_n``, ``update``). The default is the paper's constants (growing.md G-8), the ones
        Theorem 14's accuracy and the no-ABORT guarantee of Corollary 16 are proved for;
        smaller caps are far more accurate at realistic sizes but abort permanently when
        the data need more hard queries than the cap allows (docs/growing_databases.md).
""" + _COMMON_DOC.format(histogram=", or ``dpb.HISTOGRAM`` to release the histogram")

    def __init__(self, universe_fn: Callable[[Any], int], universe_size: int, alpha: float,
                 epsilon: float, delta: float = 0.0, n: Optional[int] = None, *,
                 step: Union[float, datetime.timedelta], start: Any = None, end: Any = None,
                 K: float = 1.0, beta: float = 0.05, enforce_budget: bool = False,
                 clip: bool = False, pmwg_options: Optional[Dict[str, Any]] = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 queries: Optional[beam.PCollection] = None,
                 query_fn: Optional[Callable[[Any], Any]] = None,
                 query_id_fn: Optional[Callable[[Any], Any]] = None,
                 query_timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 query_key_fn: Optional[Callable[[Any], Any]] = None,
                 allowed_lateness: Optional[Union[float, datetime.timedelta]] = datetime.timedelta(days=1),
                 late: str = "defer", rng: Union[None, int, NoiseSource] = None,
                 noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 label: Optional[str] = None) -> None:
        super().__init__(universe_fn, universe_size, step, **_common_options(locals()))
        if n is None:
            raise ValueError("n is required: the database size from which queries are answered")
        options = dict(pmwg_options or {})
        reserved = {"epsilon", "alpha", "n", "universe_size", "delta", "beta", "K"} & set(options)
        if reserved:
            raise ValueError(f"pmwg_options must not repeat {sorted(reserved)}: pass them directly")
        self._params = PMWGParams(epsilon=epsilon, alpha=alpha, n=n, universe_size=self._n_cells,
                                  delta=delta, beta=beta, K=K, **options)
        self._options = dict(enforce_budget=enforce_budget, clip=clip)
        PMWG(self._params, **self._options)                 # validates the options (ValueError)

    @property
    def params(self) -> PMWGParams:
        """Every public constant (T, α', η, b, ξ_n, λ, …) of the mechanism."""
        return self._params

    def plan_entry(self, label) -> LedgerEntry:
        return self._plan_entry(label, self._params.privacy_cost(), "pmwg", "laplace")

    def expand(self, inputs):
        entry = self.plan_entry(self.label)
        spec = _QueriesSpec(self.label, self._step, entry, self._params, self._options)
        return self._expand(inputs, spec, entry, histograms=True)
