"""Keys and users: normalised before any grouping, deterministically coded (stream_keys.py),
and the regressions they fix (NaN keys, NumPy keys, the key coder warning)."""

import dataclasses
import datetime
import decimal
import fractions
import io
import logging
import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.coders import registry
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.typehints.native_type_compatibility import convert_to_beam_type
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.transforms.stream_keys import _MAX_DEPTH, KV, StreamKeyCoder, normalize_key
from tests.beam_util import batch_options, collect, streaming_options

STEP = 3600.0
END = 4 * STEP


@pytest.mark.parametrize("value, expected", [
    ("AA", "AA"), (np.str_("AA"), "AA"), (7, 7), (np.int64(7), 7), (np.uint64(2**64 - 1), 2**64 - 1),
    (True, 1), (1.0, 1), (np.float32(0.5), 0.5), (-0.0, 0), (decimal.Decimal("2"), 2),
    (fractions.Fraction(1, 4), 0.25), (b"k", b"k"), (bytearray(b"k"), b"k"),
    (("a", np.int64(1), None), ("a", 1, None)), (np.array(3), 3), (10 ** 40, 10 ** 40),
    # A flat tuple of str, int and None is returned as it is; a bool in one is still an int.
    (("a", 1, None), ("a", 1, None)), (("a", True), ("a", 1)), (("a", 1.0), ("a", 1)),
])
def test_normalize_key_gives_one_python_value_per_equal_id(value, expected):
    key, err = normalize_key(value)
    assert err is None
    assert key == expected and type(key) is type(expected)


@dataclasses.dataclass(frozen=True)
class _Frozen:
    x: int


@pytest.mark.parametrize("value, fragment", [
    (float("nan"), "NaN"), (np.float64("nan"), "NaN"), (decimal.Decimal("NaN"), "NaN"),
    (decimal.Decimal("sNaN"), "out of the float range"), (math.inf, "infinite"),
    (fractions.Fraction(10 ** 400), "out of the float range"), (1j, "complex"),
    (["a"], "unhashable list"), ({"a": 1}, "unhashable dict"), ({"a"}, "unhashable set"),
    (("a", float("nan")), "tuple holding NaN"), (("a", ["b"]), "tuple holding an unhashable"),
    (_Frozen(1), "ids must be strings"), (datetime.date(2013, 1, 1), "ids must be strings"),
    (np.datetime64("2013-01-01"), "datetime64"), (frozenset({"a"}), "ids must be strings"),
])
def test_normalize_key_names_what_cannot_be_an_id(value, fragment):
    key, err = normalize_key(value)
    assert key is None and fragment in err


def test_normalize_key_keeps_tuple_items_types_and_the_depth_limit():
    key, _ = normalize_key(("a", True))
    assert type(key[1]) is int
    # The flat tuple innermost in the deepest allowed nesting is an id; one level more is not.
    value = ("a", 1)
    for _ in range(_MAX_DEPTH - 1):
        value = (value,)
    assert normalize_key(value) == (value, None)
    key, err = normalize_key((value,))
    assert key is None and "nested deeper" in err


def test_pandas_missing_values_are_not_ids():
    pd = pytest.importorskip("pandas")
    # A missing string read from CSV is float NaN; pandas' own markers are NA and NaT.
    frame = pd.read_csv(io.StringIO("origin,n\nEWR,1\n,2\n"))
    missing = frame.origin.iloc[1]
    assert isinstance(missing, float)
    for value in (missing, pd.NA, pd.NaT):
        key, err = normalize_key(value)
        assert key is None and ("NaN" in err or "missing" in err or "datetime" in err), value


def test_stream_key_coder_is_deterministic_and_round_trips():
    coder = StreamKeyCoder()
    for value in ("AA", "", "é\ud800", 0, -1, 2 ** 70, -(2 ** 70), 0.25, -1e300, None, b"\x00",
                  ("a", (1, (2.5, None)), b"")):
        encoded = coder.encode(value)
        assert coder.decode(encoded) == value and type(coder.decode(encoded)) is type(value)
    # Different values never share an encoding, whatever Python's equality says.
    encodings = {coder.encode(v) for v in ("1", 1, 1.5, b"1", ("1",), (1,))}
    assert len(encodings) == 6
    assert coder.is_deterministic()
    with pytest.raises(TypeError, match="normalised"):
        coder.encode(["a"])
    # The transforms' keyed element type selects it.
    kv_coder = registry.get_coder(convert_to_beam_type(KV))
    assert kv_coder.is_kv_coder() and isinstance(kv_coder.key_coder(), StreamKeyCoder)


def _count(keys=("AA",), **kw):
    return dpb.ContinualCount(epsilon=1.0, step=STEP, start=0, end=END, key_fn=lambda e: e["k"],
                              keys=list(keys) if isinstance(keys, (tuple, list)) else keys,
                              timestamp_fn=lambda e: e["ts"], rng=ZeroNoise(), **kw)


def _collect(options, source, transform):
    def build(p):
        res = p | source | transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(options, build)


def _stream(events):
    stream = _TestStream()
    for e in events:
        stream = stream.add_elements([TimestampedValue(e, e["ts"])])
    return stream.advance_watermark_to_infinity()


def _nan_events():
    # Missing strings from pandas arrive as float NaN: 10 events with key NaN in hours 0-3.
    return [{"ts": STEP * (i % 4) + i, "k": float("nan"), "u": i} for i in range(10)]


@pytest.mark.parametrize("keys", ["declared", "private"])
@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_regression_nan_key_goes_to_invalid_and_corrupts_nothing(keys, mode):
    # Formerly, on FnApiRunner: only the last hour released, published 4 times, 6 of 10
    # events gone with nothing in .invalid, 4 ledger entries for key nan.
    good = [{"ts": STEP * (i % 4) + 100 + i, "k": "AA", "u": 100 + i} for i in range(8)]
    events = _nan_events() + good
    key_set = ["AA"] if keys == "declared" else dpb.PrivateKeys(epsilon=5.0, delta=0.5)
    source = beam.Create(events) if mode == "batch" else _stream(events)
    out = _collect(batch_options() if mode == "batch" else streaming_options(), source,
                   _count(key_set))
    nan_dead = [i for i in out["invalid"] if "NaN" in i.reason]
    assert sum(i.count for i in nan_dead) == 10
    assert all(i.reason == "key_fn returned NaN (a missing value, not an id)" for i in nan_dead)
    streams = [r for r in out["releases"] if not isinstance(r, dpb.records.KeyAdmitted)]
    # Every released (key, step) once, and no stream or ledger entry for a NaN key.
    assert len({(r.key, r.step) for r in streams}) == len(streams)
    assert all(isinstance(r.key, str) for r in streams)
    assert all(e.key is None or isinstance(e.key, str) for e in out["accounting"])
    used = max((r.value for r in streams), default=0.0)
    assert used + sum(i.count for i in out["invalid"]) == len(events)
    if keys == "declared":
        assert sorted(r.step for r in streams) == [0, 1, 2, 3] and used == len(good)


def test_regression_nan_user_goes_to_invalid():
    events = [{"ts": 10.0 + i, "k": "AA", "u": float("nan") if i % 2 else "ok"} for i in range(6)]
    out = _collect(batch_options(), beam.Create(events),
                   _count(privacy_unit="user", user_fn=lambda e: e["u"], max_contributions=10))
    (dead,) = {i.reason for i in out["invalid"]}
    assert dead == "user_fn returned NaN (a missing value, not an id)"
    assert sum(i.count for i in out["invalid"]) == 3
    assert max(r.value for r in out["releases"]) == 3.0


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_regression_numpy_and_python_keys_are_one_stream(mode):
    # Formerly numpy.str_("AA") and "AA" made two streams published under one key
    # (streaming) or crashed the batch job ("Unable to deterministically encode").
    events = [{"ts": STEP * (i % 4) + i, "k": np.str_("AA") if i % 2 else "AA",
               "u": np.int64(i % 3) if i % 2 else i % 3} for i in range(12)]
    for keys in (["AA"], dpb.PrivateKeys(epsilon=5.0, delta=0.5)):
        source = beam.Create(events) if mode == "batch" else _stream(events)
        out = _collect(batch_options() if mode == "batch" else streaming_options(), source,
                       _count(keys, privacy_unit="user", user_fn=lambda e: e["u"],
                              max_contributions=4))
        counts = [r for r in out["releases"] if not isinstance(r, dpb.records.KeyAdmitted)]
        assert {type(r.key) for r in counts} <= {str}
        assert len({(r.key, r.step) for r in counts}) == len(counts)
        if isinstance(keys, list):
            assert sorted(r.step for r in counts) == [0, 1, 2, 3]
            # Users 0, 1, 2 as ints and numpy ints are three users of 4 events each:
            # nothing over the cap.
            assert counts and max(r.value for r in counts) == 12.0
            assert out["invalid"] == []


def test_numpy_keys_declared_as_numpy_values_and_pcollection_keys_are_normalised():
    events = [{"ts": 5.0, "k": 1}, {"ts": 6.0, "k": np.int32(1)}, {"ts": 7.0, "k": 1.0},
              {"ts": 8.0, "k": "b"}]

    def build(p):
        keys = p | "keys" >> beam.Create([np.str_("b"), float("nan"), ["x"]])
        res = (p | "events" >> beam.Create(events)
               | "count" >> _count([np.int64(1), "b"]))
        res2 = (p | "events2" >> beam.Create(events)
                | "count2" >> _count(keys))
        return {"a": res.releases, "b": res2.releases, "inv_b": res2.invalid}
    out = collect(batch_options(), build)
    final = {r.key: r.value for r in out["a"] if r.step == 3}
    assert final == {1: 3.0, "b": 1.0}
    # From a PCollection of keys: numpy.str_ "b" is "b"; NaN and a list open no stream.
    assert {r.key for r in out["b"]} == {"b"}
    assert sum(i.count for i in out["inv_b"]) == 3


@pytest.mark.parametrize("bad_key", [["x"], {"x": 1}, {"x"}])
def test_unhashable_keys_and_users_go_to_invalid_in_every_transform(bad_key):
    events = [{"ts": 5.0, "k": bad_key, "u": "a", "v": 0.5, "x": [0.1, 0.2], "y": 0},
              {"ts": 6.0, "k": "a", "u": bad_key, "v": 0.5, "x": [0.1, 0.2], "y": 0}]
    common = dict(start=0, end=10, timestamp_fn=lambda e: e["ts"], key_fn=lambda e: e["k"],
                  keys=["a"], rng=ZeroNoise())
    transforms = {
        "count": dpb.ContinualCount(epsilon=1.0, step=10, privacy_unit="user",
                                    user_fn=lambda e: e["u"], max_contributions=2, **common),
        "mean": dpb.ContinualMean(user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0,
                                  upper=1, max_samples_per_user=2, epsilon=1.0, step=10,
                                  **common),
        "erm": dpb.ContinualERM(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"],
                                classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1,
                                epsilon=1.0, block_size=2, base_size=2, step=10, **common),
    }

    def build(p):
        events_pc = p | beam.Create(events)
        return {name: (events_pc | name >> t).invalid for name, t in transforms.items()}
    out = collect(batch_options(), build)
    kind = type(bad_key).__name__
    both = [f"key_fn returned an unhashable {kind}", f"user_fn returned an unhashable {kind}"]
    assert sorted(i.reason for i in out["count"]) == both
    assert sorted(i.reason for i in out["mean"]) == both
    (erm_dead,) = out["erm"]   # ERM has no users: only the bad key
    assert erm_dead.reason == f"key_fn returned an unhashable {kind}"


def test_no_key_coder_warning_for_stateful_stages(caplog):
    # Runners that encode state keys (Dataflow, Flink) need a deterministic key coder;
    # Beam warned "Key coder FastPrimitivesCoder ... may not be deterministic" per transform.
    caplog.set_level(logging.WARNING, logger="apache_beam.transforms.core")
    user = dict(privacy_unit="user", user_fn=lambda e: e["u"], max_contributions=2)
    p = beam.Pipeline(options=batch_options())
    events = p | beam.Create([{"ts": 1.0, "k": "AA", "u": "x", "v": 0.5}])
    _ = events | "count" >> _count()
    _ = events | "user count" >> _count(**user)
    _ = events | "selected" >> _count(dpb.PrivateKeys(epsilon=1.0, delta=1e-6), **user)
    _ = events | "mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=2, epsilon=1.0, step=STEP, start=0, end=END, rng=ZeroNoise())
    stream = p | _TestStream().advance_watermark_to_infinity()
    _ = stream | "streaming mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=2, epsilon=1.0, step=STEP, start=0, end=END, rng=ZeroNoise())
    # Construction alone (what `dp-beam plan` does) applies every ParDo.
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "may not be deterministic" in m], messages
