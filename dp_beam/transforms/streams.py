"""What every continual transform shares: its release options and the tail of its pipeline.

The options (``step``, ``start``, ``end``, ``horizon``, ``key_fn``/``keys``,
``allowed_lateness``, ``late``, ``rng``) are validated eagerly by
:func:`set_release_options`; :func:`validation` gives the per-event stage what
it needs to reject events outside the schedule or of undeclared keys; and
:func:`release_streams` opens one stream per public key (or per privately
admitted key) and runs the ordered release (``docs/design.md`` D1.3, D2):
:func:`release_in_order` assembles it from the DoFns of
:mod:`~dp_beam.transforms.release` and :mod:`~dp_beam.transforms.shards`.
"""

import datetime
import math
import numbers
from typing import Any, Callable, Dict, FrozenSet, Iterable, Optional, Tuple, Union

import apache_beam as beam

from dp_beam.mechanisms import NoiseSource
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.transforms.keys import PrivateKeys, select_keys
from dp_beam.records import LedgerEntry
from dp_beam.transforms.events import INVALID
from dp_beam.transforms.release import LoggedReleaseDoFn, OrderedReleaseDoFn
from dp_beam.transforms.release_spec import (ACCOUNTING, PLAN_ATTRIBUTE, ContinualResult,
                                             ReleaseSpec)
from dp_beam.transforms.schedule import (DeclaredKeys, Schedule, StreamStart, resolve_keys,
                                         resolve_schedule)
from dp_beam.transforms.shards import (RELEASED_SHARDS, AbsentShardReleaseDoFn, BatchShardReleaseDoFn,
                                      ShardedReleaseDoFn, default_shards)
from dp_beam.transforms.stream_keys import KV, shard_of

__all__ = ["seconds", "check_horizon", "set_release_options", "private_keys", "validation", "raw_steps",
           "release_shards", "release_streams", "release_in_order"]


def seconds(name: str, value: Union[float, datetime.timedelta], allow_zero: bool = False) -> float:
    """A length of time given as seconds or ``timedelta``, validated."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of seconds or a timedelta, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")
    return float(value)


def check_horizon(horizon: Optional[int]) -> Optional[int]:
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int)
                                or horizon < 1):
        raise ValueError(f"horizon must be an int >= 1 or None, got {horizon!r}")
    return horizon


def set_release_options(transform: beam.PTransform, step: Union[float, datetime.timedelta],
                        allowed_lateness: Union[float, datetime.timedelta], late: str,
                        rng: Union[None, int, NoiseSource], *, start: Any, end: Any = None,
                        horizon: Optional[int] = None,
                        key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                        noise_key: Optional[NoiseKey] = None,
                        shards: Optional[int] = None) -> None:
    """Validates the options every continual transform takes; ``ValueError`` names the parameter.

    Sets ``_step`` (seconds), ``_step_micros``, ``_schedule``, ``_keys``
    (``None``, a :class:`DeclaredKeys` or a :class:`PrivateKeys`),
    ``_allowed_lateness``, ``_late``, ``_seed``, ``_noise_key`` and ``_shards`` on
    ``transform``. ``shards``: ``None`` picks
    :func:`~dp_beam.transforms.shards.default_shards` of the declared key
    count when the input is known (:func:`release_shards`); 0 releases one
    stateful key per stream; n > 0 routes the streams to n shards, each
    released by one stateful DoFn with one timer, or on bounded input by one
    pass without state (same records). ``noise_key=None`` draws a fresh secret key now, at
    construction: each construction of a pipeline is a new release, and the
    retries within it are replay-stable.
    """
    transform._step = seconds("step", step)
    transform._step_micros = int(round(transform._step * 1e6))
    if transform._step_micros < 1:
        raise ValueError(f"step must be at least one microsecond, got {step!r}")
    transform._schedule = resolve_schedule(transform._step, start, end, check_horizon(horizon))
    if key_fn is not None and not callable(key_fn):
        raise ValueError(f"key_fn must be callable, got {key_fn!r}")
    transform._keys = resolve_keys(key_fn, keys)
    transform._allowed_lateness = seconds("allowed_lateness", allowed_lateness, allow_zero=True)
    if late not in ("defer", "drop"):
        raise ValueError(f"late must be 'defer' or 'drop', got {late!r}")
    transform._late = late
    if rng is not None and not isinstance(rng, NoiseSource) and (
            isinstance(rng, bool) or not isinstance(rng, int)):
        raise ValueError("rng must be None (secure noise), or for tests an int seed or a "
                         f"dp_beam.mechanisms NoiseSource, got {rng!r}")
    transform._seed = rng
    if noise_key is None:
        noise_key = NoiseKey.generate()
    elif not isinstance(noise_key, NoiseKey):
        raise ValueError("noise_key must be None (a fresh key per construction) or a "
                         f"dp_beam.NoiseKey (from_env, from_file, from_bytes), got {type(noise_key)!r}")
    transform._noise_key = noise_key
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 0):
        raise ValueError(f"shards must be None (chosen from the declared keys), 0 (one stateful key "
                         f"per stream) or a positive int, got {shards!r}")
    transform._shards = shards


def private_keys(transform: beam.PTransform) -> Optional[PrivateKeys]:
    """The transform's :class:`PrivateKeys`, or ``None`` when its keys are public."""
    return transform._keys if isinstance(transform._keys, PrivateKeys) else None


def validation(transform: beam.PTransform) -> Tuple[Schedule, Optional[FrozenSet[Any]], Dict[str, Any]]:
    """``(schedule, declared key set or None, side-input kwargs)`` for the per-event stage."""
    declared = transform._keys
    if isinstance(declared, DeclaredKeys):
        side = declared.side_input()
        return transform._schedule, declared.keys, ({"declared": side} if side is not None else {})
    return transform._schedule, None, {}


def release_shards(transform: beam.PTransform, events: beam.PCollection) -> int:
    """The shards that release ``transform``'s streams over ``events``: its ``shards``
    option, or for ``None`` :func:`~dp_beam.transforms.shards.default_shards` of its
    stream count (1 without ``key_fn``; the declared keys; unknown for a ``PCollection``
    of keys or private selection) and of whether ``events`` is bounded."""
    shards = getattr(transform, "_shards", 0)
    if shards is not None:
        return shards
    declared = transform._keys
    if declared is None:
        count = 1
    elif isinstance(declared, DeclaredKeys) and declared.keys is not None:
        count = len(declared.keys)
    else:
        count = None
    return default_shards(count, bounded=events.is_bounded)


def raw_steps(transform: beam.PTransform, events: beam.PCollection) -> bool:
    """True when the release merges the partial totals per (key, step) itself: bounded input
    released by shards (one grouping per shard, see
    :class:`~dp_beam.transforms.shards.BatchShardReleaseDoFn`)."""
    return bool(events.is_bounded and release_shards(transform, events))


def release_streams(transform: beam.PTransform, events: beam.PCollection,
                    aggregates: beam.PCollection, spec: ReleaseSpec, entry: LedgerEntry,
                    invalids: Iterable[beam.PCollection], *,
                    units: Optional[beam.PCollection] = None, unit: str = "event",
                    combine_fn: Optional[beam.CombineFn] = None,
                    markers_aside: bool = False) -> ContinualResult:
    """Opens the public (or privately selected) streams and releases them in step order.

    ``units`` are the ``(key, event time)`` signals of first contributions,
    required with private key selection; ``unit`` names its privacy unit.
    ``combine_fn``: ``aggregates`` are partial accumulators ``(key, (step, accumulator))``
    of that fn, merged by the release (only when :func:`raw_steps`).
    ``markers_aside``: with ``combine_fn`` and a declared list of keys, the stream markers
    reach the release as a side input instead of being flattened with the totals (see
    ``_release_totals``; for totals far larger than the releases, as ERM's points are).
    """
    schedule = transform._schedule
    bounded = events.is_bounded
    declared = transform._keys
    common = dict(schedule=schedule, bounded=bounded, late=transform._late, seed=transform._seed,
                  noise_key=transform._noise_key, allowed_lateness=transform._allowed_lateness,
                  shards=release_shards(transform, events), combine_fn=combine_fn)
    if isinstance(declared, PrivateKeys):
        admitted, seeds, selection_entry, charged = select_keys(
            units, declared, schedule, transform.label, unit, bounded, transform._seed,
            transform._noise_key)
        return release_in_order(aggregates, spec, (entry, selection_entry), invalids,
                                seeds=seeds, extra_releases=(admitted,),
                                extra_accounting=(charged,), **common)
    if isinstance(declared, DeclaredKeys) and declared.keys is not None and combine_fn is not None:
        # Already in the shape of the routed totals: one element per shard, not per key.
        seeds = declared.shard_seeds(events.pipeline, schedule.start_step, common["shards"])
        return release_in_order(aggregates, spec, (entry,), invalids, seeds=seeds,
                                routed_seeds=True, markers_aside=markers_aside, **common)
    if isinstance(declared, DeclaredKeys):
        seeds = declared.seeds(events.pipeline, schedule.start_step)
    else:
        seeds = events.pipeline | "OpenStream" >> beam.Create(
            [(None, (schedule.start_step, StreamStart()))])
    return release_in_order(aggregates, spec, (entry,), invalids, seeds=seeds, **common)


def release_in_order(aggregates: beam.PCollection, spec: ReleaseSpec, plan: Iterable[Any],
                     invalids: Iterable[beam.PCollection], *, schedule: Schedule,
                     seeds: beam.PCollection, bounded: bool, late: str,
                     seed: Union[None, int, NoiseSource], noise_key: Optional[NoiseKey] = None,
                     extra_releases: Iterable[beam.PCollection] = (),
                     extra_accounting: Iterable[beam.PCollection] = (),
                     allowed_lateness: Optional[float] = None, shards: int = 0,
                     combine_fn: Optional[beam.CombineFn] = None,
                     routed_seeds: bool = False, markers_aside: bool = False) -> ContinualResult:
    """Applies the ordered release to per-step aggregates; the common tail of every transform.

    ``aggregates`` are ``(key, (step, aggregate))`` in the global window and
    ``seeds`` the ``(key, (step, StreamStart()))`` elements that open the
    streams (one per declared key at the public start, or one per admitted
    key), plus any ``NotAdmitted`` markers. Every stream releases each step
    of ``schedule`` from its opening step. Returns the
    :class:`ContinualResult` with ``invalids`` (earlier dead-letter outputs)
    flattened with the release's own, ``extra_releases`` (e.g. key
    admissions) flattened into ``.releases`` and ``extra_accounting`` into
    ``.accounting``; ``plan`` (the planned ledger entries) is attached to the
    accounting output. ``allowed_lateness``: see :class:`OrderedReleaseDoFn`.

    The release is keyed by stream key with the deterministic
    :class:`~dp_beam.transforms.stream_keys.StreamKeyCoder` (the element type
    of its input is declared), as runners that encode state keys require.

    ``shards`` > 0 routes the streams to that many shards and releases each
    shard with one stateful DoFn and one timer
    (:class:`~dp_beam.transforms.shards.ShardedReleaseDoFn`; same records);
    0 keeps one stateful key per stream. Specs with a log use the per-key
    path on unbounded input (see :mod:`~dp_beam.transforms.shards`). Bounded
    input with shards is released without state or timers
    (:class:`~dp_beam.transforms.shards.BatchShardReleaseDoFn`);
    ``combine_fn`` (only there) says that ``aggregates`` are partial
    accumulators of that fn already routed to their shards, ``(shard,
    [(key, step, accumulator), ...])``
    (:class:`~dp_beam.transforms.steps.StepTotals`), merged per (key, step)
    in the release's own grouping; ``routed_seeds`` says that ``seeds`` are routed the
    same way (:meth:`~dp_beam.transforms.schedule.DeclaredKeys.shard_seeds`), and
    ``markers_aside`` (with ``routed_seeds``) that they reach the release as a side input.
    """
    schedule.require_end(bounded, spec.transform)
    if combine_fn is not None and not (shards and bounded):
        raise ValueError("combine_fn needs the sharded release of bounded input")
    if routed_seeds and combine_fn is None:
        raise ValueError("routed_seeds needs combine_fn")
    if markers_aside and not routed_seeds:
        raise ValueError("markers_aside needs routed_seeds")
    dofn = LoggedReleaseDoFn if spec.uses_log else OrderedReleaseDoFn
    release_fn = dofn(spec, bounded=bounded, late=late, seed=seed, end_step=schedule.end_step,
                      noise_key=noise_key, allowed_lateness=allowed_lateness)
    if combine_fn is not None:
        released = _release_totals(aggregates, seeds, release_fn, shards, combine_fn,
                                   routed_seeds, markers_aside)
        return _result(released, plan, invalids, extra_releases, extra_accounting)
    opened = (aggregates, seeds) | "Open" >> beam.Flatten().with_output_types(KV)
    if shards and (bounded or not spec.uses_log):
        released = _release_sharded(opened, release_fn, shards, bounded)
    else:
        released = opened | "Release" >> beam.ParDo(release_fn).with_outputs(
            ACCOUNTING, INVALID, main="releases")
    return _result((released,), plan, invalids, extra_releases, extra_accounting)


def _release_sharded(opened, release_fn, shards, bounded):
    """The release of ``opened`` routed to ``shards`` shards, one stateful key each (bounded
    input: one grouping per shard, without state)."""
    sharded = (opened
               | "Shard" >> beam.Map(lambda kv, n=shards: (shard_of(kv[0], n), kv)
                                     ).with_output_types(Tuple[int, Any]))
    if bounded:
        # All timers of bounded input fire after all of it is in: a grouping
        # per shard and one pass over it give the same records without state.
        return (sharded
                | "GroupShard" >> beam.GroupByKey()
                | "Release" >> beam.ParDo(BatchShardReleaseDoFn(release_fn)).with_outputs(
                    ACCOUNTING, INVALID, main="releases"))
    return sharded | "Release" >> beam.ParDo(ShardedReleaseDoFn(release_fn)).with_outputs(
        ACCOUNTING, INVALID, main="releases")


def _seed_entries(kv, shards):
    """A stream marker ``(key, (step, marker))`` in the shape of the routed partial totals."""
    key, (step, marker) = kv
    return shard_of(key, shards), [(key, step, marker)]


def _release_totals(totals, seeds, release_fn, shards, combine_fn, routed_seeds=False,
                    markers_aside=False):
    """The timer-free release of bounded partial totals that arrive routed to their shards
    (:class:`~dp_beam.transforms.steps.StepTotals`): the stream markers join them in the
    same shape (routed here unless ``routed_seeds``), and one grouping per shard brings
    each shard its whole input. Returns the outputs of the release's ``ParDo`` (two with
    ``markers_aside``), for :func:`_result`.

    ``markers_aside`` (with ``routed_seeds``): the totals are grouped alone and the markers
    reach the release as a side input, the shards without totals being released by
    :class:`~dp_beam.transforms.shards.AbsentShardReleaseDoFn`. A ``Flatten`` of the totals
    with the markers is a copy of all the totals in the in-process runner (it writes a
    flatten's inputs to a buffer and reads them back before the grouping), which costs
    where the totals are large (ERM's points); the two releases' outputs are flattened
    instead (by :func:`_result`, with the other outputs), which costs little where releases
    are few."""
    if markers_aside:
        grouping, side, tags = totals, {"markers": beam.pvalue.AsDict(seeds)}, (RELEASED_SHARDS,)
    else:
        routed = seeds if routed_seeds else seeds | "ShardSeeds" >> beam.Map(
            _seed_entries, shards).with_output_types(Tuple[int, Any])
        grouping = ((totals, routed)
                    | "Open" >> beam.Flatten().with_output_types(Tuple[int, Any]))
        side, tags = {}, ()
    released = (grouping
                | "GroupShard" >> beam.GroupByKey()
                | "Release" >> beam.ParDo(BatchShardReleaseDoFn(release_fn, combine_fn), **side)
                .with_outputs(ACCOUNTING, INVALID, *tags, main="releases"))
    if not markers_aside:
        return (released,)
    absent = seeds | "ReleaseAbsent" >> beam.ParDo(
        AbsentShardReleaseDoFn(release_fn, combine_fn),
        beam.pvalue.AsList(released[RELEASED_SHARDS])).with_outputs(
            ACCOUNTING, INVALID, main="releases")
    return released, absent


def _result(released, plan, invalids, extra_releases, extra_accounting):
    """The :class:`ContinualResult` of the outputs of the release (``released``: those of one
    ``ParDo``, or of two) flattened with the other ones, the plan attached to its accounting."""
    invalid = tuple(invalids) + tuple(r[INVALID] for r in released) | "Invalid" >> beam.Flatten()
    releases = tuple(r.releases for r in released) + tuple(extra_releases)
    releases = releases[0] if len(releases) == 1 else releases | "Releases" >> beam.Flatten()
    accounting = tuple(r[ACCOUNTING] for r in released) + tuple(extra_accounting)
    accounting = (accounting[0] if len(accounting) == 1
                  else accounting | "Accounting" >> beam.Flatten())
    setattr(accounting, PLAN_ATTRIBUTE, tuple(plan))
    return ContinualResult(releases, accounting, invalid)
