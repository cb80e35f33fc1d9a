"""Batch (FnApiRunner) tests of ContinualCount / ContinualSum."""

import math
import random

import apache_beam as beam
import numpy as np
import pytest

import dp_beam as dpb
from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
from tests.beam_util import batch_options, collect

STEP = 10.0


def _events():
    # Steps 0..9 with events in 0, 1, 2, 5, 6, 8, 9 and none in 3, 4, 7; shuffled
    # so that the runner sees them out of order.
    counts = {0: 3, 1: 1, 2: 4, 5: 2, 6: 5, 8: 1, 9: 2}
    events = []
    for step, n in counts.items():
        for i in range(n):
            events.append({"ts": step * STEP + i, "delay": float(step * 10 - 20 + i),
                           "carrier": "AA" if i % 2 == 0 else "UA", "user": f"u{i}"})
    random.Random(7).shuffle(events)
    return counts, events


def _run(transform, events):
    def build(p):
        res = p | beam.Create(events, reshuffle=False) | "t" >> transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(batch_options(), build)


@pytest.mark.parametrize("mechanism, noise", [
    ("tree", "laplace"), ("honaker", "laplace"), ("smooth_binary", "laplace"),
    ("blt", "gaussian"), ("sqrt_toeplitz", "gaussian"), (None, "laplace")])
def test_count_releases_every_step_in_order_with_exact_prefix_sums(mechanism, noise):
    counts, events = _events()
    delta = 1e-6 if noise == "gaussian" else None
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  mechanism=mechanism, noise=noise, delta=delta,
                                  rng=ZeroNoise()), events)
    releases = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in releases] == list(range(10))  # empty steps 3, 4, 7 included
    assert [r.t for r in releases] == list(range(1, 11))
    expected = np.cumsum([counts.get(s, 0) for s in range(10)])
    assert [r.value for r in releases] == pytest.approx(expected.tolist(), abs=1e-9)
    for r in releases:
        assert r.window_start == r.step * STEP and r.window_end == (r.step + 1) * STEP
        assert r.mechanism == (mechanism or "tree") and r.transform == "t"
    assert out["invalid"] == []


def test_release_noise_std_matches_the_mechanism_and_seeded_runs_repeat():
    _, events = _events()
    make = lambda: dpb.ContinualCount(epsilon=0.5, step=STEP, timestamp_fn=lambda e: e["ts"],
                                      rng=123)
    first = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    second = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    assert [r.value for r in first] == [r.value for r in second]
    # The default for Laplace noise and no horizon is the tree.
    assert {r.mechanism for r in first} == {"tree"}
    ref = BinaryTreeMechanism(epsilon=0.5, sensitivity=1.0, rng=ZeroNoise())
    for r in first:
        assert r.noise_std == pytest.approx(ref.noise_std(r.t))
        assert r.ci95 == pytest.approx(ref.ci_halfwidth(r.t))
        assert r.ci95 > 0


def test_keyed_streams_share_the_global_last_step_and_charge_in_parallel():
    counts, events = _events()
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  key_fn=lambda e: e["carrier"], rng=ZeroNoise()), events)
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert set(by_key) == {"AA", "UA"}
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r.step)
        truth = {}
        for e in events:
            if e["carrier"] == key:
                s = int(e["ts"] // STEP)
                truth[s] = truth.get(s, 0) + 1
        first = min(truth)
        assert [r.step for r in rs] == list(range(first, 10))
        assert [r.value for r in rs] == pytest.approx(
            np.cumsum([truth.get(s, 0) for s in range(first, 10)]).tolist())
    assert sorted(e.key for e in out["accounting"]) == ["AA", "UA"]
    assert all(e.scope == "key" and e.epsilon == 1.0 for e in out["accounting"])


def test_sum_clamps_and_routes_bad_values_to_invalid():
    _, events = _events()
    bad = [
        {"ts": 1.0},                              # missing field
        {"ts": 2.0, "delay": float("nan")},
        {"ts": 3.0, "delay": float("inf")},
        {"ts": 4.0, "delay": -float("inf")},
        {"ts": 5.0, "delay": "12"},               # wrong type
        {"ts": 6.0, "delay": None},
        {"ts": 7.0, "delay": True},               # a bool is not a measurement
        {"ts": float("nan"), "delay": 1.0},        # bad event time
        {"delay": 1.0},                            # no event time at all
    ]
    lower, upper = -5.0, 30.0
    out = _run(dpb.ContinualSum(value_fn=lambda e: e["delay"], lower=lower, upper=upper,
                                epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                rng=ZeroNoise()), events + bad)
    invalid = out["invalid"]
    assert len(invalid) == len(bad)
    reasons = " | ".join(sorted(i.reason for i in invalid))
    for fragment in ("KeyError", "NaN", "infinite", "not a real number", "event time"):
        assert fragment in reasons
    used = len(events)
    assert used + sum(i.count for i in invalid) == len(events) + len(bad)
    releases = sorted(out["releases"], key=lambda r: r.step)
    per_step = {}
    for e in events:
        s = int(e["ts"] // STEP)
        per_step[s] = per_step.get(s, 0.0) + min(max(e["delay"], lower), upper)
    assert [r.value for r in releases] == pytest.approx(
        np.cumsum([per_step.get(s, 0.0) for s in range(10)]).tolist())
    (entry,) = out["accounting"]
    assert entry.sensitivity == 30.0  # max(|lower|, |upper|) under add/remove of an event


def test_user_level_bounds_contributions_across_keys():
    events = [{"ts": float(i), "user": "heavy", "carrier": "AA" if i % 2 else "UA"}
              for i in range(6)]
    events += [{"ts": 12.0, "user": "light", "carrier": "AA"}]
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  key_fn=lambda e: e["carrier"], privacy_unit="user",
                                  user_fn=lambda e: e["user"], max_contributions=2,
                                  rng=ZeroNoise()), events)
    over = [i for i in out["invalid"] if "max_contributions" in i.reason]
    assert len(over) == 4
    final = {}
    for r in out["releases"]:
        if r.step == 1:
            final[r.key] = r.value
    assert sum(final.values()) == pytest.approx(3.0)  # 2 kept of heavy + 1 light
    for entry in out["accounting"]:
        assert entry.unit == "user" and entry.sensitivity == 2.0
        assert "at most 2" in entry.neighbours


def test_events_without_timestamps_use_beam_timestamps():
    events = [beam.window.TimestampedValue({"x": 1}, t) for t in (1.0, 25.0, 26.0)]
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, rng=ZeroNoise()), events)
    assert [(r.step, r.value) for r in sorted(out["releases"], key=lambda r: r.step)] == [
        (0, 1.0), (1, 1.0), (2, 3.0)]


def test_horizon_stops_releases_and_routes_later_steps_to_invalid():
    _, events = _events()
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  horizon=4, rng=ZeroNoise()), events)
    assert sorted(r.step for r in out["releases"]) == [0, 1, 2, 3]
    beyond = [i for i in out["invalid"] if "horizon" in i.reason]
    assert sum(i.count for i in beyond) == sum(1 for e in events if e["ts"] >= 4 * STEP)


@pytest.mark.parametrize("kwargs, name", [
    (dict(epsilon=-1.0, step=10), "epsilon"),
    (dict(epsilon=1.0, step=0), "step"),
    (dict(epsilon=1.0, step=10, privacy_unit="user"), "user_fn"),
    (dict(epsilon=1.0, step=10, privacy_unit="user", user_fn=str, max_contributions=0),
     "max_contributions"),
    (dict(epsilon=1.0, step=10, privacy_unit="row"), "privacy_unit"),
    (dict(epsilon=1.0, step=10, late="keep"), "late"),
    (dict(epsilon=1.0, step=10, noise="gaussian"), "delta"),
    (dict(epsilon=1.0, step=10, mechanism="magic"), "mechanism"),
    (dict(epsilon=1.0, step=10, rng=1.5), "rng"),
    (dict(epsilon=1.0, step=10, key_fn=3), "key_fn"),
])
def test_configuration_errors_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpb.ContinualCount(**kwargs)


def test_sum_bounds_are_checked():
    with pytest.raises(ValueError, match="lower"):
        dpb.ContinualSum(value_fn=float, lower=5, upper=1, epsilon=1.0, step=10)
    with pytest.raises(ValueError, match="upper"):
        dpb.ContinualSum(value_fn=float, lower=0, upper=math.inf, epsilon=1.0, step=10)
