"""Batch (FnApiRunner) and streaming (TestStream) tests of ContinualMean."""

import dataclasses
import inspect
import json
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.continual_mean import MeanConfig
from dp_beam.transforms.mean import ContinualMean
from tests.beam_util import batch_options, collect, global_and_windowed, streaming_options

STEP = 10.0
USERS, M = 60, 8
# The public schedule of most tests: steps 0 .. M - 1 (sample i of every user falls in step i).
START, END = 0.0, M * STEP


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
                start=START, end=END, timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
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
        # M = 8: no level can be truncated, so the tuned preset feeds every
        # sample as it arrives (the paper's withholding would cover only
        # represented_count(step + 1) samples per user).
        rep = r.step + 1
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
    assert sum(i.count for i in invalid) == len(bad) + len(extra)
    # The three samples over the cap (one user, one step): one record standing for 3.
    (over,) = [i for i in invalid if "max_samples_per_user" in i.reason]
    assert over.count == 3 and over.element["user"] == "u0" and over.element["step"] == 7
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
                     (dict(noise="gaussian"), "delta"), (dict(user_spread=1.5), "user_spread"),
                     (dict(start=None), "start"), (dict(start="yesterday"), "start"),
                     (dict(end=START), "end"), (dict(end="not a time"), "end"),
                     (dict(horizon=4), "horizon")):
        with pytest.raises(ValueError, match=name):
            _mean(**kw)
    assert _mean(user_spread=0.1).params.user_spread == 0.1
    # The data-driven pause is gone: the schedule alone decides what is released.
    with pytest.raises(TypeError, match="max_idle_steps"):
        _mean(max_idle_steps=2)


def test_batch_schedule_is_public_start_to_end_events_or_not():
    # Batch input without end (or horizon) is refused at expansion: the streams
    # would otherwise end where the data ends.
    _, events = _events()
    with pytest.raises(ValueError, match="end"):
        _run(_mean(end=None), events)
    # With a horizon and no end, the stream ends after horizon steps.
    short = sorted(_run(_mean(end=None, horizon=M, neighbours="values"), events)["releases"],
                   key=lambda r: r.step)
    assert [r.step for r in short] == list(range(M))
    # Steps before the first event and after the last one are released too, and
    # events outside [start, end) go to .invalid with the reason.
    outside = [{"user": "u0", "ts": -20.5, "v": 1.0}, {"user": "u1", "ts": 120.0, "v": 1.0}]
    out = _run(_mean(start=-2 * STEP, end=12 * STEP, neighbours="values"), events + outside)
    rel = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in rel] == list(range(-2, 12))
    assert [r.t for r in rel] == list(range(1, 15))
    assert [r.denominator for r in rel[:2]] == [0, 0]
    assert all(r.denominator == USERS * M for r in rel[-4:])
    assert sorted(i.reason.split(" (")[0] for i in out["invalid"]) == [
        "event time at or after end", "event time before start"]
    (entry,) = out["accounting"]
    assert entry.key is None and entry.scope == "stream"


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
        # end is required here: without it the stream releases with the watermark
        # forever, and the watermark jumps to infinity.
        res = p | stream | "mean" >> _mean(neighbours="values", start=0.0, end=6 * STEP)
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(streaming_options(), build)
    rel = out["releases"]
    steps = [r.step for r in rel]
    # Public schedule: every step from start to end - 1, in order; the empty step 1
    # and the steps after the last event (4, 5) are released like the others (the
    # old data-driven pause after max_idle_steps empty steps is gone).
    assert steps == list(range(6))
    # step 0: first samples 10 and 0 → 5; step 2: a's 2nd sample (level 1) → (10+0+5)/3;
    # step 3: b's 2nd → (10+0+5+5)/4.
    values = {r.step: r.value for r in rel}
    assert values[0] == pytest.approx(5.0) and values[1] == pytest.approx(5.0)
    assert values[2] == pytest.approx(5.0) and values[3] == pytest.approx(5.0)
    assert [r.denominator for r in rel[:4]] == [2, 2, 3, 4]
    # After the last event the estimate stands: nothing new is represented.
    assert values[4] == pytest.approx(5.0) and values[5] == pytest.approx(5.0)
    assert [r.denominator for r in rel[4:]] == [4, 4]
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
            max_samples_per_user=4, epsilon=1.0, step=10, start=0, end=40,
            timestamp_fn=lambda e: e["ts"], neighbours="values", mechanism=mechanism,
            rng=ZeroNoise())
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


# -- keys (key_fn, max_keys_per_user) -------------------------------------------------------

KEYS = ("A", "B", "C")
PER_KEY = 4  # samples of a user in each of its keys: a power of 2, so all are represented at the end


def _keyed_events(seed=3):
    """Users with samples in 1, 2 or 3 keys; sample j of a (user, key) falls in step j.

    A user's keys start at a different key for each user, and its first key's samples come
    a second before the next key's, so the keys a user keeps first are spread over all the
    keys (ties of event time would go to the key with the smallest repr)."""
    rnd = random.Random(seed)
    events = []
    for u in range(45):
        keys = [KEYS[(u + i) % len(KEYS)] for i in range(1 + u % 3)]
        for i, key in enumerate(keys):
            for j in range(PER_KEY):
                events.append({"user": f"u{u}", "key": key, "ts": j * STEP + 1 + u % 5 + i,
                               "v": rnd.uniform(-5, 15)})
    rnd.shuffle(events)
    return events


def _keyed_mean(k, **kw):
    args = dict(key_fn=lambda e: e["key"], keys=KEYS, max_keys_per_user=k,
                max_samples_per_user=PER_KEY, neighbours="values", end=PER_KEY * STEP)
    args.update(kw)
    return _mean(**args)


@pytest.mark.parametrize("k", [1, 2])
def test_keys_route_values_cap_keys_per_user_and_account_every_event(k):
    events = _keyed_events()
    holder = {}

    def build(p):
        res = p | beam.Create(events) | "mean" >> _keyed_mean(k)
        combine = dpb.CombineAccounting(dpb.Budget(epsilon=200.0))
        report = res.accounting | combine
        holder["planned"] = combine.planned
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid,
                "report": report}
    out = collect(batch_options(), build)

    dropped = {}
    for rec in out["invalid"]:
        assert rec.reason == f"max_keys_per_user ({k}) exceeded for user"
        dropped.setdefault(rec.element["user"], set()).add(rec.element["key"])
    by_user = {}
    for e in events:
        by_user.setdefault(e["user"], set()).add(e["key"])
    kept = {u: keys - dropped.get(u, set()) for u, keys in by_user.items()}
    for u, keys in by_user.items():
        # A user keeps min(#keys, k) keys and loses every event of the others.
        assert len(kept[u]) == min(len(keys), k)
    # One record per user, refused key and step, standing for the user's events there.
    assert all(rec.count == 1 for rec in out["invalid"])
    assert sum(rec.count for rec in out["invalid"]) == PER_KEY * sum(
        len(keys) - len(kept[u]) for u, keys in by_user.items())

    last = {}
    for r in out["releases"]:
        if r.key not in last or r.step > last[r.key].step:
            last[r.key] = r
    assert set(last) == set(KEYS)
    used = 0
    for key, r in last.items():
        mine = [e["v"] for e in events if e["key"] == key and key in kept[e["user"]]]
        # Noise off, every user's samples represented: the exact mean of the kept samples.
        assert r.value == pytest.approx(np.mean(mine), abs=1e-9)
        assert r.denominator == len(mine)
        used += int(r.denominator)
    assert used + sum(rec.count for rec in out["invalid"]) == len(events)

    # One ledger entry per key, each stating the user's whole cost over its k keys.
    transform = _keyed_mean(k)
    stream = transform.params.privacy_cost()
    assert transform.params.epsilon == pytest.approx(200.0 / k)
    entries = sorted(out["accounting"], key=lambda e: e.key)
    assert [e.key for e in entries] == list(KEYS)
    for e in entries:
        assert e.scope == "key" and e.unit == "user"
        assert e.epsilon == pytest.approx(k * stream["epsilon"]) and e.epsilon <= 200.0 + 1e-9
        assert (e.epsilon, e.delta, e.rho) == (transform.plan_entry("mean").epsilon,
                                               transform.plan_entry("mean").delta,
                                               transform.plan_entry("mean").rho)
    # Runtime ledger == plan: parallel composition over the keys gives the planned total.
    (planned,) = [r for r in holder["planned"] if r.unit == "user"]
    final = max((r for r in out["report"] if r.unit == "user"), key=lambda r: len(r.lines))
    assert len(final.lines) == len(KEYS)
    assert final.epsilon == pytest.approx(planned.epsilon)
    assert final.epsilon == pytest.approx(k * stream["epsilon"])


def test_cost_per_key_splits_the_budget_for_laplace_and_gaussian():
    from dp_beam.mechanisms.calibration import eps_from_rho_delta, rho_from_eps_delta
    from dp_beam.mechanisms.continual_mean import MeanParams

    one = _mean(epsilon=1.0).plan_entry("m")
    whole = MeanParams(100, M, 1.0, 0.1).privacy_cost()
    assert (one.epsilon, one.rho, one.scope) == (pytest.approx(whole["epsilon"]),
                                                 pytest.approx(whole["rho"]), "stream")
    for k in (2, 3):
        t = _mean(epsilon=1.0, key_fn=lambda e: e["key"], keys=KEYS, max_keys_per_user=k)
        e = t.plan_entry("m")
        # Laplace: each key's stream at ε/k; the entry states k streams' worth.
        assert t.params.epsilon == pytest.approx(1.0 / k)
        assert e.epsilon == pytest.approx(k * t.params.privacy_cost()["epsilon"])
        assert e.epsilon == pytest.approx(one.epsilon) and e.scope == "key"
        assert f"at most {k} key" in e.neighbours
        g = _mean(epsilon=1.0, noise="gaussian", delta=1e-6, key_fn=lambda e: e["key"],
                  keys=KEYS, max_keys_per_user=k)
        ge = g.plan_entry("m")
        # zCDP adds over the k streams: k·ρ_stream = ρ(ε, δ) of the whole budget's split.
        assert ge.rho == pytest.approx(k * g.params.privacy_cost()["rho"])
        assert ge.rho <= rho_from_eps_delta(1.0, 1e-6) * (1 + 1e-9)
        assert ge.epsilon == pytest.approx(eps_from_rho_delta(ge.rho, 1e-6))
        assert ge.epsilon <= 1.0 + 1e-9 and ge.delta == 1e-6


def test_key_configuration_errors_name_the_parameter():
    key_fn = lambda e: e["key"]  # noqa: E731
    for kw, name in ((dict(max_keys_per_user=0, key_fn=key_fn, keys=KEYS), "max_keys_per_user"),
                     (dict(max_keys_per_user=True, key_fn=key_fn, keys=KEYS), "max_keys_per_user"),
                     (dict(max_keys_per_user=2), "max_keys_per_user"),
                     (dict(key_fn="carrier", keys=KEYS), "key_fn"),
                     # The key set is public: key_fn needs keys, and keys needs key_fn.
                     (dict(key_fn=key_fn), "keys"),
                     (dict(keys=KEYS), "key_fn"),
                     (dict(key_fn=key_fn, keys="ABC"), "keys"),
                     (dict(key_fn=key_fn, keys=[]), "keys"),
                     (dict(key_fn=key_fn, keys=["A", None]), "keys"),
                     # Private selection bounds the keys of a user as max_keys_per_user does.
                     (dict(key_fn=key_fn, keys=dpb.PrivateKeys(1.0, 1e-6, max_keys_per_unit=2)),
                      "max_keys_per_unit"),
                     (dict(key_fn=key_fn, max_keys_per_user=2,
                           keys=dpb.PrivateKeys(1.0, 1e-6)), "max_keys_per_unit")):
        with pytest.raises(ValueError, match=name):
            _mean(**kw)
    assert _mean(key_fn=key_fn, max_keys_per_user=2,
                 keys=dpb.PrivateKeys(1.0, 1e-6, max_keys_per_unit=2)).params.epsilon == 100.0


def test_declared_keys_release_every_step_from_start_even_without_events():
    # The key set is public: a declared key without events has its stream (every
    # step, and its ledger entry) all the same, and an undeclared key is invalid
    # instead of opening a stream.
    events = _keyed_events()
    stray = [{"user": "u0", "key": "E", "ts": 5.0, "v": 1.0}]
    out = _run(_keyed_mean(3, keys=KEYS + ("D",)), events + stray)
    (bad,) = out["invalid"]
    assert bad.reason == "undeclared key 'E' (not in keys)" and bad.element == stray[0]
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert sorted(by_key) == ["A", "B", "C", "D"]
    for key, rel in by_key.items():
        assert sorted(r.step for r in rel) == list(range(PER_KEY))
    assert all(r.denominator == 0 for r in by_key["D"])
    last = {key: max(rel, key=lambda r: r.step) for key, rel in by_key.items()}
    for key in KEYS:
        mine = [e["v"] for e in events if e["key"] == key]
        assert last[key].value == pytest.approx(np.mean(mine), abs=1e-9)
    assert sorted(e.key for e in out["accounting"]) == ["A", "B", "C", "D"]


def test_private_keys_open_a_stream_at_admission_and_dead_letter_keys_never_admitted():
    # Key A: 16 users from step 0; key B: 16 other users from step 2; key C: one
    # user. Noise off, the selection admits a key at the first step where its
    # count of distinct users reaches the public threshold.
    events = []
    for u in range(16):
        events += [{"user": f"a{u}", "key": "A", "ts": j * STEP + 1, "v": float(u % 5)}
                   for j in range(4)]
        events += [{"user": f"b{u}", "key": "B", "ts": j * STEP + 2, "v": float(u % 3)}
                   for j in (2, 3)]
    events += [{"user": "c0", "key": "C", "ts": j * STEP + 3, "v": 9.0} for j in range(4)]
    keys = dpb.PrivateKeys(epsilon=5.0, delta=1e-3, max_keys_per_unit=1)
    selection = keys.selection(4)
    # 16 users reach every step's threshold; one user never does.
    assert all(1 < selection.threshold(t) < 16 for t in range(1, 5))
    transform = _mean(key_fn=lambda e: e["key"], keys=keys, max_samples_per_user=4,
                      neighbours="values", end=4 * STEP)
    out = _run(transform, events)
    admitted = sorted((r.key, r.step) for r in out["releases"] if isinstance(r, dpb.KeyAdmitted))
    assert admitted == [("A", 0), ("B", 2)]
    means = {}
    for r in out["releases"]:
        if isinstance(r, dpb.MeanRelease):
            means.setdefault(r.key, []).append(r)
    assert sorted(means) == ["A", "B"]
    assert sorted(r.step for r in means["A"]) == [0, 1, 2, 3]
    assert sorted(r.step for r in means["B"]) == [2, 3]
    # t counts from the stream's first step: B's stream opens at its admission.
    assert sorted(r.t for r in means["B"]) == [1, 2]
    for key in ("A", "B"):
        last = max(means[key], key=lambda r: r.step)
        assert last.value == pytest.approx(np.mean([e["v"] for e in events if e["key"] == key]))
    assert sum(i.count for i in out["invalid"]) == 4
    assert all("not admitted" in i.reason for i in out["invalid"])
    ledger = sorted((e.transform, e.key) for e in out["accounting"])
    assert ledger == [("mean", "A"), ("mean", "B"), ("mean/keys", None)]


# -- vector values --------------------------------------------------------------------------

LO2, HI2 = [-5.0, 0.0], [15.0, 2.0]


def _vector_events(users=120, seed=5):
    rnd = random.Random(seed)
    data = {f"u{u}": [[rnd.uniform(-5, 15), rnd.uniform(0, 2)] for _ in range(M)]
            for u in range(users)}
    events = [{"user": u, "ts": i * STEP + 1 + k % 7, "xy": xs[i]}
              for k, (u, xs) in enumerate(data.items()) for i in range(M)]
    return data, sorted(events, key=lambda e: e["ts"])


@pytest.mark.parametrize("neighbours", ["participation", "values"])
def test_vector_values_match_the_engine_free_mechanism_with_a_test_seed(neighbours):
    from dp_beam.mechanisms import SeededNoise
    from dp_beam.mechanisms.continual_mean import ContinualMeanMechanism as EngineFree

    test_seed = 20240611
    data, events = _vector_events()
    transform = _mean(value_fn=lambda e: e["xy"], lower=LO2, upper=HI2, epsilon=20.0,
                      max_users=200, neighbours=neighbours, rng=SeededNoise(test_seed))
    assert transform.dim == 2
    # A batch runner keeps the order of an unshuffled Create: time order, as fed below.
    out = _run(transform, events)
    rel = sorted(out["releases"], key=lambda r: r.step)
    assert out["invalid"] == [] and [r.step for r in rel] == list(range(M))

    ref = EngineFree(LO2, HI2, M, 20.0, max_users=200, dim=2, neighbours=neighbours,
                     rng=SeededNoise(test_seed))
    assert ref.privacy_cost() == transform.params.privacy_cost()
    for r in rel:
        step_events = [e for e in events if int(e["ts"] // STEP) == r.step]
        want = ref.step([(e["user"], e["xy"]) for e in step_events])
        # Same noise draws in the same order; only the order of float sums may differ.
        assert isinstance(r.value, list) and len(r.value) == 2
        assert r.value == pytest.approx(list(want.estimate), rel=1e-9, abs=1e-9)
        assert r.noise_std == pytest.approx(list(want.noise_std), rel=1e-9)
        assert r.ci95 == pytest.approx(list(want.ci95), rel=1e-9)
        assert r.diverse == want.diverse and r.active_levels == tuple(want.active)
    assert rel[-1].active_levels == (0, 1, 2, 3)
    # The match is not the trivial one of noise off: the release is noisy.
    exact = np.mean([x for xs in data.values() for x in xs], axis=0)
    assert abs(rel[-1].value[0] - exact[0]) > 1e-6
    json.dumps(dpb.records.to_json(rel[-1]), allow_nan=False)  # the sinks' serialisation


def test_vector_ledger_composes_over_coordinates():
    from dp_beam.mechanisms.continual_mean import MeanParams

    one = _mean(epsilon=1.0)
    two = _mean(epsilon=1.0, value_fn=lambda e: e["xy"], lower=LO2, upper=HI2)
    e1, e2 = one.plan_entry("m"), two.plan_entry("m")
    # The whole vector costs ε: L1 tree sensitivity d times a coordinate's, medians at ε_M/d.
    assert e2.epsilon == pytest.approx(e1.epsilon) and e2.epsilon <= 1.0
    top = two.params.L
    assert e2.sensitivity == pytest.approx(2 * two.params.element_bound[top])
    # Per coordinate the element bound never shrinks (medians at ε_M/d, union bounds at β/d,
    # spec §3.3), so the vector's sensitivity is at least d times the scalar one.
    assert two.params.element_bound[top] >= one.params.element_bound[top]
    assert e2.sensitivity >= 2 * e1.sensitivity
    assert two.params.privacy_cost() == MeanParams(
        100, M, 1.0, 0.1, dim=2, mechanism=two.params.mechanism).privacy_cost()
    # Scalar bounds with an explicit dim: the same bounds in every coordinate.
    three = _mean(value_fn=lambda e: e["xy"], lower=0.0, upper=1.0, dim=3)
    assert three.dim == 3 and three.params.dim == 3


def test_vector_values_clamped_or_dead_lettered():
    events = [{"user": "a", "ts": 1.0, "xy": [20.0, -1.0]},        # clamped to (15, 0)
              {"user": "b", "ts": 2.0, "xy": np.array([5.0, 1.0])},
              {"user": "c", "ts": 3.0, "xy": [1.0]},
              {"user": "d", "ts": 4.0, "xy": [1.0, float("nan")]},
              {"user": "e", "ts": 5.0, "xy": [1.0, float("inf")]},
              {"user": "f", "ts": 6.0, "xy": 3.0},
              {"user": "g", "ts": 7.0, "xy": [1.0, "x"]},
              {"user": "h", "ts": 8.0, "xy": [1.0, 2.0, 3.0]}]
    out = _run(_mean(value_fn=lambda e: e["xy"], lower=LO2, upper=HI2, neighbours="values",
                     end=STEP), events)
    reasons = sorted(i.reason for i in out["invalid"])
    assert reasons == sorted(["value has 1 coordinates, expected 2", "coordinate 1: value is NaN",
                              "coordinate 1: value is infinite",
                              "not a sequence of 2 real numbers: float",
                              "coordinate 1: not a real number: str",
                              "value has 3 coordinates, expected 2"])
    (r,) = out["releases"]
    assert r.value == pytest.approx([(15.0 + 5.0) / 2, (0.0 + 1.0) / 2])
    assert r.denominator == 2


def test_bounds_and_dim_errors_name_the_parameter():
    for kw, name in ((dict(lower=[0, 0], upper=[1, 1, 1]), "lower and upper"),
                     (dict(lower=[0, 0], upper=1.0, dim=3), "lower"),
                     (dict(lower=0.0, upper=[1, 1], dim=3), "upper"),
                     (dict(lower=[0, 2], upper=[1, 1]), "lower must be < upper"),
                     (dict(lower=[0, float("nan")], upper=1.0), "lower"),
                     (dict(lower=[], upper=1.0), "lower"),
                     (dict(lower=0.0, upper=1.0, dim=0), "dim"),
                     (dict(lower=0.0, upper=1.0, dim=1.5), "dim")):
        with pytest.raises(ValueError, match=name):
            _mean(**kw)


def test_streaming_keys_keep_the_first_keys_in_arrival_order():
    ev = lambda u, key, ts, v: TimestampedValue({"user": u, "key": key, "ts": ts, "v": v}, ts)
    stream = (_TestStream()
              .add_elements([ev("a", "A", 1.0, 10.0), ev("b", "B", 2.0, 0.0)])
              .add_elements([ev("a", "B", 3.0, 5.0), ev("b", "B", 4.0, 4.0)])   # a: 2nd key
              .advance_watermark_to(10)
              .add_elements([ev("a", "A", 12.0, 6.0), ev("c", "A", 13.0, 2.0),
                             ev("a", "C", 14.0, 1.0)])                       # a: 3rd key
              .advance_watermark_to(20)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "mean" >> _keyed_mean(2, end=2 * STEP)
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(streaming_options(), build)
    (bad,) = out["invalid"]
    assert bad.reason == "max_keys_per_user (2) exceeded for user"
    assert bad.element == {"user": "a", "step": 1, "key": "C",
                           "example": {"key": "C", "value": 1.0}}
    assert bad.count == 1
    last = {}
    steps = {}
    for r in out["releases"]:
        steps.setdefault(r.key, []).append(r.step)
        if r.key not in last or r.step > last[r.key].step:
            last[r.key] = r
    # Noise off, values model: each key's mean of its represented samples.
    assert last["A"].value == pytest.approx((10.0 + 6.0 + 2.0) / 3)
    assert last["B"].value == pytest.approx((0.0 + 4.0 + 5.0) / 3)
    # The key set is public: C, whose only event was over a's key cap, still has
    # its stream from start to end and its ledger entry (a stream used to open
    # only at a key's first accepted event, so C had neither).
    assert {key: sorted(v) for key, v in steps.items()} == {"A": [0, 1], "B": [0, 1], "C": [0, 1]}
    assert last["C"].denominator == 0
    assert sorted(e.key for e in out["accounting"]) == ["A", "B", "C"]


def test_values_prior_query_matches_the_engine_free_mechanism_with_a_test_seed():
    # 20 users of 256 samples under "values": the plan answers a prior query
    # (a one-off noisy mean of user means) for the top levels. The transform's
    # per-user sums of user means must reach the core as the engine-free ones do.
    from dp_beam.mechanisms import SeededNoise
    from dp_beam.mechanisms.continual_mean import ContinualMeanMechanism as EngineFree

    rnd = random.Random(7)
    users, m, per_step = 20, 256, 16
    data = {f"u{u}": [rnd.uniform(-5, 15) for _ in range(m)] for u in range(users)}
    events = sorted(({"user": u, "ts": (i // per_step) * STEP + 1 + (i % per_step) * 0.5, "v": x}
                     for u, xs in data.items() for i, x in enumerate(xs)),
                    key=lambda e: (e["ts"], e["user"]))
    test_seed = 31
    steps = m // per_step
    transform = _mean(max_samples_per_user=m, epsilon=20.0, max_users=users, neighbours="values",
                      end=steps * STEP, rng=SeededNoise(test_seed))
    assert transform.params.query and transform.params.prior_levels == [6, 7, 8]
    rel = sorted(_run(transform, events)["releases"], key=lambda r: r.step)
    assert [r.step for r in rel] == list(range(steps))

    ref = EngineFree(-5.0, 15.0, m, 20.0, max_users=users, neighbours="values", rng=SeededNoise(test_seed))
    assert ref.privacy_cost() == transform.params.privacy_cost()
    for r in rel:
        want = ref.step([(e["user"], e["v"]) for e in events if int(e["ts"] // STEP) == r.step])
        assert r.value == pytest.approx(want.estimate, rel=1e-9, abs=1e-9)
        assert r.active_levels == tuple(want.active)
    assert ref.core.query is not None and rel[-1].active_levels == tuple(range(9))


def test_a_misspelled_keyword_names_the_public_transform():
    with pytest.raises(TypeError, match=r"^ContinualMean.__init__\(\) got an unexpected keyword"):
        dpb.ContinualMean(user_fn=str, value_fn=float, lower=0, upper=1, max_samples_per_user=1,
                          epsilon=1.0, step=10, start=0, max_sample_per_user=2)


# -- preset="paper": the medians' samples live in the release's log, not its state -------------

def _paper_events():
    rnd = random.Random(1)
    # 400 users, 15 samples each, 200 per step over 30 steps: the private medians of
    # levels 2, 3 and 4 activate at different steps.
    return [{"user": f"u{i % 400}", "ts": i * 0.05, "v": rnd.uniform(0, 4)} for i in range(6000)]


def _paper(**kw):
    return _mean(lower=0, upper=4, max_samples_per_user=16, epsilon=10.0, max_users=400,
                 preset="paper", neighbours="values", end=300, **kw)


class _Cell:
    def __init__(self):
        self.v = None

    def read(self):
        return self.v

    def write(self, v):
        self.v = v


class _Bag(list):
    def read(self):
        return list(self)

    def add(self, v):
        self.append(v)

    def clear(self):
        del self[:]


def _paper_aggregates(transform, events):
    from dp_beam.transforms.mean_aggregates import accumulator, merge_into
    from dp_beam.transforms.mean_users import WithholdReleaseBatch
    stage = WithholdReleaseBatch(transform="m", params=transform.params, lower=transform._lower,
                                 upper=transform._upper, step_micros=transform._step_micros,
                                 max_keys=1)
    stage.setup()
    per_step = {}
    for user in sorted({e["user"] for e in events}):
        mine = [(None, e["v"], e["ts"]) for e in events if e["user"] == user]
        for (_, step), agg in stage.process((user, mine)):
            acc = per_step.setdefault(step, accumulator())
            merge_into(acc, agg)
    return [per_step.get(s, accumulator()) for s in range(30)]


def test_paper_preset_keeps_median_samples_in_the_log_not_the_state():
    import pickle
    from dp_beam.transforms import mean as mt
    from dp_beam.transforms.bag_log import BagLog
    transform = _paper()
    assert transform.params.median_levels == [2, 3, 4]
    spec = mt.MeanReleaseSpec("m", STEP, transform.params, transform._lower, transform._upper,
                              None, transform.plan_entry("m"))
    assert spec.uses_log
    plain = spec.new_mechanism(ZeroNoise())          # the core keeping its samples in its state
    bag, meta, state = _Bag(), _Cell(), None
    activations, plain_sizes, sizes = [], [], []
    for agg in _paper_aggregates(transform, _paper_events()):
        log = BagLog(bag, meta)                       # one firing per step
        logged = (spec.new_mechanism(ZeroNoise(), log=log) if state is None
                  else spec.restore(state, ZeroNoise(), log=log))
        out = logged.step(pickle.loads(pickle.dumps(agg)))
        state = logged.to_state()
        log.flush()
        ref = plain.step(pickle.loads(pickle.dumps(agg)))
        # The same releases, step for step (the medians read the same samples) ...
        assert out.estimate == pytest.approx(ref.estimate) and out.active == ref.active
        activations.append(len(out.active))
        # ... but the rewritten state holds no samples: they are appended once to the log.
        assert state["store"] == {}
        sizes.append(len(pickle.dumps(state)))
        plain_sizes.append(len(pickle.dumps(plain.to_state())))
    # Levels activate one after another; once all are, the log is emptied.
    assert activations[0] < activations[-1] == 5 and len(set(activations)) > 2
    assert bag == [] and meta.v[0] == 0
    assert max(plain_sizes) > 10 * max(sizes)


@pytest.mark.parametrize("mode", ["batch", "streaming"])
def test_paper_preset_runs_with_its_log_in_batch_and_streaming(mode):
    from dp_beam.mechanisms.continual_mean import ContinualMeanCore
    events = _paper_events()
    transform = _paper()
    if mode == "batch":
        out = _run(transform, events)
    else:
        stream = _TestStream()
        for step in range(30):
            stream = stream.add_elements([TimestampedValue(e, e["ts"]) for e in events
                                          if step * STEP <= e["ts"] < (step + 1) * STEP])
            stream = stream.advance_watermark_to((step + 1) * STEP)
        stream = stream.advance_watermark_to_infinity()

        def build(p):
            res = p | stream | "mean" >> transform
            return {"releases": res.releases, "invalid": res.invalid}
        out = collect(streaming_options(), build)
    releases = sorted(out["releases"], key=lambda r: r.step)
    assert [r.step for r in releases] == list(range(30))
    assert out["invalid"] == []
    core = ContinualMeanCore(transform.params, transform._lower, transform._upper, None,
                             ZeroNoise())
    for r, agg in zip(releases, _paper_aggregates(transform, events)):
        ref = core.step(agg)
        assert r.value == pytest.approx(float(np.ravel(ref.estimate)[0]))
        assert r.active_levels == tuple(ref.active)


#: ContinualMean's own options, beside the fields of MeanConfig.
_MEAN_OPTIONS = {"user_fn", "value_fn", "lower", "upper", "step", "start", "end", "key_fn", "keys",
                 "max_keys_per_user", "timestamp_fn", "allowed_lateness", "late", "rng",
                 "noise_key", "transient_errors", "shards", "label"}


def test_the_signature_lists_the_config_fields_with_the_config_defaults():
    # One parameter list: help() shows every MeanConfig field, and the defaults are the
    # config's (except max_users and dim, whose defaults are the transform's: a declared
    # bound and the dimension of the bounds).
    params = inspect.signature(ContinualMean).parameters
    fields = {f.name: f for f in dataclasses.fields(MeanConfig)}
    assert set(params) == set(fields) | _MEAN_OPTIONS
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name, field in fields.items():
        if name in ("max_users", "dim"):
            continue
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert params[name].default == expected, name
    assert (params["max_users"].default, params["dim"].default) == (1_000_000, None)


def test_explicit_config_keywords_build_the_same_params_as_the_defaults():
    base = dict(user_fn=str, value_fn=float, lower=0, upper=1, max_samples_per_user=4, epsilon=1.0,
                step=10, start=0, max_users=50)
    given = {f.name: f.default for f in dataclasses.fields(MeanConfig)
             if f.default is not dataclasses.MISSING and f.name != "dim"}
    assert dpb.ContinualMean(**base).params.config == dpb.ContinualMean(**base, **given).params.config


def test_input_in_fixed_windows_releases_what_global_input_releases():
    """The schedule decides the steps, not the input's windows (windowed input used to crash
    the FnApiRunner: dead letters were flattened across two windowings)."""
    events = [(f"k{k}", s * 3600.0 + 60.0 * j, float(j % 3), f"u{(k + j) % 5}")
              for k in range(3) for s in range(3) for j in range(3)]
    plain, windowed = global_and_windowed(events, lambda e: e[1], 3600.0, lambda: dpb.ContinualMean(
        user_fn=lambda e: e[3], value_fn=lambda e: e[2], lower=0.0, upper=2.0,
        max_samples_per_user=9, epsilon=1.0, step=3600.0, start=0, end=3 * 3600.0,
        key_fn=lambda e: e[0], keys=["k0", "k1", "k2"], max_users=50, rng=3))
    assert len(plain[0]) == 9 and windowed == plain
