"""Batch (FnApiRunner) and streaming (TestStream) tests of ContinualMean."""

import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.continual_mean import represented_count
from dp_beam.transforms.mean import ContinualMean
from tests.beam_util import batch_options, collect, streaming_options

STEP = 10.0
USERS, M = 60, 8


def _events(seed=1):
    rnd = random.Random(seed)
    data = {f"u{u}": [rnd.uniform(-5, 15) for _ in range(M)] for u in range(USERS)}
    # Sample i of every user falls in step i: round-robin arrival, shuffled.
    events = [{"user": u, "ts": i * STEP + 1 + k % 7, "v": xs[i]}
              for k, (u, xs) in enumerate(data.items()) for i in range(M)]
    rnd.shuffle(events)
    return data, events


def _run(transform, events, options=None):
    def build(p):
        res = p | beam.Create(events, reshuffle=False) | "mean" >> transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(options or batch_options(), build)


def _mean(**kw):
    args = dict(user_fn=lambda e: e["user"], value_fn=lambda e: e["v"], lower=-5.0, upper=15.0,
                max_samples_per_user=M, epsilon=200.0, step=STEP, max_users=100,
                timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
    args.update(kw)
    return ContinualMean(**args)


def test_batch_values_noise_off_is_exact_every_step():
    data, events = _events()
    # The schedule follows each user's processing order; a batch runner keeps
    # the order of an unshuffled Create, so time order gives the paper's stream.
    out = _run(_mean(neighbours="values"), sorted(events, key=lambda e: e["ts"]))
    rel = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in rel] == list(range(M))
    for r in rel:
        rep = represented_count(r.step + 1, 3)
        assert r.value == pytest.approx(np.mean([xs[:rep] for xs in data.values()]), abs=1e-9)
        assert r.denominator == USERS * rep and r.diverse and r.neighbours == "values"
        assert r.noise_std > 0 and r.ci95 > 0 and r.mechanism.startswith("withhold_release_mean+")
    assert out["invalid"] == []
    (entry,) = out["accounting"]
    assert entry.unit == "user" and entry.neighbours == "values"
    assert entry.epsilon <= 200.0 + 1e-9
    # Any processing order: the last step represents every sample (M is a power of 2).
    shuffled = _run(_mean(neighbours="values"), events)["releases"]
    last = max(shuffled, key=lambda r: r.step)
    assert last.value == pytest.approx(np.mean(list(data.values())), abs=1e-9)


def test_batch_participation_default_cap_and_invalid():
    data, events = _events()
    bad = [{"user": "u1", "ts": 3.0, "v": float("nan")},
           {"user": None, "ts": 3.0, "v": 1.0},
           {"user": "u2", "ts": 3.0},
           {"user": "u3", "ts": 4.0, "v": "7"}]
    extra = [{"user": "u0", "ts": 75.0 + i, "v": 1.0} for i in range(3)]      # beyond m = 8
    out = _run(_mean(), events + bad + extra)
    invalid = out["invalid"]
    reasons = " | ".join(sorted(i.reason for i in invalid))
    assert len(invalid) == len(bad) + len(extra)
    assert reasons.count("max_samples_per_user") == 3
    for frag in ("NaN", "user_fn returned None", "KeyError", "not a real number"):
        assert frag in reasons
    rel = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in rel] == list(range(M))
    assert all(r.neighbours == "participation" for r in rel)
    # Noise off, exact counts: levels active at the end cover every sample.
    assert rel[-1].active_levels == (0, 1, 2, 3)
    assert rel[-1].value == pytest.approx(np.mean(list(data.values())), abs=1e-9)
    (entry,) = out["accounting"]
    assert entry.neighbours == "participation" and entry.unit == "user"


def test_seeded_noise_repeats_and_accounting_plan_checks_budget():
    _, events = _events()
    make = lambda: _mean(epsilon=2.0, rng=42)
    a = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    b = sorted(_run(make(), events)["releases"], key=lambda r: r.step)
    assert [r.value for r in a] == [r.value for r in b]
    with beam.Pipeline(options=batch_options()) as p:
        res = p | beam.Create(events) | "mean" >> make()
        reports = dpb.plan(res.accounting, dpb.Budget(epsilon=2.0))
        assert reports[-1].unit == "user" and reports[-1].epsilon <= 2.0 + 1e-9
        with pytest.raises(ValueError, match="budget exceeded"):
            dpb.plan(res.accounting, dpb.Budget(epsilon=1.0))


def test_configuration_errors_name_the_parameter():
    for kw, name in ((dict(lower=5.0, upper=1.0), "lower"), (dict(epsilon=-1.0), "epsilon"),
                     (dict(max_samples_per_user=0), "max_samples_per_user"),
                     (dict(step=0), "step"), (dict(neighbours="users"), "neighbours"),
                     (dict(noise="gaussian"), "delta")):
        with pytest.raises(ValueError, match=name):
            _mean(**kw)


def test_streaming_releases_in_order_with_empty_steps():
    ev = lambda u, ts, v: TimestampedValue({"user": u, "ts": ts, "v": v}, ts)
    stream = (_TestStream()
              .add_elements([ev("a", 5.0, 10.0), ev("b", 3.0, 0.0)])
              .advance_watermark_to(10)
              .add_elements([ev("a", 25.0, 5.0)])                     # step 1 stays empty
              .advance_watermark_to(30)
              .add_elements([ev("b", 32.0, 5.0)])
              .advance_watermark_to(40)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "mean" >> _mean(neighbours="values", max_idle_steps=2)
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(streaming_options(), build)
    rel = out["releases"]
    steps = [r.step for r in rel]
    assert steps == list(range(len(steps))) and steps[-1] >= 3
    # step 0: first samples 10 and 0 → 5; step 2: a's 2nd sample (level 1) → (10+0+5)/3;
    # step 3: b's 2nd → (10+0+5+5)/4.
    values = {r.step: r.value for r in rel}
    assert values[0] == pytest.approx(5.0) and values[1] == pytest.approx(5.0)
    assert values[2] == pytest.approx(5.0) and values[3] == pytest.approx(5.0)
    assert [r.denominator for r in rel[:4]] == [2, 2, 3, 4]
    assert out["invalid"] == [] and len(out["accounting"]) == 1


@pytest.mark.parametrize("mechanism", ["tree", "honaker", "smooth_binary", None])
def test_every_laplace_mechanism_gives_the_exact_mean_with_noise_off(mechanism):
    from dp_beam.mechanisms import ZeroNoise
    from dp_beam.transforms.mean import ContinualMean
    from tests.beam_util import batch_options, collect
    import apache_beam as beam

    events = [{"ts": float(t), "u": f"u{t % 10}", "v": float(t % 5)} for t in range(40)]

    def build(p):
        res = p | beam.Create(events) | "mean" >> ContinualMean(
            user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=4,
            max_samples_per_user=4, epsilon=1.0, step=10, timestamp_fn=lambda e: e["ts"],
            neighbours="values", mechanism=mechanism, rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting}
    out = collect(batch_options(), build)
    releases = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in releases] == [0, 1, 2, 3]
    name = mechanism or "tree"
    assert all(r.mechanism.endswith("+" + name) for r in releases)
    assert out["accounting"][0].mechanism.endswith("+" + name)
    for r in releases:
        if r.diverse and r.denominator > 0:
            assert 0.0 <= r.value <= 4.0 and r.ci95 > 0
