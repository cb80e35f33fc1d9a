"""Tests of IncrementalRegression: batch (FnApiRunner) against the engine-free mechanisms,
keys, bad input, the ledger, construction errors, and streaming (TestStream on
BundleBasedDirectRunner)."""

import math

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_stream

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.regression import (L1Ball, L2Ball, PrivIncERM, PrivIncReg1,
                                           PrivIncReg1Params, PrivIncReg2)
from dp_beam.records import InvalidElement, LedgerEntry
from dp_beam.records_regression import RegressionRecord
from tests.beam_util import batch_options, collect, global_and_windowed, streaming_options

STEP = 10.0
TEST_SEED = 0   # a test seed: SeededNoise, not private
D = 3
THETA = np.array([0.5, -0.4, 0.2])
COMMON = dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], dim=D, epsilon=1.0,
              delta=1e-6, step=STEP, start=0.0, end=80.0, timestamp_fn=lambda e: e["ts"])


def _events(n=120, seed=0, keys=("k",)):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=D)
        x *= rng.uniform(0.2, 0.95) / np.linalg.norm(x)   # inside the unit ball: nothing clipped
        y = float(np.clip(x @ THETA + 0.05 * rng.normal(), -1, 1))
        out.append({"ts": 0.5 + i * 79.0 / n, "x": [float(v) for v in x], "y": y,
                    "key": keys[i % len(keys)]})
    return out


def _run(transform, events, options=None, stream=None):
    def build(p):
        source = p | (stream if stream is not None else beam.Create(events, reshuffle=False))
        res = source | "reg" >> transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(options or batch_options(), build)


def _per_step(events, end_step=8):
    steps = [[] for _ in range(end_step)]
    for e in events:
        steps[int(e["ts"] // STEP)].append(e)
    return steps


def _reference(mech, events, end_step=8):
    out = []
    for step in _per_step(events, end_step):
        X = np.array([e["x"] for e in step]).reshape(-1, D)
        out.append(mech.step_points(X, [e["y"] for e in step]))
    return out


@pytest.mark.parametrize("method", ["tree", "projection", "batch"])
def test_batch_pipeline_matches_the_engine_free_mechanism(method):
    events = _events()
    kwargs = dict(method=method, rng=ZeroNoise(), constraint=L2Ball(1.0))
    if method == "projection":
        kwargs.update(projection_dim=2, noise_key=dpb.NoiseKey.from_bytes(bytes(32)))
    if method == "batch":
        kwargs.update(tau=2)
    transform = dpb.IncrementalRegression(**COMMON, **kwargs)
    out = _run(transform, events)
    releases = sorted(out["releases"], key=lambda r: r.step)
    if method == "tree":
        mech = PrivIncReg1(transform.params, rng=ZeroNoise())
    elif method == "projection":
        mech = PrivIncReg2(transform.params, rng=ZeroNoise(), projection=transform.projection)
    else:
        mech = PrivIncERM(transform.params, rng=ZeroNoise())
    expected = _reference(mech, events)
    assert [r.step for r in releases] == list(range(8))
    for got, want in zip(releases, expected):
        assert isinstance(got, RegressionRecord)
        assert got.t == want.t and got.n == want.n
        np.testing.assert_allclose(got.theta, want.theta, atol=1e-9)
        assert got.constraint == "l2_ball(1)" and got.method == want.method
        assert got.noise_std_gram == pytest.approx(want.noise_std_gram)
        assert got.window_start == got.step * STEP and got.window_end == (got.step + 1) * STEP
    assert releases[-1].n == len(events) and out["invalid"] == []
    if method != "batch":
        assert releases[-1].covers == (0, 7)
    if method == "tree":
        np.testing.assert_allclose(releases[-1].theta, THETA, atol=0.05)   # no noise: near OLS
    if method == "batch":
        assert [r.covers for r in releases[:3]] == [None, (0, 1), (0, 1)]
    (entry,) = out["accounting"]
    assert isinstance(entry, LedgerEntry) and entry.relation == "replace" and entry.unit == "event"
    assert "replace one event" in entry.neighbours
    cost = mech.privacy_cost()
    assert entry.epsilon == pytest.approx(cost["epsilon"]) and entry.delta == pytest.approx(cost["delta"])


def test_seeded_runs_repeat_noise_is_present_and_models_stay_in_the_constraint():
    events = _events()
    make = lambda: dpb.IncrementalRegression(**COMMON, constraint=L1Ball(0.8), rng=7)  # noqa: E731
    first = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    second = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    quiet = sorted(_run(dpb.IncrementalRegression(**COMMON, constraint=L1Ball(0.8), rng=ZeroNoise()),
                        events)["releases"], key=lambda r: r.step)
    assert [r.theta for r in first] == [r.theta for r in second]
    assert any(not np.allclose(a.theta, b.theta) for a, b in zip(first, quiet))
    assert all(sum(abs(v) for v in r.theta) <= 0.8 + 1e-9 for r in first)
    assert all(r.noise_std_gram > 0 and r.alpha > 0 for r in first)


def test_keyed_streams_are_independent_and_each_charges_the_ledger():
    events = _events(keys=("a", "b"))
    out = _run(dpb.IncrementalRegression(**COMMON, key_fn=lambda e: e["key"], keys=["a", "b", "c"],
                                         rng=ZeroNoise()), events)
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert set(by_key) == {"a", "b", "c"} and all(len(v) == 8 for v in by_key.values())
    for key in ("a", "b"):
        mine = [e for e in events if e["key"] == key]
        mech = PrivIncReg1(PrivIncReg1Params(dim=D, epsilon=1.0, delta=1e-6, horizon=8), rng=ZeroNoise())
        for got, want in zip(sorted(by_key[key], key=lambda r: r.step), _reference(mech, mine)):
            np.testing.assert_allclose(got.theta, want.theta, atol=1e-9)
    assert all(not any(r.theta) for r in by_key["c"])          # no data: θ = Π_C(0)
    assert sorted(e.key for e in out["accounting"]) == ["a", "b", "c"]
    assert all(e.scope == "key" for e in out["accounting"])


def test_bad_elements_go_to_invalid_with_reasons_and_counts_add_up():
    good = _events(20)
    bad = [
        {"ts": 5.0, "x": [0.1, 0.2], "y": 0.1},                         # wrong length
        {"ts": 5.0, "x": [0.1, float("nan"), 0.2], "y": 0.1},           # NaN feature
        {"ts": 5.0, "x": [0.1, 0.2, 0.3], "y": "high"},                 # label not a number
        {"ts": 5.0, "x": 7, "y": 0.1},                                  # not a sequence
        {"ts": 95.0, "x": [0.1, 0.2, 0.3], "y": 0.1},                   # after end
        {"ts": -5.0, "x": [0.1, 0.2, 0.3], "y": 0.1},                   # before start
        {"ts": 5.0, "y": 0.1},                                          # features_fn raises
    ]
    clipped = [{"ts": 6.0, "x": [30.0, 40.0, 0.0], "y": 9.0}]          # clipped, used
    out = _run(dpb.IncrementalRegression(**COMMON, rng=ZeroNoise()), good + bad + clipped)
    reasons = sorted(r.reason for r in out["invalid"])
    assert all(isinstance(r, InvalidElement) for r in out["invalid"])
    assert len(reasons) == len(bad)
    text = " | ".join(reasons)
    for fragment in ("returned 2 values", "NaN", "label not a real number", "not a sequence",
                     "at or after end", "before start", "features_fn raised KeyError"):
        assert fragment in text, fragment
    last = max(out["releases"], key=lambda r: r.step)
    assert last.n == len(good) + len(clipped)
    # The clipped point entered as x = (0.6, 0.8, 0), y = 1.
    mech = PrivIncReg1(PrivIncReg1Params(dim=D, epsilon=1.0, delta=1e-6, horizon=8), rng=ZeroNoise())
    ref = _reference(mech, good + [{"ts": 6.0, "x": [0.6, 0.8, 0.0], "y": 1.0}])
    np.testing.assert_allclose(last.theta, ref[-1].theta, atol=1e-9)


def test_construction_errors_name_the_parameter():
    base = dict(COMMON)
    for change, name in ((dict(dim=0), "dim"), (dict(epsilon=0.0), "epsilon"),
                         (dict(delta=None), "delta"), (dict(method="ols"), "method"),
                         (dict(constraint="l2"), "constraint"), (dict(start=None), "start"),
                         (dict(counter="x"), "counter"), (dict(solver="x"), "solver"),
                         (dict(features_fn=3), "features_fn"), (dict(step=0), "step"),
                         (dict(method="batch", end=None), "end")):
        with pytest.raises(ValueError, match=name):
            dpb.IncrementalRegression(**{**base, **change})
    with pytest.raises(ValueError, match="PrivateKeys"):
        dpb.IncrementalRegression(**base, key_fn=lambda e: e["key"],
                                  keys=dpb.PrivateKeys(epsilon=1.0, delta=1e-6))
    with pytest.raises(ValueError, match="keys"):
        dpb.IncrementalRegression(**base, key_fn=lambda e: e["key"])


def test_the_first_invalid_parameter_in_check_order_is_named():
    base = dict(COMMON)
    # The user functions come first, then the method, the schedule and the method's parameters.
    for change, name in ((dict(features_fn=3, label_fn=3), "features_fn"),
                         (dict(label_fn=3, method="ols"), "label_fn"),
                         (dict(timestamp_fn=3, method="ols"), "timestamp_fn"),
                         (dict(method="ols", step=0), "method"),
                         (dict(step=0, dim=0), "step"),
                         (dict(method="batch", end=None, tau=0), "end is required")):
        with pytest.raises(ValueError, match=name):
            dpb.IncrementalRegression(**{**base, **change})


def test_each_method_plans_its_own_parameters():
    tree = dpb.IncrementalRegression(**COMMON)
    assert type(tree._params).__name__ == "PrivIncReg1Params" and tree.projection is None
    batch = dpb.IncrementalRegression(**COMMON, method="batch", tau=2, lam=0.1)
    assert type(batch._params).__name__ == "PrivIncERMParams"
    projection = dpb.IncrementalRegression(**COMMON, method="projection", projection_dim=2, rng=5)
    assert type(projection._params).__name__ == "PrivIncReg2Params"
    assert projection.projection.shape == (2, D)


def test_projection_is_public_reproducible_from_the_seed_and_drawn_at_construction():
    a = dpb.IncrementalRegression(**COMMON, method="projection", projection_dim=2, rng=5)
    b = dpb.IncrementalRegression(**COMMON, method="projection", projection_dim=2, rng=5)
    key = dpb.NoiseKey.from_bytes(bytes(range(32)))
    c = dpb.IncrementalRegression(**COMMON, method="projection", projection_dim=2, noise_key=key)
    d = dpb.IncrementalRegression(**COMMON, method="projection", projection_dim=2, noise_key=key)
    assert a.projection.shape == (2, D)
    np.testing.assert_array_equal(a.projection, b.projection)
    np.testing.assert_array_equal(c.projection, d.projection)
    assert dpb.IncrementalRegression(**COMMON).projection is None


def _stream(events):
    stream = test_stream.TestStream().advance_watermark_to(0)
    for e in sorted(events, key=lambda e: e["ts"]):
        stream = stream.add_elements([beam.window.TimestampedValue(e, e["ts"])])
        stream = stream.advance_watermark_to(e["ts"] + 1.0)
    return stream.advance_watermark_to_infinity()


def test_streaming_test_stream_releases_every_step_like_batch():
    events = _events(40)
    make = lambda: dpb.IncrementalRegression(**COMMON, rng=ZeroNoise())  # noqa: E731
    streamed = _run(make(), None, streaming_options(), _stream(events))
    batch = _run(make(), events)
    s = sorted(streamed["releases"], key=lambda r: r.step)
    b = sorted(batch["releases"], key=lambda r: r.step)
    assert [r.step for r in s] == list(range(8))
    for x, y in zip(s, b):
        assert x.n == y.n
        np.testing.assert_allclose(x.theta, y.theta, atol=1e-9)
    assert len(streamed["accounting"]) == 1 and streamed["invalid"] == []


def test_state_per_stream_is_the_counters_only():
    # BLT: at most (2·5 + 1) numbers per coordinate of the two sums (plus the running
    # roots of an unbounded stream), whatever the number of steps; no record is kept.
    mech = PrivIncReg1(PrivIncReg1Params(dim=D, epsilon=1.0, delta=1e-6, horizon=4096), rng=TEST_SEED)
    coords = D * (D + 1) // 2 + D
    for t in range(300):
        mech.push(np.full(D, 0.1), 0.2)
        assert mech.state_size() <= 11 * coords
    state = mech.to_state()
    assert set(state) == {"mechanism", "version", "params", "n", "moments"}
    assert math.isclose(mech.n, 300)


def test_input_in_fixed_windows_releases_what_global_input_releases():
    """The schedule decides the steps, not the input's windows (design D2.1)."""
    events = _events(60) + [{"ts": 5.0, "x": [float("nan"), 0.0, 0.0], "y": 0.0, "key": "k"}]
    plain, windowed = global_and_windowed(events, lambda e: e["ts"], STEP,
                                          lambda: dpb.IncrementalRegression(**COMMON, rng=7))
    assert len(plain[0]) == 8 and plain[1] and windowed == plain
