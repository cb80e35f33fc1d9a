"""Fuzzed input through every transform, batch and streaming: nothing crashes, nothing is lost.

A seeded generator (reproducible; ``FUZZ_SEED`` picks another draw) mixes good
events with malformed ones of every category the transforms must survive
(issue "nothing lost, nothing crashes"): NaN, infinities, ``None``, giant ints,
huge ``Fraction``/``Decimal`` values, strings, dicts, lists and sets as keys,
users, values, features, labels and ids, NumPy scalars, naive and aware
datetimes, pandas values, epoch milliseconds, times outside the schedule,
elements that are not records at all, and, in streaming, events late within
and beyond the allowed lateness. For every transform:

* the pipeline runs to the end (no element crashes it);
* input events = events used + Σ ``count`` over ``.invalid``, exactly;
* every dead letter has a reason and an id.

"Used" is read off the releases (noise off): each transform is configured so
that its releases count what it used (a count; a sum with ``lower == upper ==
1``; a mean with one sample per user, whose denominator counts the samples;
ERM streams with one point per block, whose last model's ``t`` counts points).
"""

import datetime
import decimal
import fractions
import os
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.records import KeyAdmitted
from tests.beam_util import batch_options, collect, streaming_options

SEED = int(os.environ.get("FUZZ_SEED", "20"))
STEP, STEPS = 10.0, 10
START, END = 1_000_000.0, 1_000_000.0 + STEPS * STEP     # epoch seconds, 1970-01-12
KEYS = ["A", "B"]
UTC = datetime.timezone.utc

pd = pytest.importorskip("pandas")


def _aware(seconds):
    return datetime.datetime.fromtimestamp(seconds, tz=UTC)


#: Malformed field values, by field; every category appears at least once per run.
BAD = {
    "ts": [float("nan"), float("inf"), -float("inf"), None, 10 ** 400, -(10 ** 400),
           fractions.Fraction(10 ** 400, 7), decimal.Decimal("1e400"), decimal.Decimal("NaN"),
           decimal.Decimal("sNaN"), "1000005", {"t": 1}, [START], {START}, True,
           datetime.datetime(1970, 1, 12, 13, 46, 45),                       # naive
           pd.Timestamp("1970-01-12T13:46:45"), pd.NaT, np.datetime64("NaT"),
           datetime.date(1970, 1, 12), (START + 5) * 1000, (START + 5) * 1e6,
           (START + 5) * 1e9, START - 1, END, END + 10 * 365 * 86400, -1e12, 1j],
    "key": [float("nan"), np.float64("nan"), None, ["A"], {"A": 1}, {"A"}, "Z", 10 ** 400,
            b"A", ("A", ["x"]), pd.NA, decimal.Decimal("NaN"), fractions.Fraction(10 ** 400),
            datetime.date(2013, 1, 1), object()],
    "user": [float("nan"), None, ["u"], {"u": 1}, {"u"}, decimal.Decimal("sNaN"), pd.NA,
             float("inf"), ("u", float("nan")), object()],
    "v": [float("nan"), float("inf"), -float("inf"), None, 10 ** 400, -(10 ** 400),
          fractions.Fraction(10 ** 400, 3), decimal.Decimal("-1e999"), decimal.Decimal("NaN"),
          "1.0", {"v": 1}, [1.0], True, np.bool_(False), 1j, object()],
    "x": [[float("nan"), 0.1], [10 ** 400, 0.1], [0.1], [0.1, 0.2, 0.3], "ab", None,
          {"a": 0.1, "b": 0.2}, [fractions.Fraction(10 ** 400), 0.0], [decimal.Decimal("NaN"), 0],
          [None, 0.1], 5, [[0.1], [0.2]]],
    "y": [float("nan"), None, [0], {0}, 2, "1", pd.NA],
    "id": [float("nan"), None, {"i": 1}, [1, {2}], fractions.Fraction(10 ** 400), object()],
}

#: Valid but unusual spellings: they must be accepted (normalised), not rejected.
ODD_GOOD = {
    "ts": [lambda ts: _aware(ts), lambda ts: pd.Timestamp(ts, unit="s", tz="UTC"),
           lambda ts: np.datetime64(int(ts * 1e6), "us"), lambda ts: np.float64(ts),
           lambda ts: decimal.Decimal(repr(ts)), lambda ts: fractions.Fraction(ts)],
    "key": [lambda k: np.str_(k)],
    "user": [lambda u: np.str_(u), lambda u: (u, 1), lambda u: u.encode()],
    "v": [lambda v: np.float32(v), lambda v: decimal.Decimal(1), lambda v: 10 ** 300,
          lambda v: fractions.Fraction(1)],
    "x": [lambda x: np.array(x), lambda x: tuple(x), lambda x: [np.float64(a) for a in x]],
    "y": [lambda y: np.int64(y), lambda y: bool(y)],
    "id": [lambda i: np.int64(i), lambda i: (str(i), i)],
}

NOT_RECORDS = [None, 0, "event", [1, 2], ("a", 1), float("nan"), b"\x00"]


def _good(rnd, i):
    ts = START + rnd.uniform(0, STEPS * STEP - 1e-3)
    return {"ts": ts, "key": rnd.choice(KEYS), "user": f"u{rnd.randrange(25)}", "v": 1.0,
            "x": [rnd.uniform(-1, 1), rnd.uniform(-1, 1)], "y": rnd.randrange(2), "id": i}


def fuzz_events(seed=SEED, good=150, extra_bad=60):
    """``good`` valid events, every malformed category once, ``extra_bad`` random ones more."""
    rnd = random.Random(seed)
    events = [_good(rnd, i) for i in range(good)]
    bad = []
    for field, values in BAD.items():
        for value in values:
            e = _good(rnd, len(events) + len(bad))
            e[field] = value
            bad.append(e)
    for field, makers in ODD_GOOD.items():
        for make in makers:
            e = _good(rnd, len(events) + len(bad))
            e[field] = make(e[field])
            bad.append(e)
    for i in range(extra_bad):
        e = _good(rnd, len(events) + len(bad))
        for field in rnd.sample(sorted(BAD), rnd.randint(1, 3)):
            e[field] = rnd.choice(BAD[field])
        bad.append(e)
    missing = _good(rnd, -1)
    del missing["ts"], missing["key"]
    bad += [missing] + list(NOT_RECORDS)
    events += bad
    rnd.shuffle(events)
    return events


def _schedule(**kw):
    return dict(step=STEP, start=START, end=END, timestamp_fn=lambda e: e["ts"],
                key_fn=lambda e: e["key"], keys=KEYS, allowed_lateness=15, rng=ZeroNoise(), **kw)


def _erm(**kw):
    return dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1),
                n_features=2, feature_bound=1.0, lam=0.5, epsilon=1.0, block_size=1,
                **_schedule(**kw))


def transforms():
    """Every transform, configured so that its releases count the events it used."""
    user = dict(privacy_unit="user", user_fn=lambda e: e["user"], max_contributions=3)
    return {
        "count": dpb.ContinualCount(epsilon=1.0, **_schedule()),
        "user count": dpb.ContinualCount(epsilon=1.0, **user, **_schedule()),
        "selected count": dpb.ContinualCount(epsilon=5.0, **user, **dict(
            _schedule(), keys=dpb.PrivateKeys(epsilon=5.0, delta=0.5))),
        "sum": dpb.ContinualSum(value_fn=lambda e: e["v"], lower=1, upper=1, epsilon=1.0,
                                **user, **_schedule()),
        "mean": dpb.ContinualMean(user_fn=lambda e: e["user"], value_fn=lambda e: e["v"],
                                  lower=0, upper=1, max_samples_per_user=1, epsilon=1.0,
                                  neighbours="values", max_keys_per_user=2, **_schedule()),
        "continual erm": dpb.ContinualERM(base_size=1, **_erm()),
        "sliding erm": dpb.SlidingWindowERM(window=1, **_erm(id_fn=lambda e: e["id"])),
        "multi-resolution erm": dpb.MultiResolutionERM(max_scale=2, **_erm()),
    }


def _used(records):
    """Events used, read off the releases of each stream's last step (noise off)."""
    last = {}
    for r in records:
        if isinstance(r, KeyAdmitted):
            continue
        if r.key not in last or (r.step, r.t) > (last[r.key].step, last[r.key].t):
            last[r.key] = r
    total = 0.0
    for r in last.values():
        if hasattr(r, "denominator"):
            total += r.denominator
        elif hasattr(r, "trained_on"):
            total += r.t
        else:
            total += r.value
    return total


def _check(out, names, n_input):
    for name in names:
        invalid = out[f"{name}/invalid"]
        used = _used(out[f"{name}/releases"])
        dead = sum(i.count for i in invalid)
        assert used + dead == n_input, (name, used, dead, n_input)
        assert used > 0, name
        for i in invalid:
            assert isinstance(i.reason, str) and i.reason, (name, i)
            assert isinstance(i.id, str) and len(i.id) == 32, (name, i)
            assert isinstance(i.count, int) and i.count >= 1, (name, i)


def _build(source):
    names = list(transforms())

    def build(p):
        events = p | source
        outs = {}
        for name, transform in transforms().items():
            res = events | name >> transform
            outs[f"{name}/releases"] = res.releases
            outs[f"{name}/invalid"] = res.invalid
        return outs
    return names, build


def test_fuzz_batch_nothing_crashes_and_every_event_is_accounted_for():
    events = fuzz_events()
    names, build = _build(beam.Create(events))
    out = collect(batch_options(), build)
    _check(out, names, len(events))
    # The malformed categories land in .invalid with their reasons.
    reasons = " | ".join(i.reason for i in out["count/invalid"])
    for fragment in ("NaN", "infinite", "too large", "naive datetime", "looks like epoch",
                     "unhashable", "undeclared key", "before start", "at or after end",
                     "timestamp_fn raised"):
        assert fragment in reasons, fragment


def _beam_time(e):
    ts = e.get("ts") if isinstance(e, dict) else None
    return ts if isinstance(ts, float) and START <= ts < END else START


def test_fuzz_streaming_with_late_events_nothing_crashes_and_every_event_is_accounted_for():
    rnd = random.Random(SEED + 1)
    events = fuzz_events(good=100, extra_bad=30)
    # Events arrive in three waves as the watermark advances; a fifth of them is held
    # back and arrives after the watermark passed their step (late within and beyond
    # the allowed lateness of 15 s).
    late = set(rnd.sample(range(len(events)), len(events) // 5))
    waves = [[], [], []]
    for i, e in enumerate(events):
        t = _beam_time(e)
        wave = 0 if t < START + 4 * STEP else 1 if t < START + 8 * STEP else 2
        waves[min(2, wave + 1) if i in late else wave].append(TimestampedValue(e, t))
    stream = _TestStream()
    for wave, mark in zip(waves, (START + 4 * STEP, START + 8 * STEP, END)):
        stream = stream.add_elements(wave).advance_watermark_to(mark)
    names, build = _build(stream.advance_watermark_to_infinity())
    out = collect(streaming_options(), build)
    _check(out, names, len(events))
    assert any("late" in i.reason for i in out["count/invalid"])
