"""CombineAccounting: planned costs at construction, merged ledger at run time."""

import apache_beam as beam
import pytest

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from tests.beam_util import batch_options, collect

EVENTS = [{"ts": float(t), "carrier": c, "delay": float(t % 7)}
          for t, c in zip(range(0, 60, 3), ["AA", "UA", "DL"] * 20)]


def _pipeline(p, count_eps, sum_eps, budget):
    events = p | beam.Create(EVENTS)
    counts = events | "counts" >> dpb.ContinualCount(
        epsilon=count_eps, step=10, timestamp_fn=lambda e: e["ts"],
        key_fn=lambda e: e["carrier"], rng=ZeroNoise())
    sums = events | "delays" >> dpb.ContinualSum(
        value_fn=lambda e: e["delay"], lower=0, upper=10, epsilon=sum_eps, step=10,
        timestamp_fn=lambda e: e["ts"], rng=ZeroNoise())
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
