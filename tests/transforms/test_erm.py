"""Batch (FnApiRunner) tests of ContinualERM / SlidingWindowERM / MultiResolutionERM."""

import math
import random

import apache_beam as beam
import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms import erm as mech
from dp_beam.records import InvalidElement, LedgerEntry
from dp_beam.records_erm import ModelRecord
from dp_beam.transforms.release import PLAN_ATTRIBUTE
from dp_beam.transforms.erm import ContinualERM, MultiResolutionERM, SlidingWindowERM
from tests.beam_util import batch_options, collect

STEP = 10.0
COMMON = dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=["a", "b"], n_features=2,
              feature_bound=2.0, lam=0.5, epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"])


def _points(n, seed=0, keys=("k",)):
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        x = rng.normal(size=2)
        x = x * min(1.0, 1.5 / np.linalg.norm(x))      # inside the bound: no clipping differences
        events.append({"ts": 1.0 + i * 1.7, "x": [float(v) for v in x], "y": "a" if x[0] + 0.3 * x[1] > 0 else "b",
                       "key": keys[i % len(keys)]})
    return events


def _run(transform, events):
    shuffled = list(events)
    random.Random(3).shuffle(shuffled)

    def build(p):
        res = p | beam.Create(shuffled, reshuffle=False) | "erm" >> transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(batch_options(), build)


def _reference(stream, events):
    ordered = sorted(events, key=lambda e: e["ts"])
    return stream.extend(np.array([e["x"] for e in ordered]), [e["y"] for e in ordered])


def test_continual_erm_matches_the_engine_free_stream_in_event_time_order():
    events = _points(40)
    out = _run(ContinualERM(block_size=4, base_size=8, rng=ZeroNoise(), **COMMON), events)
    releases = sorted(out["releases"], key=lambda r: r.t)
    expected = _reference(mech.ContinualERM(1.0, 4, 8, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), events)
    assert [r.t for r in releases] == [r.t for r in expected] == list(range(8, 41, 4))
    for got, want in zip(releases, expected):
        assert isinstance(got, ModelRecord)
        assert got.kind == want.kind and got.trained_on == want.trained_on
        assert got.depends_on == want.depends_on and got.data_window == want.window
        assert got.blocks == (want.trained_on[0] // 4, want.trained_on[1] // 4)
        np.testing.assert_allclose(got.weights, want.weights, rtol=0, atol=1e-12)
        assert got.intercept == pytest.approx(want.intercept, abs=1e-12)
        assert got.noise_std == pytest.approx(want.noise_std)
        # The step is the one in which the triggering (t-th) point arrived.
        ts = sorted(e["ts"] for e in events)[got.t - 1]
        assert got.window_start <= ts < got.window_end and got.step == int(ts // STEP)
    assert out["invalid"] == []
    (entry,) = out["accounting"]
    assert isinstance(entry, LedgerEntry)
    assert entry.epsilon == 1.0 and entry.delta == 0.0 and entry.mechanism == "erm_continual"
    assert entry.unit == "event" and "replace" in entry.neighbours


def test_seeded_runs_repeat_and_noise_is_present():
    events = _points(24)
    make = lambda: SlidingWindowERM(block_size=2, window=6, rng=11, **COMMON)  # noqa: E731
    first = sorted(_run(make(), events)["releases"], key=lambda r: r.t)
    second = sorted(_run(make(), events)["releases"], key=lambda r: r.t)
    assert [r.t for r in first] == list(range(6, 25, 2))
    assert [r.weights for r in first] == [r.weights for r in second]
    quiet = sorted(_run(SlidingWindowERM(block_size=2, window=6, rng=ZeroNoise(), **COMMON), events)["releases"],
                   key=lambda r: r.t)
    assert any(not np.allclose(a.weights, b.weights) for a, b in zip(first, quiet))
    for r in first:
        lo, hi = r.data_window
        assert hi == r.t and hi - lo == 6
        assert all(lo <= a and b <= hi for a, b in r.depends_on)


def test_keyed_streams_are_independent_and_each_charges_the_ledger():
    events = _points(32, keys=("x", "y"))
    out = _run(MultiResolutionERM(block_size=4, rng=ZeroNoise(), key_fn=lambda e: e["key"], **COMMON), events)
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert set(by_key) == {"x", "y"}
    for key, releases in by_key.items():
        mine = [e for e in events if e["key"] == key]
        expected = _reference(mech.MultiResolutionERM(1.0, 4, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), mine)
        got = sorted(releases, key=lambda r: (r.t, r.level))
        assert [(r.t, r.level) for r in got] == [(r.t, r.level) for r in expected]
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a.weights, b.weights, atol=1e-12)
    assert sorted(e.key for e in out["accounting"]) == ["x", "y"]
    assert all(e.scope == "key" for e in out["accounting"])


def test_invalid_elements_are_routed_with_reasons_and_counts_add_up():
    good = _points(8)
    bad = [
        {"ts": 3.0, "x": [1.0], "y": "a"},                       # wrong length
        {"ts": 3.0, "x": [float("nan"), 0.0], "y": "a"},         # NaN
        {"ts": 3.0, "x": [0.1, 0.2], "y": "zzz"},                # unknown label
        {"ts": 3.0, "y": "a"},                                   # missing features
        {"ts": float("inf"), "x": [0.1, 0.2], "y": "a"},         # bad event time
        {"ts": 3.0, "x": "ab", "y": "a"},                        # not numbers
    ]
    out = _run(ContinualERM(block_size=4, base_size=4, rng=ZeroNoise(), **COMMON), good + bad)
    assert len(out["invalid"]) == len(bad)
    assert all(isinstance(r, InvalidElement) for r in out["invalid"])
    reasons = " | ".join(r.reason for r in out["invalid"])
    for fragment in ("expected 2", "NaN", "not one of classes", "KeyError", "infinite", "not a real"):
        assert fragment in reasons
    used = max(r.t for r in out["releases"])
    assert used + sum(r.count for r in out["invalid"]) == len(good) + len(bad)


def test_features_are_clipped_and_the_plan_is_attached():
    events = [{"ts": 1.0 + i, "x": [30.0 * (i % 2) - 15.0, 4.0], "y": "a" if i % 2 else "b"} for i in range(8)]
    transform = ContinualERM(block_size=4, base_size=4, rng=ZeroNoise(), **COMMON)
    out = _run(transform, events)
    clipped = [{**e, "x": list(np.array(e["x"]) * 2.0 / np.linalg.norm(e["x"]))} for e in events]
    expected = _reference(mech.ContinualERM(1.0, 4, 4, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), clipped)
    got = sorted(out["releases"], key=lambda r: r.t)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-9)

    def build(p):
        res = p | beam.Create(events) | "erm" >> ContinualERM(block_size=4, base_size=4, **COMMON)
        assert getattr(res.accounting, PLAN_ATTRIBUTE)[0].epsilon == 1.0
        return {}
    collect(batch_options(), build)


@pytest.mark.parametrize("cls,kwargs,name", [
    (SlidingWindowERM, dict(block_size=4, window=16), "window"),
    (SlidingWindowERM, dict(block_size=4, window=12, window_policy="x"), "window_policy"),
    (ContinualERM, dict(block_size=4, base_size=6), "base_size"),
    (ContinualERM, dict(block_size=4, base_size=8, step=0), "step"),
    (ContinualERM, dict(block_size=4, base_size=8, epsilon=-1), "epsilon"),
    (ContinualERM, dict(block_size=4, base_size=8, features_fn=None), "features_fn"),
    (ContinualERM, dict(block_size=4, base_size=8, classes="ab"), "classes"),
    (MultiResolutionERM, dict(block_size=4, max_scale=-2), "max_scale"),
    (MultiResolutionERM, dict(block_size=4, noise="gaussian"), "delta"),
    (MultiResolutionERM, dict(block_size=4, rng=1.5), "rng"),
])
def test_configuration_errors_name_the_parameter(cls, kwargs, name):
    args = {**COMMON, **kwargs}
    with pytest.raises(ValueError, match=name):
        cls(**args)


def test_gaussian_option_reports_delta_and_rho():
    t = MultiResolutionERM(block_size=4, noise="gaussian", delta=1e-6, **COMMON)
    entry = t.plan_entry("m")
    assert entry.delta == 1e-6 and entry.rho > 0 and entry.noise == "gaussian"
    assert entry.sensitivity == pytest.approx(2 * math.sqrt(2.0**2 + 1) / 0.5)


def test_prediction_helper_accepts_transform_records():
    events = _points(16)
    out = _run(ContinualERM(block_size=8, base_size=8, rng=ZeroNoise(), **COMMON), events)
    last = max(out["releases"], key=lambda r: r.t)
    X = np.array([e["x"] for e in events])
    proba = mech.predict_proba(last, X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    labels = mech.predict(last, X)
    assert np.mean([a == e["y"] for a, e in zip(labels, events)]) > 0.8
