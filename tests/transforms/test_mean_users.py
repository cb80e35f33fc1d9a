"""The per-user stages of ``ContinualMean``: validation and the withhold-release schedule."""

import pickle
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import pvalue
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms.continual_mean import MeanParams, mean_config
from dp_beam.transforms.contributions import CountCapped, capped_records, event_order
from dp_beam.transforms.events import CAPPED, INVALID
from dp_beam.transforms.keys import UNITS
from dp_beam.transforms import mean_users
from dp_beam.transforms.mean_aggregates import MergeAggregates, accumulator, merge_into
from dp_beam.transforms.mean_users import (PrepareMeanEvents, WithholdRelease,
                                           WithholdReleaseBatch, WithholdReleaseTotals)
from dp_beam.transforms.stream_keys import shard_of
from tests.beam_util import batch_options, windowed_at

STEP_MICROS = 10_000_000     # 10-second steps
M = 4


def _params(preset="paper", m=M):
    return MeanParams(mean_config("test", max_users=20, max_samples_per_user=m, epsilon=1.0,
                                  neighbours="values", preset=preset))


def _stage(cls, max_keys=1, selecting=False, preset="paper", m=M, **kw):
    stage = cls(transform="m", params=_params(preset, m), lower=[0.0], upper=[4.0],
                step_micros=STEP_MICROS, max_keys=max_keys, selecting=selecting, **kw)
    stage.setup()
    return stage


class _Cell:
    def __init__(self):
        self.v = None

    def read(self):
        return self.v

    def write(self, v):
        self.v = pickle.loads(pickle.dumps(v))   # as a state backend would store it


def _fields(agg):
    def norm(v):
        return np.asarray(v).tolist() if isinstance(v, np.ndarray) else v
    out = {name: {k: norm(v) for k, v in getattr(agg, name).items()}
           for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc")}
    out["events"], out["max_count"] = agg.events, agg.max_count
    out["samples"] = sorted((k, i, np.asarray(x).tolist()) for k, i, x in agg.samples)
    return out


def _per_key_step(pairs):
    out = {}
    for key_step, agg in pairs:
        merge_into(out.setdefault(key_step, accumulator()), agg)
    return {k: _fields(v) for k, v in out.items()}


def _events(seed=0):
    """``(user, [(key, value, ts)])``: 5 users, up to 11 events each over 3 steps and 2 keys."""
    rnd = random.Random(seed)
    return [(f"u{u}", [(rnd.choice("AB"), rnd.randrange(0, 33) / 8, rnd.randrange(0, 300) / 10)
                       for _ in range(rnd.randrange(1, 12))]) for u in range(5)]


def _split(out):
    plain, tagged = [], {}
    for item in out:
        if isinstance(item, pvalue.TaggedOutput):
            tagged.setdefault(item.tag, []).append(item.value)
        else:
            plain.append(item)
    return plain, tagged


def test_batch_stage_takes_events_in_event_time_order_whatever_their_arrival():
    stage = _stage(WithholdReleaseBatch, max_keys=2)
    for user, events in _events():
        shuffled = list(events)
        random.Random(1).shuffle(shuffled)
        a = _split(stage.process((user, sorted(events, key=lambda e: e[2]))))
        b = _split(stage.process((user, shuffled)))
        assert _per_key_step(a[0]) == _per_key_step(b[0])


def test_batch_stage_keeps_the_same_tied_events_whatever_order_the_grouping_gives():
    # Seven events at one time, under two keys: the cap (M = 4 samples) and max_keys cut the
    # tie group, so arrival order alone would decide which samples and which key are kept.
    # Every order must give the same aggregates and dead letters: with keyed noise, a rerun
    # that kept other samples would release the first run's noise plus the data's change.
    events = [("B", 3.0, 5.0), ("A", 2.0, 5.0), ("A", 0.5, 5.0), ("B", 1.0, 5.0),
              ("A", 4.0, 5.0), ("A", 1.5, 5.0), ("A", 2.5, 5.0)]
    stage = _stage(WithholdReleaseBatch, max_keys=1)
    outs = []
    for seed in range(6):
        shuffled = list(events)
        random.Random(seed).shuffle(shuffled)
        out, tagged = _split(stage.process(("u", shuffled)))
        outs.append((_per_key_step(out), sorted(repr(r) for r in tagged[INVALID])))
        dead = {r.reason: (r.count, r.element["example"]) for r in tagged[INVALID]}
    assert all(o == outs[0] for o in outs)
    # Ties go by key, then value: key A is kept with its four smallest values, 4.0 is capped.
    (((key, _), fields),) = outs[0][0].items()
    assert key == "A" and fields["events"] == M
    assert dead == {"max_keys_per_user (1) exceeded for user": (2, {"key": "B", "value": 1.0}),
                    f"max_samples_per_user ({M}) exceeded for user": (1, {"key": "A", "value": 4.0})}


def test_batch_stage_matches_the_streaming_stage_fed_in_event_time_order():
    batch, streaming = _stage(WithholdReleaseBatch, max_keys=2), _stage(WithholdRelease, max_keys=2)
    batch_out, stream_out = [], []
    batch_capped, stream_capped = [], []
    for user, events in _events(seed=4):
        out, tagged = _split(batch.process((user, events)))
        batch_out += out
        assert CAPPED not in tagged
        batch_capped += tagged.get(INVALID, [])
        cell = _Cell()
        # The batch stage's order: event time, ties by key and value.
        for key, value, ts in sorted(events, key=event_order):
            out, tagged = _split(streaming.process((user, (key, value, ts)), state=cell))
            # The streaming stage stamps the aggregate; the step windows place it.
            stream_out += [((k, Timestamp.of(tv.timestamp).micros // STEP_MICROS), agg)
                           for tv in out for k, agg in [tv.value]]
            stream_capped += [pvalue.TaggedOutput(CAPPED, tv) for tv in tagged.get(CAPPED, [])]
    assert _per_key_step(batch_out) == _per_key_step(stream_out)
    # The batch stage's dead letters are CountCapped's records of the streaming stage's
    # capped events: every user here has some, and some users several per record.
    assert batch_capped == capped_records("m", stream_capped)
    assert len(stream_capped) > len(batch_capped) > 0


def test_the_batch_stage_dead_letters_are_those_count_capped_makes_in_a_pipeline():
    # Two samples past the cap in step 0, one in step 1, and two refused events of key B
    # with the same time (the example is the smaller repr).
    events = ([("A", 1.0, float(t)) for t in range(M + 2)] + [("A", 3.0, 12.0)]
              + [("B", 2.0, 3.5), ("B", 1.0, 3.5)])
    _, tagged = _split(_stage(WithholdReleaseBatch, max_keys=1).process(("u", events)))
    streaming, cell, capped = _stage(WithholdRelease, max_keys=1), _Cell(), []
    for key, value, ts in sorted(events, key=lambda e: e[2]):
        capped += _split(streaming.process(("u", (key, value, ts)), state=cell))[1].get(CAPPED, [])
    assert len(capped) == 5
    with beam.Pipeline(options=batch_options()) as p:
        records = (p | beam.Create([(tv.value, tv.timestamp) for tv in capped])
                   | beam.Map(lambda vt: beam.window.TimestampedValue(*vt))
                   | CountCapped("m", STEP_MICROS / 1e6))
        assert_that(records, equal_to(tagged[INVALID]))
    assert sorted((r.reason, r.element["step"], r.count) for r in tagged[INVALID]) == [
        ("max_keys_per_user (1) exceeded for user", 0, 2),
        (f"max_samples_per_user ({M}) exceeded for user", 0, 2),
        (f"max_samples_per_user ({M}) exceeded for user", 1, 1)]


def test_samples_past_the_cap_and_keys_past_max_keys_are_capped():
    stage = _stage(WithholdReleaseBatch, max_keys=1)
    events = [("A", 1.0, float(t)) for t in range(M + 2)] + [("B", 2.0, 3.5)]
    out, tagged = _split(stage.process(("u", events)))
    assert sum(agg.events for _, agg in out) == M
    assert sorted((r.reason, r.count) for r in tagged[INVALID]) == [
        ("max_keys_per_user (1) exceeded for user", 1),
        (f"max_samples_per_user ({M}) exceeded for user", 2)]
    (by_key,) = [r for r in tagged[INVALID] if "key" in r.element]
    assert by_key.element == {"user": "u", "step": 0, "key": "B",
                              "example": {"key": "B", "value": 2.0}}


def test_batch_stage_merges_a_users_aggregates_of_one_step():
    stage = _stage(WithholdReleaseBatch)
    out, _ = _split(stage.process(("u", [("A", 1.0, 1.0), ("A", 2.0, 2.0), ("A", 3.0, 15.0)])))
    assert sorted((key_step, agg.events) for key_step, agg in out) == [(("A", 0), 2), (("A", 1), 1)]


def _lifted_combine(pairs, max_keys):
    """What Beam 2.77's lifted ``CombinePerKey(MergeAggregates())`` makes of a bundle's
    ``((key, step), aggregate)`` outputs: each (key, step) gets the partials of a table of at
    most ``max_keys`` entries that sends on its oldest tenth when full (``PGBKCVOperation``),
    each compacted, merged in the order they left."""
    fn, table, partials = MergeAggregates(), {}, []
    for slot, agg in pairs:
        if slot not in table:
            if len(table) >= max_keys:
                n = len(table)
                for old in list(table)[:n - n * 9 // 10]:
                    partials.append((old, fn.compact(table.pop(old))))
            table[slot] = fn.create_accumulator()
        table[slot] = fn.add_input(table[slot], agg)
    partials += [(slot, fn.compact(acc)) for slot, acc in table.items()]
    grouped = {}
    for slot, acc in partials:
        grouped.setdefault(slot, []).append(pickle.loads(pickle.dumps(acc)))
    return {slot: fn.extract_output(fn.merge_accumulators(accs)) for slot, accs in grouped.items()}


def _exact(agg):
    """An aggregate's fields with every float as its bits."""
    def bits(v):
        if isinstance(v, np.ndarray):
            return [float(x).hex() for x in v.ravel()], v.shape
        return float(v).hex() if isinstance(v, float) else v
    out = {name: {k: bits(v) for k, v in getattr(agg, name).items()}
           for name in ("counts", "low", "n_low", "prefix", "proj", "a_inc")}
    out["samples"] = [(k, i, bits(np.asarray(x, dtype=np.float64))) for k, i, x in agg.samples]
    out["events"], out["max_count"] = agg.events, agg.max_count
    return out


@pytest.mark.parametrize("preset", ["tuned", "paper"])
@pytest.mark.parametrize("max_steps", [3, mean_users.MAX_BUNDLE_STEPS])
def test_totals_stage_sends_the_partials_of_the_lifted_combine_bit_for_bit(
        monkeypatch, preset, max_steps):
    # Values that are not dyadic: their float sums depend on the order of the additions.
    rnd = random.Random(7)
    users = [(f"u{u}", [(rnd.choice("ABC"), rnd.uniform(0, 4), rnd.randrange(0, 400) / 10)
                        for _ in range(rnd.randrange(1, 12))]) for u in range(60)]
    monkeypatch.setattr(mean_users, "MAX_BUNDLE_STEPS", max_steps)
    batch = _stage(WithholdReleaseBatch, max_keys=2, selecting=True, preset=preset)
    totals = _stage(WithholdReleaseTotals, max_keys=2, selecting=True, preset=preset, shards=2)
    pairs, batch_tagged, sent, totals_tagged = [], [], [], []
    totals.start_bundle()
    for user, events in users:
        out, tagged = _split(batch.process((user, events)))
        pairs += out
        batch_tagged.append(tagged)
        out, tagged = _split(totals.process((user, events)))
        sent += out
        totals_tagged.append(tagged)
    sent += totals.finish_bundle()
    assert totals_tagged == batch_tagged
    # As BatchShardReleaseDoFn merges a (key, step)'s partials: in the order they came.
    fn, merged = MergeAggregates(), {}
    for wv in sent:
        shard, entries = wv.value
        assert wv.windows == (GlobalWindow(),)
        assert wv.timestamp == Timestamp(micros=(min(s for _, s, _ in entries) + 1) * STEP_MICROS - 1)
        for key, step, acc in pickle.loads(pickle.dumps(entries)):
            assert shard_of(key, 2) == shard
            prev = merged.get((key, step))
            merged[key, step] = acc if prev is None else fn.merge_accumulators([prev, acc])
    expected = _lifted_combine(pairs, max_steps)
    assert len(sent) > (2 if max_steps == 3 else 0) and sorted(merged) == sorted(expected)
    assert {k: _exact(fn.extract_output(v)) for k, v in merged.items()} == {
        k: _exact(v) for k, v in expected.items()}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_totals_stage_rejects_a_shard_count_that_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="shards must be a positive int"):
        _stage(WithholdReleaseTotals, shards=bad)


def test_a_late_event_counts_in_the_step_of_the_latest_event_time_seen():
    # A released element must never land in a step before one of its own samples.
    stage = _stage(WithholdRelease)
    cell = _Cell()
    first, _ = _split(stage.process(("u", ("A", 1.0, 25.0)), state=cell))
    late, _ = _split(stage.process(("u", ("A", 2.0, 5.0)), state=cell))
    assert first[0].timestamp == late[0].timestamp == Timestamp.of(25.0)


@pytest.mark.parametrize("cls", [WithholdRelease, WithholdReleaseBatch])
def test_private_key_selection_hears_of_each_users_first_event_per_key(cls):
    stage = _stage(cls, max_keys=2, selecting=True)
    events = [("A", 1.0, 1.0), ("A", 1.0, 2.0), ("B", 1.0, 3.0), ("C", 1.0, 4.0)]
    if cls is WithholdReleaseBatch:
        _, tagged = _split(stage.process(("u", events)))
    else:
        cell, tagged = _Cell(), {}
        for event in events:
            for tag, values in _split(stage.process(("u", event), state=cell))[1].items():
                tagged.setdefault(tag, []).extend(values)
    assert tagged[UNITS] == [("A", 1.0), ("B", 3.0)]
    # The refused key C: one capped event (streaming), one finished dead letter (batch).
    assert len(tagged[CAPPED if cls is WithholdRelease else INVALID]) == 1


def _prepare(**kw):
    args = dict(transform="m", value_fn=lambda e: e["v"], user_fn=lambda e: e["u"], key_fn=None,
                timestamp_fn=lambda e: e["ts"], lower=[0.0, 0.0], upper=[1.0, 2.0])
    args.update(kw)
    return PrepareMeanEvents(**args)


def test_prepare_clamps_each_coordinate_and_dead_letters_bad_values():
    fn = _prepare()
    (ok,) = fn.process({"u": "a", "ts": 3.0, "v": np.array([3.0, -1.0])}, windowed=windowed_at(0))
    assert ok.value == ("a", (None, (1.0, 0.0), Timestamp.of(3.0))) and ok.timestamp == 3.0
    for value, reason in (([0.5], "value has 1 coordinates, expected 2"),
                          ([0.5, float("nan")], "coordinate 1: value is NaN"),
                          (0.5, "not a sequence of 2 real numbers: float")):
        (bad,) = fn.process({"u": "a", "ts": 3.0, "v": value}, windowed=windowed_at(0))
        assert bad.tag == INVALID and bad.value.reason == reason
    (bad,) = fn.process({"u": None, "ts": 3.0, "v": [0.5, 0.5]}, windowed=windowed_at(0))
    assert bad.tag == INVALID


def test_prepare_scalar_values_keep_their_float_and_are_clamped():
    fn = _prepare(lower=[0.0], upper=[1.0])
    outs = [fn.process({"u": "a", "ts": 1.0, "v": v}, windowed=windowed_at(0))
            for v in (0.25, 7.0, -2, np.float64(0.5))]
    assert [next(iter(o)).value[1][1] for o in outs] == [0.25, 1.0, 0.0, 0.5]


@pytest.mark.parametrize("max_events", [3, mean_users.MAX_BUNDLE_EVENTS])
def test_batch_prepare_gathers_each_users_events_in_arrival_order(monkeypatch, max_events):
    monkeypatch.setattr(mean_users, "MAX_BUNDLE_EVENTS", max_events)
    rnd = random.Random(3)
    events = [{"u": f"u{rnd.randrange(4)}", "ts": rnd.randrange(0, 100) / 4, "v": rnd.uniform(-1, 2)}
              for _ in range(25)] + [{"u": None, "ts": 1.0, "v": 0.5}]
    single = _prepare(lower=[0.0], upper=[1.0])
    gather = mean_users.PrepareMeanEventsBatch(
        transform="m", value_fn=lambda e: e["v"], user_fn=lambda e: e["u"], key_fn=None,
        timestamp_fn=lambda e: e["ts"], lower=[0.0], upper=[1.0])
    gather.start_bundle()
    one, gathered, dead = {}, [], []
    for i, e in enumerate(events):
        for out in single.process(e, windowed=windowed_at(i)):
            if not isinstance(out, pvalue.TaggedOutput):
                one.setdefault(out.value[0], []).append(out.value[1])
        for out in gather.process(e, windowed=windowed_at(i)):
            if isinstance(out, pvalue.TaggedOutput):
                dead.append(out)
            else:
                gathered.append(out)
    gathered += gather.finish_bundle()
    assert len(dead) == 1 and dead[0].tag == INVALID
    assert len(gathered) > (4 if max_events == 3 else 0)
    assert all(wv.windows == (GlobalWindow(),) for wv in gathered)
    concatenated = {}
    for wv in gathered:
        user, batch = wv.value
        concatenated.setdefault(user, []).extend(batch)
    assert concatenated == one
    # The batch stage takes the gathered lists as their concatenation.
    stages = [_stage(WithholdReleaseBatch, gathered=True, preset="tuned"),
              _stage(WithholdReleaseBatch, preset="tuned")]
    for user, batch in one.items():
        lists = [wv.value[1] for wv in gathered if wv.value[0] == user]
        a = _split(stages[0].process((user, lists)))
        b = _split(stages[1].process((user, batch)))
        assert [(k, _exact(x)) for k, x in a[0]] == [(k, _exact(x)) for k, x in b[0]]
