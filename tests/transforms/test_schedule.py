"""The public schedule and key set: argument validation, and what the pipeline does with them."""

import datetime

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.transforms.schedule import resolve_keys, resolve_schedule, to_seconds
from apache_beam.testing import test_stream

from tests.beam_util import batch_options, collect, streaming_options


def _run(transform, events):
    """(releases, ledger, invalid) of a batch run, as lists."""
    def build(p):
        res = p | beam.Create(events) | transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(batch_options(), build)
    return out["releases"], out["accounting"], out["invalid"]


def test_to_seconds_accepts_datetime_iso_and_numbers():
    utc = datetime.timezone.utc
    assert to_seconds("start", datetime.datetime(2013, 1, 1, tzinfo=utc)) == 1356998400.0
    assert to_seconds("start", datetime.datetime(2013, 1, 1)) == 1356998400.0  # naive = UTC
    assert to_seconds("start", "2013-01-01T01:00:00+01:00") == 1356998400.0
    assert to_seconds("start", "2013-01-01") == 1356998400.0
    assert to_seconds("start", datetime.date(2013, 1, 1)) == 1356998400.0
    assert to_seconds("end", 12.5) == 12.5


@pytest.mark.parametrize("bad", ["yesterday", float("nan"), True, [1], None])
def test_to_seconds_rejects_other_values_naming_the_parameter(bad):
    with pytest.raises(ValueError, match="^end must be"):
        to_seconds("end", bad)


def test_schedule_aligns_start_down_and_end_up():
    s = resolve_schedule(10.0, start=25, end=61)
    assert (s.start_step, s.end_step, s.steps) == (2, 7, 5)
    assert s.check(1).startswith("event time before start")
    assert s.check(7).startswith("event time at or after end")
    assert s.check(2) is None and s.check(6) is None
    # An aligned end releases nothing of the step it starts.
    assert resolve_schedule(10.0, start=0, end=60).end_step == 6


def test_schedule_horizon_gives_the_end_or_bounds_it():
    assert resolve_schedule(10.0, start=0, horizon=4).end_step == 4
    assert resolve_schedule(10.0, start=0, end=40, horizon=4).end_step == 4
    with pytest.raises(ValueError, match="^end is 5 steps after start, beyond horizon=4"):
        resolve_schedule(10.0, start=0, end=50, horizon=4)


def test_schedule_errors_name_the_parameter():
    with pytest.raises(ValueError, match="^start is required"):
        resolve_schedule(10.0, start=None)
    with pytest.raises(ValueError, match="^end must be after start"):
        resolve_schedule(10.0, start=100, end=100)


def test_keys_rules():
    assert resolve_keys(None, None) is None
    with pytest.raises(ValueError, match="^keys is required with key_fn"):
        resolve_keys(lambda e: e, None)
    with pytest.raises(ValueError, match="^keys needs key_fn"):
        resolve_keys(None, ["a"])
    with pytest.raises(ValueError, match="^keys must be an iterable"):
        resolve_keys(lambda e: e, "ab")
    with pytest.raises(ValueError, match="^keys must not be empty"):
        resolve_keys(lambda e: e, [])
    with pytest.raises(ValueError, match="^keys must be hashable"):
        resolve_keys(lambda e: e, [["a"]])
    with pytest.raises(ValueError, match="^keys must not contain None"):
        resolve_keys(lambda e: e, ["a", None])
    with pytest.raises(ValueError, match="^keys must not contain NaN"):
        resolve_keys(lambda e: e, [float("nan")])
    assert resolve_keys(lambda e: e, ("a", "b", "a")).keys == frozenset({"a", "b"})


TRANSFORMS = {
    "count": lambda **kw: dpb.ContinualCount(epsilon=1.0, step=10, **kw),
    "sum": lambda **kw: dpb.ContinualSum(value_fn=lambda e: e["v"], lower=0, upper=1,
                                         epsilon=1.0, step=10, **kw),
    "mean": lambda **kw: dpb.ContinualMean(user_fn=lambda e: e["u"], value_fn=lambda e: e["v"],
                                           lower=0, upper=1, max_samples_per_user=4,
                                           epsilon=1.0, step=10, **kw),
    "erm": lambda **kw: dpb.ContinualERM(
        features_fn=lambda e: [e["v"], 0.0], label_fn=lambda e: int(e["v"] > 0.5),
        classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=2,
        base_size=4, step=10, **kw),
    "sliding": lambda **kw: dpb.SlidingWindowERM(
        features_fn=lambda e: [e["v"], 0.0], label_fn=lambda e: int(e["v"] > 0.5),
        classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=2,
        window=6, step=10, **kw),
    "multires": lambda **kw: dpb.MultiResolutionERM(
        features_fn=lambda e: [e["v"], 0.0], label_fn=lambda e: int(e["v"] > 0.5),
        classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=2,
        step=10, **kw),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_every_transform_requires_start_and_refuses_key_fn_without_keys(name):
    make = TRANSFORMS[name]
    with pytest.raises(ValueError, match="^start is required"):
        make(end=100)
    with pytest.raises(ValueError, match="^keys is required with key_fn"):
        make(start=0, end=100, key_fn=lambda e: e["k"])
    with pytest.raises(TypeError):
        make(start=0, end=100, max_idle_steps=3)  # removed: it paused streams on the data


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_bounded_input_without_end_is_refused_naming_end(name):
    transform = TRANSFORMS[name](start=0, timestamp_fn=lambda e: e["ts"])
    with pytest.raises(ValueError, match="^end is required for bounded input"):
        with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
            _ = p | beam.Create([{"ts": 1.0, "u": "a", "v": 0.5}]) | transform


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_events_outside_the_schedule_and_of_undeclared_keys_go_to_invalid(name):
    events = [{"ts": 5.0, "u": "a", "v": 0.5, "k": "A"},     # before start (step 0)
              {"ts": 15.0, "u": "a", "v": 0.5, "k": "A"},    # used
              {"ts": 25.0, "u": "b", "v": 0.5, "k": "Z"},    # undeclared key
              {"ts": 45.0, "u": "c", "v": 0.5, "k": "B"}]    # at the end step
    transform = TRANSFORMS[name](start=10, end=40, key_fn=lambda e: e["k"], keys=["A", "B"],
                                 timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
    releases, ledger, invalid = _run(transform, events)
    reasons = sorted(r.reason.split(" (")[0] for r in invalid)
    assert reasons == ["event time at or after end", "event time before start",
                       "undeclared key 'Z'"]
    assert sum(r.count for r in invalid) == 3
    assert sorted(e.key for e in ledger) == ["A", "B"]
    if name in ("count", "sum", "mean"):
        # Every declared key, every step 1..3, with or without events.
        assert sorted((r.key, r.step) for r in releases) == [
            (k, s) for k in ("A", "B") for s in (1, 2, 3)]


def test_count_of_a_declared_key_without_events_releases_zeros_every_step():
    transform = dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=50,
                                   key_fn=lambda e: e["k"], keys=["A", "quiet"],
                                   timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
    releases, ledger, _ = _run(transform, [{"ts": 12.0, "k": "A"}, {"ts": 13.0, "k": "A"}])
    got = {(r.key, r.step): r.value for r in releases}
    assert got == {**{("A", s): (0.0 if s == 0 else 2.0) for s in range(5)},
                   **{("quiet", s): 0.0 for s in range(5)}}
    assert {(r.key, r.t) for r in releases if r.step == 0} == {("A", 1), ("quiet", 1)}


def test_keys_from_a_pcollection_and_numpy_keys_join_the_declared_stream():
    def build(p):
        keys = p | "keys" >> beam.Create(["AA", "BB", "AA"])
        events = p | "events" >> beam.Create([{"ts": 1.0, "k": np.str_("AA")},
                                              {"ts": 2.0, "k": "AA"}, {"ts": 3.0, "k": "CC"}])
        res = events | dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=20,
                                          key_fn=lambda e: e["k"], keys=keys,
                                          timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
        return {"r": res.releases | beam.Map(
                    lambda r: (type(r.key).__name__, r.key, r.step, r.value)),
                "i": res.invalid | "reasons" >> beam.Map(lambda r: r.reason)}
    out = collect(batch_options(), build)
    out["r"] = sorted(out["r"])
    assert out["r"] == [("str", "AA", 0, 2.0), ("str", "AA", 1, 2.0),
                        ("str", "BB", 0, 0.0), ("str", "BB", 1, 0.0)]
    assert out["i"] == ["undeclared key 'CC' (not in keys)"]


def test_unhashable_key_goes_to_invalid():
    transform = dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=20,
                                   key_fn=lambda e: e["k"], keys=["A"],
                                   timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
    releases, _, invalid = _run(transform, [{"ts": 1.0, "k": ["A"]}, {"ts": 2.0, "k": "A"}])
    assert [r.reason for r in invalid] == ["key_fn returned an unhashable list"]
    assert sorted((r.step, r.value) for r in releases) == [(0, 1.0), (1, 1.0)]


def test_start_as_datetime_and_iso_string_give_the_same_schedule():
    utc = datetime.timezone.utc
    hour = datetime.timedelta(hours=1)
    base = datetime.datetime(2013, 1, 1, tzinfo=utc)
    events = [{"ts": base.timestamp() + 1800}, {"ts": base.timestamp() + 3 * 3600}]
    runs = []
    for start, end in ((base, base + 4 * hour), ("2013-01-01T00:00:00Z", "2013-01-01T04:00:00Z"),
                       (base.timestamp() + 60, base.timestamp() + 4 * 3600)):
        transform = dpb.ContinualCount(epsilon=1.0, step=hour, start=start, end=end,
                                       timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
        releases, _, _ = _run(transform, events)
        runs.append(sorted((r.window_start, r.value) for r in releases))
    assert runs[0] == runs[1] == runs[2]
    assert [v for _, v in runs[0]] == [1.0, 1.0, 1.0, 2.0]
    assert runs[0][0][0] == base.timestamp()


def test_streaming_keys_from_a_pcollection():
    def build(p):
        keys = p | "keys" >> beam.Create(["A", "B", "A"])
        stream = (test_stream.TestStream().advance_watermark_to(0)
                  .add_elements([beam.window.TimestampedValue({"ts": 5.0, "k": "A"}, 5.0),
                                 beam.window.TimestampedValue({"ts": 6.0, "k": "C"}, 6.0)])
                  .advance_watermark_to_infinity())
        res = p | stream | dpb.ContinualCount(
            epsilon=1.0, step=10, start=0, end=30, key_fn=lambda e: e["k"], keys=keys,
            timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
        return {"r": res.releases, "i": res.invalid}
    out = collect(streaming_options(), build)
    assert sorted((r.key, r.step, r.value) for r in out["r"]) == [
        ("A", 0, 1.0), ("A", 1, 1.0), ("A", 2, 1.0), ("B", 0, 0.0), ("B", 1, 0.0), ("B", 2, 0.0)]
    assert [r.reason for r in out["i"]] == ["undeclared key 'C' (not in keys)"]


def test_declared_keys_routed_to_shards_are_the_seeds_grouped_by_shard():
    from dp_beam.transforms.schedule import DeclaredKeys, StreamStart
    from dp_beam.transforms.stream_keys import shard_of
    declared = DeclaredKeys(frozenset(f"k{i}" for i in range(40)) | {7, ("a", 1)}, None)
    seeds = collect(batch_options(), lambda p: {"s": declared.seeds(p, 5)})["s"]
    routed = collect(batch_options(), lambda p: {"r": declared.shard_seeds(p, 5, 3)})["r"]
    # One element per shard, holding exactly the seeds of its keys.
    assert sorted(shard for shard, _ in routed) == [0, 1, 2]
    flat = [(shard, key, (step, marker)) for shard, entries in routed
            for key, step, marker in entries]
    assert sorted(flat, key=repr) == sorted(
        [(shard_of(key, 3), key, value) for key, value in seeds], key=repr)
    assert len(flat) == 42 and all(marker == StreamStart() for *_, (_, marker) in flat)
    with pytest.raises(ValueError, match="list of keys"):
        DeclaredKeys(None, None).shard_seeds(None, 5, 3)


def test_the_bounded_sharded_release_routes_declared_keys_without_a_step_per_key():
    p = beam.Pipeline(options=batch_options())
    _ = (p | beam.Create([("a", 1.0)])
         | dpb.ContinualCount(epsilon=1.0, step=1.0, start=0, end=4, key_fn=lambda e: e[0],
                              keys=["a", "b"], timestamp_fn=lambda e: e[1]))
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    assert not any("ShardSeeds" in label for label in labels)
    assert any(label.endswith("DeclaredKeysCreate") for label in labels)
    # (A declared key without events still releases every step on this path:
    # test_count_of_a_declared_key_without_events_releases_zeros_every_step.)
