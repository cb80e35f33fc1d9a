"""CombineAccounting: planned costs at construction, merged ledger at run time."""

import apache_beam as beam
import numpy as np
import pytest

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from dp_beam.accounting.compose import per_transform
from dp_beam.transforms.accounting import plan_entries
from tests.beam_util import batch_options, collect

EVENTS = [{"ts": float(t), "carrier": c, "delay": float(t % 7)}
          for t, c in zip(range(0, 60, 3), ["AA", "UA", "DL"] * 20)]
CARRIERS = ["AA", "UA", "DL"]
# The public schedule of EVENTS: steps 0..5 of 10 s.
SCHEDULE = dict(start=0, end=60)


def _pipeline(p, count_eps, sum_eps, budget):
    events = p | beam.Create(EVENTS)
    counts = events | "counts" >> dpb.ContinualCount(
        epsilon=count_eps, step=10, timestamp_fn=lambda e: e["ts"],
        key_fn=lambda e: e["carrier"], keys=CARRIERS, rng=ZeroNoise(), **SCHEDULE)
    sums = events | "delays" >> dpb.ContinualSum(
        value_fn=lambda e: e["delay"], lower=0, upper=10, epsilon=sum_eps, step=10,
        timestamp_fn=lambda e: e["ts"], rng=ZeroNoise(), **SCHEDULE)
    combine = dpb.CombineAccounting(budget)
    report = (counts.accounting, sums.accounting) | combine
    return counts, sums, combine, report


def test_merged_ledger_matches_the_plan_and_stays_within_it():
    holder = {}

    def build(p):
        counts, sums, combine, report = _pipeline(p, 0.4, 0.6, dpb.Budget(epsilon=1.0))
        holder["planned"] = combine.planned
        ledger = (counts.accounting, sums.accounting) | "ledger" >> beam.Flatten()
        return {"report": report, "ledger": ledger}
    out = collect(batch_options(), build)
    # One entry per carrier stream plus one for the unkeyed sum stream.
    assert sorted((e.transform, e.key) for e in out["ledger"]) == [
        ("counts", "AA"), ("counts", "DL"), ("counts", "UA"), ("delays", None)]
    planned_event = holder["planned"][0]
    assert planned_event.epsilon == pytest.approx(1.0)
    event_reports = [r for r in out["report"] if r.unit == "event"]
    final = max(event_reports, key=lambda r: len(r.lines))
    assert len(final.lines) == 4
    # Parallel across the carriers, sequential across the two transforms.
    assert final.epsilon == pytest.approx(1.0) and final.within_budget
    for r in event_reports:  # every intermediate report too
        assert r.epsilon <= planned_event.epsilon + 1e-12


def test_over_budget_pipeline_fails_at_construction():
    with pytest.raises(ValueError, match=r"budget exceeded.*counts.*delays"):
        with beam.Pipeline(options=batch_options()) as p:
            _pipeline(p, 0.6, 0.6, dpb.Budget(epsilon=1.0))


def test_plan_without_running_and_rejects_derived_pcollections():
    with beam.Pipeline(options=batch_options()) as p:
        counts, sums, _, _ = _pipeline(p, 0.5, 0.5, dpb.Budget(epsilon=1.0))
        reports = dpb.plan({"c": counts.accounting, "s": sums.accounting})
        assert reports[0].epsilon == pytest.approx(1.0)
        derived = counts.accounting | beam.Map(lambda e: e)
        with pytest.raises(ValueError, match="no privacy plan"):
            dpb.plan([derived])


def _factories():
    ts = dict(timestamp_fn=lambda e: e["ts"], step=10, rng=7, **SCHEDULE)
    erm = dict(features_fn=lambda e: [e["delay"] / 10, 0.5], label_fn=lambda e: int(e["delay"] > 3),
               classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1, epsilon=0.3)
    return {
        "count": lambda: dpb.ContinualCount(epsilon=0.3, key_fn=lambda e: e["carrier"],
                                            keys=CARRIERS, **ts),
        "user count": lambda: dpb.ContinualCount(
            epsilon=0.2, privacy_unit="user", user_fn=lambda e: e["carrier"],
            max_contributions=3, **ts),
        "sum": lambda: dpb.ContinualSum(value_fn=lambda e: e["delay"], lower=0, upper=10,
                                        epsilon=0.25, **ts),
        "gaussian sum": lambda: dpb.ContinualSum(
            value_fn=lambda e: e["delay"], lower=0, upper=10, epsilon=0.5, noise="gaussian",
            delta=1e-7, **ts),
        "monotone count": lambda: dpb.ContinualCount(epsilon=0.1, monotone=True, **ts),
        "mean": lambda: dpb.ContinualMean(
            user_fn=lambda e: e["carrier"], value_fn=lambda e: e["delay"], lower=0, upper=10,
            max_samples_per_user=8, epsilon=0.3, **ts),
        "continual erm": lambda: dpb.ContinualERM(block_size=4, base_size=8, **erm, **ts),
        "sliding erm": lambda: dpb.SlidingWindowERM(block_size=4, window=12, **erm, **ts),
        "multi-resolution erm": lambda: dpb.MultiResolutionERM(block_size=4, **erm, **ts),
    }


def test_runtime_ledger_never_exceeds_the_plan_for_every_transform_type():
    holder = {}

    def build(p):
        events = p | beam.Create(EVENTS)
        results = {name: events | name >> make() for name, make in _factories().items()}
        accounting = {name: r.accounting for name, r in results.items()}
        # The ERM streams are private for replacing one event (count-triggered
        # blocks): the budget that can hold them all is stated for "replace".
        # The user-level total counts the event-level transforms over the
        # mean's 8 samples per user, the largest per-user cap of the plan.
        combine = dpb.CombineAccounting(dpb.Budget(epsilon=30.0, delta=1e-6, relation="replace"))
        holder["combine"] = combine
        holder["plan"] = per_transform(plan_entries(accounting))
        return {"report": accounting | combine,
                "ledger": tuple(accounting.values()) | "ledger" >> beam.Flatten()}
    out = collect(batch_options(), build)
    planned = {(r.unit, r.relation): r for r in holder["combine"].planned}
    assert set(planned) == {(unit, relation) for unit in ("event", "user")
                            for relation in ("add/remove", "replace")}
    for unit in ("event", "user"):
        # Mixed relations: no add/remove bound (the ERM streams), a replace one within budget.
        assert planned[unit, "add/remove"].epsilon is None
        assert "erm" in planned[unit, "add/remove"].note
        assert planned[unit, "replace"].within_budget
        assert planned[unit, "replace"].budget_epsilon == 30.0
    assert "over at most 8 events per user" in planned["user", "replace"].note
    seen = set()
    for r in out["report"]:
        plan = planned[r.unit, r.relation]
        seen.add((r.unit, r.relation))
        if plan.epsilon is None:
            assert r.epsilon is None
            continue
        assert r.epsilon <= plan.epsilon + 1e-12 and r.rho <= plan.rho + 1e-12
        assert r.epsilon_at_delta <= plan.epsilon_at_delta + 1e-9
    assert seen == set(planned)
    # Every transform type charged at run time what it planned per stream, no more.
    charged = per_transform(out["ledger"])
    assert set(charged) == set(_factories())
    for name, entry in charged.items():
        planned_entry = holder["plan"][name]
        assert (entry.epsilon, entry.delta, entry.rho) == (
            planned_entry.epsilon, planned_entry.delta, planned_entry.rho)


def test_monotone_option_never_decreases_and_leaves_the_ledger_unchanged():
    events = [{"ts": float(t), "carrier": "AA", "delay": 1.0} for t in range(0, 200, 7)]

    def run(monotone):
        def build(p):
            res = p | beam.Create(events) | "c" >> dpb.ContinualCount(
                epsilon=0.05, step=10, timestamp_fn=lambda e: e["ts"], monotone=monotone,
                start=0, end=200, rng=11)
            return {"releases": res.releases, "accounting": res.accounting}
        return collect(batch_options(), build)
    plain, mono = run(False), run(True)
    assert sorted(r.step for r in mono["releases"]) == list(range(20))
    values = [r.value for r in sorted(mono["releases"], key=lambda r: r.step)]
    raw = [r.value for r in sorted(plain["releases"], key=lambda r: r.step)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    # The same noise (same seed per key and step) post-processed: a running max.
    assert values == pytest.approx(np.maximum.accumulate(raw).tolist())
    assert any(v != r for v, r in zip(values, raw))  # the option did something
    assert [e._replace(mechanism="") for e in mono["accounting"]] == \
        [e._replace(mechanism="") for e in plain["accounting"]]
    with pytest.raises(ValueError, match="monotone"):
        dpb.ContinualSum(value_fn=float, lower=-1, upper=1, epsilon=1, step=1, start=0,
                         monotone=True)


def test_stability_scales_the_plan_and_the_ledger():
    holder = {}

    def build(p):
        res = p | beam.Create(EVENTS) | "c" >> dpb.ContinualCount(
            epsilon=0.2, step=10, timestamp_fn=lambda e: e["ts"], rng=ZeroNoise(), **SCHEDULE)
        scaled = res.accounting | dpb.Stability(3)
        holder["plan"] = dpb.plan([scaled])
        return {"ledger": scaled}
    out = collect(batch_options(), build)
    (entry,) = out["ledger"]
    assert entry.epsilon == pytest.approx(0.6) and entry.group == 3
    assert "3-stable" in entry.neighbours
    assert holder["plan"][0].epsilon == pytest.approx(0.6)
    with pytest.raises(ValueError, match="budget exceeded"):
        with beam.Pipeline(options=batch_options()) as p:
            res = p | beam.Create(EVENTS) | dpb.ContinualCount(
                epsilon=0.4, step=10, timestamp_fn=lambda e: e["ts"], **SCHEDULE)
            _ = (res.accounting | dpb.Stability(3)) | dpb.CombineAccounting(dpb.Budget(1.0))


def test_streaming_report_covers_every_declared_key_from_start():
    # Formerly a key's stream (and its ledger entry) started at the key's first event,
    # so the report grew when "UA" first appeared at t=35. The key set is now public:
    # every declared key's stream opens at start, so all three entries (including "DL",
    # which never has an event) are charged at the end of the first step, t=10, before
    # any of "UA"'s events, and the report reaches all three lines.
    from apache_beam.testing.test_stream import TestStream as _TestStream
    from apache_beam.transforms.window import TimestampedValue
    from tests.beam_util import streaming_options
    ev = lambda ts, c: TimestampedValue({"carrier": c}, ts)
    stream = (_TestStream()
              .add_elements([ev(1.0, "AA")])
              .advance_watermark_to(30)
              .add_elements([ev(35.0, "UA")])
              .advance_watermark_to(60)
              .advance_watermark_to_infinity())

    def build(p):
        counts = p | stream | "c" >> dpb.ContinualCount(
            epsilon=0.5, step=10, key_fn=lambda e: e["carrier"], keys=CARRIERS,
            rng=ZeroNoise(), **SCHEDULE)
        charged = counts.accounting | "charged at" >> beam.Map(
            lambda e, ts=beam.DoFn.TimestampParam: (e.key, ts.micros / 1e6))
        return {"report": (counts.accounting,) | dpb.CombineAccounting(dpb.Budget(1.0)),
                "charged": charged}
    out = collect(streaming_options(), build)
    assert sorted(out["charged"]) == [("AA", 10.0), ("DL", 10.0), ("UA", 10.0)]
    sizes = [len(r.lines) for r in out["report"]]
    assert sizes and sizes == sorted(sizes) and max(sizes) == 3
    assert all(r.epsilon == pytest.approx(0.5) for r in out["report"])  # parallel across keys


def test_every_transform_states_its_neighbour_relation():
    expected = {"count": "add/remove", "user count": "add/remove", "sum": "add/remove",
                "gaussian sum": "add/remove", "monotone count": "add/remove",
                "mean": "add/remove", "continual erm": "replace", "sliding erm": "replace",
                "multi-resolution erm": "replace"}
    for name, make in _factories().items():
        entry = make().plan_entry(name)
        assert entry.relation == expected[name], name
        assert entry.version == 2
    values = dpb.ContinualMean(user_fn=lambda e: e["carrier"], value_fn=lambda e: e["delay"],
                               lower=0, upper=10, max_samples_per_user=8, epsilon=0.3,
                               neighbours="values", step=10, **SCHEDULE)
    assert values.plan_entry("m").relation == "values"
    assert values.plan_entry("m").neighbours == "values"  # the text stays as it was
    keys = dpb.PrivateKeys(epsilon=0.5, delta=1e-6)
    assert keys.ledger_entry("c", "user", 6).relation == "add/remove"


def _mean_and_user_count(p, budget):
    events = p | beam.Create(EVENTS)
    ts = dict(timestamp_fn=lambda e: e["ts"], step=10, rng=ZeroNoise(), **SCHEDULE)
    mean = events | "mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["carrier"], value_fn=lambda e: e["delay"], lower=0, upper=10,
        max_samples_per_user=8, epsilon=0.5, neighbours="values", **ts)
    count = events | "users" >> dpb.ContinualCount(
        epsilon=0.5, privacy_unit="user", user_fn=lambda e: e["carrier"], max_contributions=8,
        **ts)
    accountings = (mean.accounting, count.accounting)
    combine = dpb.CombineAccounting(budget)
    _ = accountings | combine
    return combine, accountings


def test_a_values_mean_and_an_add_remove_count_are_refused_under_an_add_remove_budget():
    # Audit: this plan was reported as user ε = 1.0 within budget, but the values mean
    # publishes exact user counts, so adding or removing a user is not bounded at all.
    with pytest.raises(ValueError) as err:
        with beam.Pipeline(options=batch_options()) as p:
            _mean_and_user_count(p, dpb.Budget(epsilon=2.0))
    msg = str(err.value)
    assert "no 'add/remove' bound" in msg and "'mean'" in msg
    assert 'neighbours="participation"' in msg and 'relation="values"' in msg
    with beam.Pipeline(options=batch_options()) as p:
        combine, accountings = _mean_and_user_count(p, dpb.Budget(epsilon=1.5, relation="values"))
        reports = dpb.plan(accountings)  # no budget: every total, none budgeted
    planned = {(r.unit, r.relation): r for r in combine.planned}
    assert list(planned) == [("event", "add/remove"), ("event", "values"),
                             ("user", "add/remove"), ("user", "values")]
    assert planned["user", "add/remove"].epsilon is None
    assert planned["user", "values"].epsilon == pytest.approx(0.5 + 2 * 0.5)
    assert planned["user", "values"].within_budget
    assert planned["user", "values"].budget_epsilon == 1.5
    assert [(r.unit, r.relation, r.epsilon) for r in reports] == [
        (r.unit, r.relation, r.epsilon) for r in combine.planned]
    assert all(r.budget_epsilon is None for r in reports)
