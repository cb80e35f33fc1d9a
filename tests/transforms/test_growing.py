"""GrowingSynthetic and GrowingQueries (seed 000) as Beam transforms: batch and TestStream runs.

Each pipeline pins its runner (FnApiRunner for batch, BundleBasedDirectRunner
with TestStream for streaming). With noise switched off (``ZeroNoise``) or a
test seed the transforms must release exactly what the engine-free mechanisms
release when fed the same per-step batches.
"""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.growing import PMWG, BBScheduler, LaplaceHistogram, MWEMHistogram
from tests.beam_util import batch_options, collect, global_and_windowed, streaming_options

N = 4
STEP = 10
SCHEDULE = dict(step=STEP, start=0, end=100)


def _records(seed=0, steps=10, per_step=(20, 60)):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        for _ in range(int(rng.integers(*per_step))):
            out.append({"ts": s * STEP + float(rng.uniform(0, STEP)), "cell": int(rng.choice(N, p=[0.5, 0.3, 0.15, 0.05])),
                        "k": "a" if rng.uniform() < 0.7 else "b"})
    return out


def _queries(times, kind="vector"):
    out = []
    for i, ts in enumerate(times):
        f = [1.0 if j == i % N else 0.0 for j in range(N)]
        out.append({"ts": float(ts), "f": f, "id": i, "k": "a"})
    return out


def _per_step_counts(records, steps=10, key=None):
    batches = [dict() for _ in range(steps)]
    for r in records:
        if key is not None and r["k"] != key:
            continue
        s = int(r["ts"] // STEP)
        batches[s][r["cell"]] = batches[s].get(r["cell"], 0) + 1
    return batches


SYNTH = dict(universe_fn=lambda r: r["cell"], universe_size=N, timestamp_fn=lambda r: r["ts"],
             query_fn=lambda q: q["f"], query_id_fn=lambda q: q["id"],
             query_timestamp_fn=lambda q: q["ts"], **SCHEDULE)


def _run(transform, records, queries=None, options=None, stream=None):
    def build(p):
        if stream is not None:
            source = p | stream
            recs = source | "records" >> beam.Filter(lambda e: "cell" in e)
            qs = source | "queries" >> beam.Filter(lambda e: "f" in e)
            res = (recs, qs) | transform
        else:
            recs = p | "records" >> beam.Create(records)
            res = (recs if queries is None else (recs, p | "queries" >> beam.Create(queries))) | transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(options or batch_options(), build)


def _split(releases):
    runs = sorted((r for r in releases if isinstance(r, dpb.SyntheticRelease)), key=lambda r: r.run)
    answers = sorted((r for r in releases if isinstance(r, dpb.QueryAnswer)), key=lambda r: r.query_id)
    hists = [r for r in releases if isinstance(r, dpb.HistogramRelease)]
    return runs, answers, hists


# -- GrowingSynthetic ---------------------------------------------------------------------


def test_synthetic_epochs_batch_matches_the_engine():
    records = _records(1)
    queries = _queries([3, 15, 44, 45, 97])
    transform = dpb.GrowingSynthetic(black_box=LaplaceHistogram(N), epsilon=1.0, n=100, gamma=0.5,
                                     rng=ZeroNoise(), **SYNTH)
    out = _run(transform, records, queries)
    runs, answers, _ = _split(out["releases"])
    engine = BBScheduler(LaplaceHistogram(N), epsilon=1.0, n=100, gamma=0.5, rng=ZeroNoise())
    expected, latest = [], {}
    for step, batch in enumerate(_per_step_counts(records)):
        run = engine.extend(batch)
        if run is not None:
            expected.append((step, run.t, run.epoch, run.epsilon, tuple(run.output)))
        latest[step] = engine.latest
    assert [(r.step, r.t, r.epoch, r.epsilon, r.output) for r in runs] == expected
    assert len(runs) >= 3 and all(r.kind == "histogram" and r.pooled >= 1 for r in runs)
    # Inline queries: f of the latest release at the end of their step ("refused" before any).
    for a in answers:
        run = latest[int(a.query_time // STEP)]
        f = np.array(queries[a.query_id]["f"])
        if run is None:
            assert a.kind == "refused" and a.value is None
        else:
            assert a.kind == "synthetic" and a.value == pytest.approx(float(f @ run.output))
    assert runs[-1].answer(queries[0]["f"]) == pytest.approx(dpb.answer_linear_query(runs[-1], queries[0]["f"]))
    (entry,) = out["accounting"]
    assert entry.relation == "replace" and entry.epsilon == 1.0 and entry.delta == 0.0
    assert entry.mechanism == "bbscheduler(laplace_histogram)" and "replace" in entry.neighbours
    assert out["invalid"] == []


def test_synthetic_every_step_with_mwem_and_a_test_seed():
    records = _records(2)
    box = MWEMHistogram(np.vstack([np.eye(N), 1 - np.eye(N)]), N, rounds=4)
    test_seed = 7
    transform = dpb.GrowingSynthetic(black_box=box, scheduler="every_step", epsilon=1.0,
                                     delta=1e-6, n=50, rng=test_seed, **SYNTH)
    out = _run(transform, records)
    runs, _, _ = _split(out["releases"])
    sizes = np.cumsum([sum(b.values()) for b in _per_step_counts(records)])
    assert [r.t for r in runs] == [int(t) for t in sizes if t >= 50]
    prm = transform.params
    first = runs[0]
    assert first.epsilon == pytest.approx(prm.pooled(0, first.t)[0])
    for prev, run in zip(runs, runs[1:]):
        assert run.epsilon == pytest.approx(prm.pooled(prev.t, run.t)[0])
        assert run.pooled == run.t - prev.t
    assert all(abs(sum(r.output) - 1) < 1e-9 for r in runs)
    (entry,) = out["accounting"]
    assert entry.delta == 1e-6 and entry.rho == pytest.approx(prm.rho)


def test_synthetic_streaming_with_late_records():
    ev = lambda e: TimestampedValue(e, e["ts"])
    stream = (test_stream.TestStream()
              .add_elements([ev({"ts": 1.0 + i / 10, "cell": i % N}) for i in range(30)])
              .advance_watermark_to(20)
              .add_elements([ev({"ts": 5.0, "cell": 0})])            # late: joins step 2
              .add_elements([ev({"ts": 21.0 + i / 10, "cell": 1}) for i in range(40)])
              .add_elements([ev({"ts": 22.0, "f": [1, 0, 0, 0], "id": 0})])
              .advance_watermark_to(60)
              .advance_watermark_to_infinity())
    transform = dpb.GrowingSynthetic(black_box=LaplaceHistogram(N), epsilon=1.0, n=20, gamma=1.0,
                                     rng=ZeroNoise(), **{**SYNTH, "end": 60})
    out = _run(transform, None, options=streaming_options(), stream=stream)
    runs, answers, _ = _split(out["releases"])
    assert [(r.step, r.t) for r in runs] == [(0, 30), (2, 71)]
    assert runs[1].output == pytest.approx((9 / 71, 48 / 71, 7 / 71, 7 / 71))
    (a,) = answers
    assert a.kind == "synthetic" and a.value == pytest.approx(9 / 71)
    assert out["invalid"] == [] and len(out["accounting"]) == 1


def test_ermg_releases_models():
    from dp_beam.mechanisms.growing import ERMBox

    feats = np.array([[-1.0, 0.5], [-0.5, -0.5], [0.5, 0.5], [1.0, -0.5]])
    box = ERMBox(feats, [0, 0, 1, 1], classes=(0, 1), feature_bound=1.5, lam=0.1)
    test_seed = 3
    transform = dpb.GrowingSynthetic(black_box=box, scheduler="every_step", epsilon=1.0,
                                     delta=1e-6, n=100, rng=test_seed, **SYNTH)
    records = _records(9)
    out = _run(transform, records)
    runs, _, _ = _split(out["releases"])
    assert runs and all(r.kind == "model" and len(r.output) == 3 for r in runs)
    assert out["accounting"][0].mechanism == "bbimprover(erm)"
    with pytest.raises(ValueError, match="queries"):
        _run(transform, records, _queries([5]))


# -- GrowingQueries -------------------------------------------------------------------------

PMWG_ARGS = dict(alpha=0.3, epsilon=1.0, **SYNTH)


def _engine_answers(records, queries, params, steps=10, key=None, rng=None):
    pm = PMWG(params, rng=rng or ZeroNoise())
    out = {}
    by_step = {}
    for q in queries:
        by_step.setdefault(int(q["ts"] // STEP), []).append(q)
    for step, batch in enumerate(_per_step_counts(records, steps, key)):
        pm.extend(batch)
        for q in sorted(by_step.get(step, []), key=lambda q: (q["ts"], q["id"])):
            a = pm.query(q["f"])
            out[q["id"]] = (a.kind, a.value, a.t, a.hard, a.cap)
    return out, pm


def test_queries_batch_matches_the_engine():
    records = _records(3)
    queries = _queries(np.linspace(1, 99, 60))
    transform = dpb.GrowingQueries(n=150, rng=ZeroNoise(), **PMWG_ARGS)
    out = _run(transform, records, queries)
    _, answers, _ = _split(out["releases"])
    expected, _ = _engine_answers(records, queries, transform.params)
    assert {a.query_id: (a.kind, a.value, a.t, a.hard, a.cap) for a in answers} == expected
    kinds = {a.kind for a in answers}
    assert {"refused", "hard", "easy"} <= kinds
    assert all(a.alpha == 0.3 and a.mechanism == "pmwg" for a in answers)
    (entry,) = out["accounting"]
    assert (entry.epsilon, entry.delta, entry.relation, entry.noise) == (1.0, 0.0, "replace", "laplace")


def test_queries_with_a_test_seed_histogram_requests_and_bad_input():
    records = _records(4) + [{"ts": 12.0, "cell": 9}, {"ts": 13.0}, {"ts": 500.0, "cell": 0}]
    queries = _queries(np.linspace(1, 99, 30))
    queries += [{"ts": 50.0, "f": "histogram", "id": 100, "k": "a"},
                {"ts": 51.0, "f": [1, 2, 0, 0], "id": 101, "k": "a"},
                {"ts": 52.0, "f": [1, 0], "id": 102, "k": "a"},
                {"ts": 53.0, "f": "first two cells", "id": 103, "k": "a"}]
    test_seed = 11
    predicate = lambda i: i < 2                                   # a predicate on cell indices
    args = {**PMWG_ARGS, "query_fn": lambda q: predicate if q["f"] == "first two cells" else q["f"]}
    transform = dpb.GrowingQueries(n=100, delta=1e-6, rng=test_seed, **args)
    out = _run(transform, records, queries)
    _, answers, (hist,) = _split(out["releases"])
    assert hist.query_id == 100 and hist.step == 5 and abs(sum(hist.weights) - 1) < 1e-12
    assert sorted(a.query_id for a in answers) == list(range(30)) + [103]
    hard = [a for a in answers if a.kind == "hard"]
    assert hard and all(a.noise_std == pytest.approx(transform.params.xi(a.t) * 2 * 2 ** 0.5) for a in hard)
    reasons = sorted(bad.reason for bad in out["invalid"])
    assert len(reasons) == 5
    assert any("universe_fn returned 9" in r for r in reasons)
    assert any("universe_fn raised KeyError" in r for r in reasons)
    assert any("at or after end" in r for r in reasons)
    assert any("[0, 1]" in r for r in reasons) and any("N = 4 entries" in r for r in reasons)


def test_queries_streaming_matches_batch():
    records = _records(5, steps=6)
    queries = _queries(np.linspace(1, 59, 25))
    ev = lambda e: TimestampedValue(e, e["ts"])
    stream = test_stream.TestStream()
    for s in range(6):
        stream = stream.add_elements([ev(e) for e in records + queries if s * STEP <= e["ts"] < (s + 1) * STEP])
        stream = stream.advance_watermark_to((s + 1) * STEP)
    stream = stream.advance_watermark_to_infinity()
    make = lambda: dpb.GrowingQueries(n=80, rng=ZeroNoise(), **{**PMWG_ARGS, "end": 60})
    streamed = _run(make(), None, options=streaming_options(), stream=stream)
    batch = _run(make(), records, queries)
    key = lambda a: a.query_id
    assert sorted(_split(streamed["releases"])[1], key=key) == sorted(_split(batch["releases"])[1], key=key)
    assert len(streamed["accounting"]) == 1


def test_declared_keys_each_have_their_database():
    records = _records(6)
    queries = _queries(np.linspace(1, 99, 20)) + [{"ts": 30.0, "f": [1, 0, 0, 0], "id": 50, "k": "b"},
                                                  {"ts": 31.0, "f": [1, 0, 0, 0], "id": 51, "k": "z"}]
    transform = dpb.GrowingQueries(n=60, rng=ZeroNoise(), key_fn=lambda r: r["k"], keys=["a", "b"],
                                   query_key_fn=lambda q: q["k"], **PMWG_ARGS)
    out = _run(transform, records, queries)
    _, answers, _ = _split(out["releases"])
    expected, _ = _engine_answers(records, [q for q in queries if q["k"] == "a"], transform.params,
                                  key="a")
    got = {a.query_id: (a.kind, a.value, a.t, a.hard, a.cap) for a in answers if a.key == "a"}
    assert got == expected
    assert [a.key for a in answers if a.query_id == 50] == ["b"]
    assert sorted(e.key for e in out["accounting"]) == ["a", "b"]
    assert all(e.scope == "key" for e in out["accounting"])
    assert [bad.reason for bad in out["invalid"]] == ["undeclared key 'z' (not in keys)"]


def test_budget_composition_under_the_replace_relation():
    def build(p):
        recs = p | beam.Create(_records(7))
        pmwg = recs | "pmwg" >> dpb.GrowingQueries(n=100, rng=ZeroNoise(), **{**PMWG_ARGS, "epsilon": 0.5})
        count = recs | "count" >> dpb.ContinualCount(epsilon=0.25, timestamp_fn=lambda r: r["ts"],
                                                      rng=ZeroNoise(), **SCHEDULE)
        reports = dpb.plan((pmwg.accounting, count.accounting), dpb.Budget(epsilon=1.0, relation="replace"))
        (report,) = [r for r in reports if r.relation == "replace"]
        assert report.epsilon == pytest.approx(0.5 + 2 * 0.25)     # add/remove counted twice
        with pytest.raises(ValueError):
            dpb.plan((pmwg.accounting, count.accounting), dpb.Budget(epsilon=0.9, relation="replace"))
        with pytest.raises(ValueError):           # a replace charge bounds no add/remove total
            dpb.plan((pmwg.accounting,), dpb.Budget(epsilon=10.0, relation="add/remove"))
        return {"ledger": pmwg.accounting}
    collect(batch_options(), build)


def test_eager_validation_names_the_parameter():
    box = LaplaceHistogram(N)
    common = dict(universe_fn=lambda r: r["cell"], step=STEP, start=0)
    cases = [
        (lambda: dpb.GrowingSynthetic(universe_size=5, black_box=box, epsilon=1.0, n=10, **common), "universe_size"),
        (lambda: dpb.GrowingSynthetic(universe_size=1, black_box=box, epsilon=1.0, n=10, **common), "universe_size"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box="mwem", epsilon=1.0, n=10, **common), "black_box"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=-1.0, n=10, **common), "epsilon"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=1.0, n=10,
                                      scheduler="weekly", **common), "scheduler"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=1.0, n=10,
                                      scheduler="every_step", **common), "delta"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=1.0, n=0, **common), "n"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=1.0, n=10, gamma=2.0, **common), "gamma"),
        (lambda: dpb.GrowingSynthetic(universe_size=N, black_box=box, epsilon=1.0, n=10,
                                      universe_fn=None, step=STEP, start=0), "universe_fn"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, **common), "n"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=2.0, epsilon=1.0, n=10, **common), "alpha"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10,
                                    pmwg_options={"xi_n": 1e-9}, **common), "xi_n"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10,
                                    pmwg_options={"alpha": 0.1}, **common), "pmwg_options"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10, key_fn=lambda r: 1,
                                    keys=[1], **common), "query_key_fn"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10, key_fn=lambda r: 1,
                                    keys=dpb.PrivateKeys(epsilon=1.0, delta=1e-6), query_key_fn=lambda q: 1,
                                    **common), "PrivateKeys"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10, universe_fn=lambda r: 0,
                                    step=STEP), "start"),
        (lambda: dpb.GrowingQueries(universe_size=N, alpha=0.3, epsilon=1.0, n=10, queries=[1], **common), "queries"),
    ]
    for make, name in cases:
        with pytest.raises(ValueError, match=name):
            make()


def test_bounded_input_needs_an_end():
    transform = dpb.GrowingQueries(lambda r: r["cell"], N, alpha=0.3, epsilon=1.0, n=10, step=STEP, start=0)
    with pytest.raises(ValueError, match="end is required"):
        _run(transform, _records(8, steps=2))


def test_design_names_are_aliases():
    assert issubclass(dpb.PMWG, dpb.GrowingQueries)
    sched = dpb.BBScheduler(lambda r: r["cell"], N, black_box=LaplaceHistogram(N), epsilon=1.0,
                            n=100, gamma=0.5, rng=ZeroNoise(), timestamp_fn=lambda r: r["ts"],
                            **SCHEDULE)
    records = _records(10)
    direct = dpb.GrowingSynthetic(black_box=LaplaceHistogram(N), epsilon=1.0, n=100, gamma=0.5,
                                  rng=ZeroNoise(), **SYNTH)
    same = lambda r: r._replace(transform="")              # the label is the class name
    assert [same(r) for r in _split(_run(sched, records)["releases"])[0]] == \
        [same(r) for r in _split(_run(direct, records)["releases"])[0]]
    with pytest.raises(ValueError, match="scheduler"):
        dpb.BBImprover(lambda r: 0, N, black_box=LaplaceHistogram(N), epsilon=1.0, delta=1e-6,
                       n=10, scheduler="epochs", **SCHEDULE)


def test_input_in_fixed_windows_releases_what_global_input_releases():
    """The schedule decides the steps, not the input's windows (design D2.1)."""
    records = _records(2) + [{"ts": 5.0, "cell": N + 3, "k": "a"}]
    plain, windowed = global_and_windowed(
        records, lambda e: e["ts"], STEP,
        lambda: dpb.GrowingSynthetic(black_box=LaplaceHistogram(N), epsilon=1.0, n=100,
                                     gamma=0.5, rng=3, **SYNTH))
    assert plain[0] and plain[1] and windowed == plain
