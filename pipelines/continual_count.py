"""Demo job: hourly departures and running departure delay of NYC flights, released privately.

Every flight of 2013 is an event stamped with its scheduled departure. Two
continual releases read the same events, each at ε/2, so under event-level
privacy they compose sequentially to ε (default 1.0); the plan is checked
against that budget at construction. Outputs, under ``--output``:

- ``releases.jsonl``: one private release per hour per transform (running totals)
- ``ledger.jsonl``: the privacy charges of both transforms
- ``report.jsonl``: the combined accounting report, checked against the budget
- ``invalid.jsonl``: events a transform could not use (cancelled flights have no delay)
- ``continual_count.png``: the releases with their 95 % bands

Run ``python -m pipelines.continual_count --output out [--truth] [--days N]``.
Unrecognised flags are passed to Beam, so ``--runner PortableRunner
--job_endpoint ...`` runs the same job on a portable runner.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from datetime import timedelta

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from pipelines.flights import flights_csv_path, load_flights

STEP = timedelta(hours=1)
DELAY_LOWER, DELAY_UPPER = -30, 120
COUNT_LABEL = "hourly departures"
SUM_LABEL = "delay minutes"


def departure_time(event):
    return beam.window.TimestampedValue(event, event["ts"])


def delay_minutes(event):
    return event["dep_delay"]


def read_flights(path, limit_days=None):
    return load_flights(limit_days=limit_days, path=path)


def build(p, epsilon, output_dir, limit_days=None):
    """Adds the demo to pipeline ``p``; returns the paths it writes."""
    # The file is read inside the pipeline, as a job reads its source: an
    # in-memory Create would pickle and compress every event into the job graph.
    events = (p
              | "flights file" >> beam.Create([flights_csv_path()])
              | "read flights" >> beam.FlatMap(read_flights, limit_days=limit_days)
              | "event time" >> beam.Map(departure_time))
    # Both transforms read every event, so their costs add up (sequential
    # composition): half the budget each keeps the total at epsilon.
    count = events | COUNT_LABEL >> dpb.ContinualCount(epsilon=epsilon / 2, step=STEP)
    delay = events | SUM_LABEL >> dpb.ContinualSum(
        value_fn=delay_minutes, lower=DELAY_LOWER, upper=DELAY_UPPER,
        epsilon=epsilon / 2, step=STEP)
    report = ((count.accounting, delay.accounting)
              | "check budget" >> dpb.CombineAccounting(dpb.Budget(epsilon=epsilon)))

    paths = {name: os.path.join(output_dir, f"{name}.jsonl")
             for name in ("releases", "ledger", "report", "invalid")}
    outputs = {
        "releases": (count.releases, delay.releases),
        "ledger": (count.accounting, delay.accounting),
        "report": (report,),
        "invalid": (count.invalid, delay.invalid),
    }
    for name, pcolls in outputs.items():
        merged = pcolls[0] if len(pcolls) == 1 else pcolls | f"merge {name}" >> beam.Flatten()
        merged | f"write {name}" >> dpb.io.WriteJsonLines(paths[name])
    return paths


def running_truth(flights, step_seconds):
    """Non-private running count and clamped delay sum per step, empty steps included.

    Computed in plain Python from the same events, for comparison on public
    data only; returns ``{label: [(window_end, running_value), ...]}``.
    """
    counts, sums = defaultdict(int), defaultdict(float)
    for e in flights:
        k = e["ts"] // step_seconds
        counts[k] += 1
        if e["dep_delay"] is not None:
            sums[k] += min(max(e["dep_delay"], DELAY_LOWER), DELAY_UPPER)
    truth = {}
    for label, per_step in ((COUNT_LABEL, counts), (SUM_LABEL, sums)):
        total, series = 0, []
        for k in range(min(counts), max(counts) + 1):
            total += per_step.get(k, 0)
            series.append(((k + 1) * step_seconds, total))
        truth[label] = series
    return truth


def read_jsonl(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def ledger_epsilon(entries):
    """Total ε per privacy unit of ledger lines read back from JSON (dp_beam's composition)."""
    fields = dpb.LedgerEntry._fields
    records = [dpb.LedgerEntry(**{k: v for k, v in e.items() if k in fields}) for e in entries]
    return {r.unit: r.epsilon for r in dpb.accounting.compose(records) if r.epsilon is not None}


def summarise(paths, elapsed, out=sys.stdout):
    releases = read_jsonl(paths["releases"])
    invalid = read_jsonl(paths["invalid"])
    ledger = read_jsonl(paths["ledger"])
    steps = defaultdict(int)
    for r in releases:
        steps[r["transform"]] += 1
    print(f"wall time: {elapsed:.1f} s", file=out)
    for name, n in sorted(steps.items()):
        print(f"steps released by {name!r}: {n}", file=out)
    reasons = defaultdict(int)
    for rec in invalid:
        reasons[(rec["transform"], rec["reason"])] += rec.get("count", 1)
    print(f"invalid events: {sum(reasons.values())}", file=out)
    for (name, reason), n in sorted(reasons.items()):
        print(f"  {name!r}: {reason}: {n}", file=out)
    for unit, eps in sorted(ledger_epsilon(ledger).items()):
        print(f"total epsilon from the ledger ({unit}-level): {eps:g}", file=out)
    for rep in read_jsonl(paths["report"]):
        if rep["transforms"]:
            verdict = "within" if rep["within_budget"] else "OVER"
            print(f"budget check ({rep['unit']}-level): epsilon {rep['epsilon']:g} of "
                  f"{rep['budget_epsilon']:g}, {verdict} budget", file=out)
        elif rep.get("note"):
            print(f"budget check ({rep['unit']}-level): {rep['note']}", file=out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="directory for the outputs")
    parser.add_argument("--epsilon", type=float, default=1.0, help="total privacy budget")
    parser.add_argument("--days", type=int, default=None,
                        help="use only the first N days of 2013 (quick runs)")
    parser.add_argument("--truth", action="store_true",
                        help="also plot the non-private values (public demo data only)")
    parser.add_argument("--runner", default="FnApiRunner",
                        help="Beam runner; pinned because the default one tries to download "
                             "a binary first")
    return parser.parse_known_args(argv)


def main(argv=None):
    args, beam_args = parse_args(argv)
    output_dir = os.path.abspath(args.output)
    os.makedirs(output_dir, exist_ok=True)

    start = time.perf_counter()
    options = PipelineOptions(beam_args, runner=args.runner)
    with beam.Pipeline(options=options) as p:
        paths = build(p, args.epsilon, output_dir, limit_days=args.days)
    elapsed = time.perf_counter() - start

    from pipelines.plotting import plot_releases

    half = args.epsilon / 2
    titles = {
        COUNT_LABEL: f"Running count of departures, hourly steps (ε = {half:g})",
        SUM_LABEL: (f"Running sum of departure delay in minutes, clamped to "
                    f"[{DELAY_LOWER}, {DELAY_UPPER}] (ε = {half:g})"),
    }
    truth = None
    if args.truth:
        truth = running_truth(load_flights(limit_days=args.days), int(STEP.total_seconds()))
    png = plot_releases(paths["releases"], os.path.join(output_dir, "continual_count.png"),
                        truth=truth, titles=titles)
    summarise(paths, elapsed)
    print(f"plot: {png}")
    return paths


if __name__ == "__main__":
    main()
