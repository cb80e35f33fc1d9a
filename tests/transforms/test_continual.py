"""Batch (FnApiRunner) tests of ContinualCount / ContinualSum."""

import math
import random
from fractions import Fraction

import apache_beam as beam
import numpy as np
import pytest

import dp_beam as dpb
from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise
from dp_beam.transforms import continual
from tests.beam_util import batch_options, collect, global_and_windowed

STEP = 10.0
# The public schedule of _events(): steps 0..9 (the first step not released is 10).
START, END = 0.0, 10 * STEP
SCHEDULE = dict(start=START, end=END)


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
                                  rng=ZeroNoise(), **SCHEDULE), events)
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
                                      rng=123, **SCHEDULE)
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


def test_keyed_streams_run_every_declared_key_on_the_public_schedule():
    # Formerly each key's stream started at that key's first event and all ended at the
    # input's last step with data. Key set and schedule are now public: every declared
    # key releases every step start..end-1 and charges its ledger entry, including a key
    # with no events ("DL"); an event of an undeclared key goes to .invalid.
    counts, events = _events()
    stray = {"ts": 12.0, "carrier": "B6", "user": "u9"}
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  key_fn=lambda e: e["carrier"], keys=["AA", "UA", "DL"],
                                  rng=ZeroNoise(), **SCHEDULE), events + [stray])
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert set(by_key) == {"AA", "UA", "DL"}
    for key, rs in by_key.items():
        rs.sort(key=lambda r: r.step)
        truth = {}
        for e in events:
            if e["carrier"] == key:
                s = int(e["ts"] // STEP)
                truth[s] = truth.get(s, 0) + 1
        assert [r.step for r in rs] == list(range(10))
        assert [r.t for r in rs] == list(range(1, 11))
        assert [r.value for r in rs] == pytest.approx(
            np.cumsum([truth.get(s, 0) for s in range(10)]).tolist())
    assert [r.value for r in by_key["DL"]] == [0.0] * 10
    assert sorted(e.key for e in out["accounting"]) == ["AA", "DL", "UA"]
    assert all(e.scope == "key" and e.epsilon == 1.0 for e in out["accounting"])
    (undeclared,) = out["invalid"]
    assert "undeclared key 'B6'" in undeclared.reason and undeclared.count == 1


def test_keys_may_be_a_bounded_pcollection():
    # The public key set may come from the pipeline (read as a side input); duplicates
    # are one key, and a declared key without events still has its stream.
    def build(p):
        keys = p | "keys" >> beam.Create(["AA", "UA", "UA"])
        events = p | "events" >> beam.Create([{"ts": 3.0, "carrier": "AA"},
                                              {"ts": 13.0, "carrier": "DL"}])
        res = events | "t" >> dpb.ContinualCount(
            epsilon=1.0, step=STEP, start=0, end=3 * STEP, timestamp_fn=lambda e: e["ts"],
            key_fn=lambda e: e["carrier"], keys=keys, rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(batch_options(), build)
    assert sorted((r.key, r.step, r.value) for r in out["releases"]) == [
        ("AA", 0, 1.0), ("AA", 1, 1.0), ("AA", 2, 1.0),
        ("UA", 0, 0.0), ("UA", 1, 0.0), ("UA", 2, 0.0)]
    assert sorted(e.key for e in out["accounting"]) == ["AA", "UA"]
    (undeclared,) = out["invalid"]
    assert "undeclared key 'DL'" in undeclared.reason


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
                                rng=ZeroNoise(), **SCHEDULE), events + bad)
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
    # max(|lower|, |upper|) under add/remove of an event, plus one step of the grid
    # sums are rounded to (2^(⌊log2 30⌋ − 20)).
    assert entry.sensitivity == 30.0 + 2.0 ** (4 - 20)


def test_user_level_bounds_contributions_across_keys():
    events = [{"ts": float(i), "user": "heavy", "carrier": "AA" if i % 2 else "UA"}
              for i in range(6)]
    events += [{"ts": 12.0, "user": "light", "carrier": "AA"}]
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  key_fn=lambda e: e["carrier"], keys=["AA", "UA"],
                                  privacy_unit="user", user_fn=lambda e: e["user"],
                                  max_contributions=2, start=0, end=2 * STEP,
                                  rng=ZeroNoise()), events)
    # The heavy user's 4 events over the cap, all in step 0: one dead letter standing for 4.
    (over,) = [i for i in out["invalid"] if "max_contributions" in i.reason]
    assert over.count == 4 and over.element["user"] == "heavy" and over.element["step"] == 0
    assert over.element["example"]["key"] in ("AA", "UA")
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
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, start=0, end=3 * STEP,
                                  rng=ZeroNoise()), events)
    assert [(r.step, r.value) for r in sorted(out["releases"], key=lambda r: r.step)] == [
        (0, 1.0), (1, 1.0), (2, 3.0)]


def test_horizon_without_end_ends_the_streams_after_horizon_steps():
    # With horizon and no end the public schedule ends at start + horizon, so the events
    # of later steps are rejected on arrival as outside the schedule (formerly they
    # reached the release stage and were rejected there as "beyond the horizon").
    _, events = _events()
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  start=START, horizon=4, rng=ZeroNoise()), events)
    assert sorted(r.step for r in out["releases"]) == [0, 1, 2, 3]
    beyond = [i for i in out["invalid"] if "at or after end" in i.reason]
    assert len(beyond) == len(out["invalid"])
    assert sum(i.count for i in beyond) == sum(1 for e in events if e["ts"] >= 4 * STEP)
    with pytest.raises(ValueError, match="horizon"):
        dpb.ContinualCount(epsilon=1.0, step=STEP, start=START, end=5 * STEP, horizon=4)


def test_schedule_is_public_start_and_end_bound_the_releases():
    # Events before start or at/after end go to .invalid; an end inside a step releases
    # that step; steps before the first event and after the last one are released.
    events = [{"ts": t} for t in (5.0, 19.0, 20.0, 33.0, 44.9, 45.0, 60.0)]
    out = _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                  start="1970-01-01T00:00:10Z", end=45.0, rng=ZeroNoise()),
               events)
    releases = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in releases] == [1, 2, 3, 4]   # end=45 releases step 4 = [40, 50)
    assert [r.t for r in releases] == [1, 2, 3, 4]
    assert [r.value for r in releases] == pytest.approx([1, 2, 3, 5])
    reasons = sorted(i.reason for i in out["invalid"])
    assert len(reasons) == 2
    assert "event time before start" in reasons[1]      # ts=5
    assert "event time at or after end" in reasons[0]   # ts=60
    (entry,) = out["accounting"]
    assert entry.key is None and entry.scope == "stream"


def test_a_stream_without_events_releases_every_step():
    out = _run(dpb.ContinualSum(value_fn=lambda e: e["delay"], lower=0, upper=1, epsilon=1.0,
                                step=STEP, timestamp_fn=lambda e: e["ts"], start=3 * STEP,
                                end=7 * STEP, rng=ZeroNoise()), [])
    releases = sorted(out["releases"], key=lambda r: r.step)
    assert [(r.step, r.t, r.value) for r in releases] == [(s, s - 2, 0.0) for s in range(3, 7)]
    assert len(out["accounting"]) == 1 and out["invalid"] == []


def test_bounded_input_needs_end_or_horizon():
    # A batch run without end would end where the data ends.
    with pytest.raises(ValueError, match="end"):
        _run(dpb.ContinualCount(epsilon=1.0, step=STEP, timestamp_fn=lambda e: e["ts"],
                                start=START, rng=ZeroNoise()), [{"ts": 1.0}])


@pytest.mark.parametrize("kwargs, name", [
    (dict(epsilon=-1.0, step=10, start=0), "epsilon"),
    (dict(epsilon=1.0, step=0, start=0), "step"),
    (dict(epsilon=1.0, step=10, start=0, privacy_unit="user"), "user_fn"),
    (dict(epsilon=1.0, step=10, start=0, privacy_unit="user", user_fn=str, max_contributions=0),
     "max_contributions"),
    (dict(epsilon=1.0, step=10, start=0, privacy_unit="row"), "privacy_unit"),
    (dict(epsilon=1.0, step=10, start=0, late="keep"), "late"),
    (dict(epsilon=1.0, step=10, start=0, noise="gaussian"), "delta"),
    (dict(epsilon=1.0, step=10, start=0, mechanism="magic"), "mechanism"),
    (dict(epsilon=1.0, step=10, start=0, rng=1.5), "rng"),
    (dict(epsilon=1.0, step=10, start=0, key_fn=3, keys=["a"]), "key_fn"),
    (dict(epsilon=1.0, step=10), "start"),
    (dict(epsilon=1.0, step=10, start="yesterday"), "start"),
    (dict(epsilon=1.0, step=10, start=50, end=50), "end"),
    (dict(epsilon=1.0, step=10, start=0, horizon=0), "horizon"),
    (dict(epsilon=1.0, step=10, start=0, key_fn=str), "keys"),
    (dict(epsilon=1.0, step=10, start=0, keys=["a"]), "key_fn"),
    (dict(epsilon=1.0, step=10, start=0, key_fn=str, keys="ab"), "keys"),
    (dict(epsilon=1.0, step=10, start=0, key_fn=str, keys=[]), "keys"),
])
def test_configuration_errors_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpb.ContinualCount(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    # The unit is checked before the mechanism, the mechanism before hot_key_fanout and
    # monotone, and those before the mechanism's own parameters.
    (dict(privacy_unit="row", mechanism="magic"), "privacy_unit"),
    (dict(user_fn=str, hot_key_fanout=0), "user_fn and max_contributions"),
    (dict(mechanism="magic", hot_key_fanout=0), "mechanism"),
    (dict(hot_key_fanout=True, monotone="yes"), "hot_key_fanout"),
    (dict(monotone="yes", epsilon=-1.0), "monotone"),
    (dict(hot_key_fanout=2, monotone=True, epsilon=-1.0), "epsilon"),
])
def test_the_first_invalid_parameter_in_check_order_is_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        dpb.ContinualCount(**{**dict(epsilon=1.0, step=10, start=0), **kwargs})


def test_monotone_sums_need_a_non_negative_lower_bound():
    with pytest.raises(ValueError, match="lower must be >= 0"):
        dpb.ContinualSum(value_fn=float, lower=-1, upper=1, epsilon=1.0, step=10, start=0,
                         monotone=True)
    dpb.ContinualSum(value_fn=float, lower=0, upper=1, epsilon=1.0, step=10, start=0,
                     monotone=True)


def test_user_contributions_scale_the_sensitivity_and_sums_add_one_grid_step():
    count = dpb.ContinualCount(epsilon=1.0, step=10, start=0, privacy_unit="user",
                               user_fn=str, max_contributions=3)
    assert count._sensitivity == 3.0 and count._grid_exponent is None
    total = dpb.ContinualSum(value_fn=float, lower=-2, upper=1, epsilon=1.0, step=10, start=0)
    assert total._grid_exponent is not None
    assert total._sensitivity == 2.0 + math.ldexp(1.0, total._grid_exponent)


def test_max_idle_steps_is_no_longer_accepted():
    # The data-driven pause it configured is gone: streams release every step.
    with pytest.raises(TypeError, match="max_idle_steps"):
        dpb.ContinualCount(epsilon=1.0, step=10, start=0, max_idle_steps=2)


def test_sum_bounds_are_checked():
    with pytest.raises(ValueError, match="lower"):
        dpb.ContinualSum(value_fn=float, lower=5, upper=1, epsilon=1.0, step=10, start=0)
    with pytest.raises(ValueError, match="upper"):
        dpb.ContinualSum(value_fn=float, lower=0, upper=math.inf, epsilon=1.0, step=10, start=0)


def test_a_step_total_that_overflows_does_not_crash_the_release():
    """Twenty events of 1e307 sum to inf in float; the release clamps the total instead."""
    events = [{"ts": 1.0 + i / 4, "v": 1e307} for i in range(20)]
    total = dpb.ContinualSum(value_fn=lambda e: e["v"], lower=0, upper=1e307, epsilon=1.0,
                             step=10, start=0, end=20, timestamp_fn=lambda e: e["ts"],
                             rng=ZeroNoise())
    out = collect(batch_options(), lambda p: {"r": (p | beam.Create(events) | total).releases})
    # Clamped to 1e308, then rounded to the sum's grid (2^(1019 − 20) for a bound of 1e307).
    clamped = continual.round_total(continual.MAX_STEP_TOTAL, continual.total_grid_exponent(1e307))
    assert clamped > 0
    assert sorted((r.step, r.value) for r in out["r"]) == [(0, clamped), (1, clamped)]


def test_sub_grid_differences_of_a_sum_never_reach_the_release():
    """With production noise the release is an exact float sum of grid multiples: two inputs
    that differ by less than the grid (here 1e-9 against 2^-18) release identical floats."""
    key = dpb.NoiseKey.from_bytes(bytes(range(32)))
    runs = []
    for shift in (0.0, 1e-9):
        events = [{"ts": 1.0 + i, "v": 0.1 * i + shift} for i in range(20)]
        total = dpb.ContinualSum(value_fn=lambda e: e["v"], lower=0, upper=4, epsilon=1.0,
                                 step=10, start=0, end=20, timestamp_fn=lambda e: e["ts"],
                                 noise_key=key)
        out = collect(batch_options(), lambda p: {"r": (p | beam.Create(events) | total).releases})
        runs.append(sorted((r.step, r.value) for r in out["r"]))
    assert runs[0] == runs[1]
    for _, value in runs[0]:
        # A sum of multiples of 2^-18 (totals) and 2^-28 (noise of scale 4): a multiple of
        # 2^-28, where a float carrying the data's own low-order bits would have ~2^-49.
        assert math.ldexp(value, 28) == round(math.ldexp(value, 28))


@pytest.mark.parametrize("make", [
    lambda: dpb.ContinualCount(epsilon=1.0, step=10, start=0, max_contibutions=3),
    lambda: dpb.ContinualSum(value_fn=float, lower=0, upper=1, epsilon=1.0, step=10, start=0,
                             max_contibutions=3),
])
def test_a_misspelled_keyword_names_the_public_transform(make):
    # Formerly: "_ContinualTotal.__init__() got an unexpected keyword argument".
    with pytest.raises(TypeError) as info:
        make()
    message = str(info.value)
    assert "max_contibutions" in message and "_ContinualTotal" not in message
    assert message.startswith(("ContinualCount.__init__()", "ContinualSum.__init__()"))


def test_public_signatures_list_every_option():
    import inspect
    for cls in (dpb.ContinualCount, dpb.ContinualSum):
        params = inspect.signature(cls).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
        for name in ("start", "end", "key_fn", "keys", "allowed_lateness", "late",
                     "transient_errors", "noise_key", "label"):
            assert name in params, (cls, name)
    # A count has no value_fn to accept.
    with pytest.raises(TypeError, match="value_fn"):
        dpb.ContinualCount(epsilon=1.0, step=10, start=0, value_fn=float)


def test_sum_step_totals_do_not_depend_on_the_order_of_values_or_merges():
    # A retried bundle may deliver a step's values in another order and merge
    # partial sums differently; the same noise is then added, so the total
    # itself must be identical bit for bit. These values make float sums
    # order-dependent (1e16 + 1 rounds the 1 away).
    values = [1e16, 1.0, -1e16, 0.1, 0.2, 0.3, -0.6, 3.0e-17, 1.0]
    fn = continual._SumCount()
    exact = float(sum(Fraction(v) for v in values))
    rng = random.Random(5)
    outputs = set()
    for _ in range(50):
        order = values[:]
        rng.shuffle(order)
        cut = rng.randrange(len(order) + 1)
        left = fn.add_inputs(fn.create_accumulator(), order[:cut])
        right = fn.create_accumulator()
        for v in order[cut:]:
            right = fn.add_input(right, v)
        merged = fn.merge_accumulators([right, left] if rng.random() < 0.5 else [left, right])
        outputs.add(fn.extract_output(merged))
    assert outputs == {(exact, len(values))}
    # The plain float sum of the same values differs between orders, so the test can fail.
    assert len({sum(values), sum(sorted(values)), sum(reversed(values))}) > 1


def test_sum_step_totals_are_the_correctly_rounded_exact_sum_at_every_scale():
    """The accumulator keeps n·2^e aligned to the smallest exponent seen: subnormals, huge
    values, signed zeros and mixed magnitudes all give the float nearest to the exact sum
    (Fraction), whatever the grouping of the merges."""
    fn = continual._SumCount()
    rng = random.Random(11)
    specials = [5e-324, -5e-324, 2.2250738585072014e-308, -0.0, 0.0, 1e300, -1e300, 0.1, 3.0]
    for trial in range(200):
        values = [rng.choice(specials) if rng.random() < 0.3 else
                  rng.uniform(-1, 1) * 2.0 ** rng.randint(-1074, 1000) for _ in range(rng.randint(0, 12))]
        exact = sum((Fraction(v) for v in values), Fraction(0))
        try:
            want = float(exact)
        except OverflowError:
            want = math.inf if exact > 0 else -math.inf
        parts = [fn.add_inputs(fn.create_accumulator(), values[i::3]) for i in range(3)]
        got = fn.extract_output(fn.merge_accumulators(parts))
        assert got == (want, len(values)) and math.copysign(1.0, got[0]) == math.copysign(1.0, want)


def test_sum_step_total_beyond_float_range_is_infinite_and_clamped():
    fn = continual._SumCount()
    acc = fn.add_inputs(fn.create_accumulator(), [1.7e308, 1.7e308])
    assert fn.extract_output(acc) == (math.inf, 2)
    acc = fn.add_inputs(fn.create_accumulator(), [-1.7e308, -1.7e308])
    assert fn.extract_output(acc)[0] == -math.inf


def test_count_step_totals_are_the_event_counts():
    fn = continual._CountSteps()
    acc = fn.merge_accumulators([fn.add_inputs(fn.create_accumulator(), [1.0] * 3),
                                 fn.add_input(fn.create_accumulator(), 1.0)])
    assert fn.extract_output(acc) == (4.0, 4)


_WINDOWED_EVENTS = [(f"k{k}", s * 3600.0 + 60.0 * j, float(j % 3), f"u{(k + j) % 5}")
                    for k in range(4) for s in range(3) for j in range(3)] + [("k0", 1e9, 1.0, "u0")]


@pytest.mark.parametrize("shards", [0, 2])
@pytest.mark.parametrize("unit", ["event", "user"])
def test_input_in_fixed_windows_releases_what_global_input_releases(unit, shards):
    """The schedule decides the steps, not the input's windows: windowed input gives the
    same releases and dead letters (it used to crash the FnApiRunner with the user unit,
    whose dead letters were flattened across two windowings)."""
    user = dict(privacy_unit="user", user_fn=lambda e: e[3], max_contributions=4) if unit == "user" else {}

    def make():
        return dpb.ContinualSum(value_fn=lambda e: e[2], lower=0.0, upper=2.0, epsilon=1.0,
                                step=3600.0, start=0, end=3 * 3600.0, key_fn=lambda e: e[0],
                                keys=["k0", "k1", "k2", "k3"], rng=3, shards=shards, **user)

    plain, windowed = global_and_windowed(_WINDOWED_EVENTS, lambda e: e[1], 3600.0, make)
    assert len(plain[0]) == 12 and plain[1] and windowed == plain
