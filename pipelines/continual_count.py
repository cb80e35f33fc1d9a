"""Demo job: hourly departures and running departure delay of NYC flights, released privately.

Every flight of 2013 is an event stamped with its scheduled departure. Two
continual releases read the same events, each at ε/2, so under event-level
privacy they compose sequentially to ε (``--epsilon``, the total budget,
default 1.0); the plan is checked against that budget at construction.
Outputs, under ``--output``:

- ``releases.jsonl``: one private release per hour per transform (running totals)
- ``ledger.jsonl``: the privacy charges of both transforms
- ``report.jsonl``: the combined accounting report, checked against the budget
- ``invalid.jsonl``: events a transform could not use (cancelled flights have no delay)
- ``continual_count.png``: the releases with their 95 % bands

Both streams release every hour of a public schedule, ``--start`` to
``--end`` (by default the data set's period: 2013 in New York local time, or
its first ``--days`` days), whether flights departed in that hour or not.

Run ``python -m pipelines.continual_count --output out [--truth] [--days N]``
or ``dp-beam run continual_count ...``. Unrecognised flags are passed to Beam,
so ``--runner PortableRunner --job_endpoint ...`` runs the same job on a
portable runner. ``--output`` may be a ``gs://`` folder (Beam's GCS filesystem).
"""

import logging
import os
import sys
from collections import defaultdict
from datetime import timedelta

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from dp_beam.report import join as join_path, read_jsonl
from dp_beam.transforms.schedule import resolve_schedule
from pipelines.flights import PERIOD_START, flights_csv_path, load_flights, period_end
from pipelines.jobs import (LogProgress, check_options, job_parser, output_dir, plan_only,
                           print_dead_letters_and_budget, release_period, run)

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


_LOG = logging.getLogger("dp_beam.jobs.continual_count")


def build(p, epsilon, output_dir, limit_days=None, seed=None, start=None, end=None):
    """Adds the demo to pipeline ``p``; returns the paths it writes.

    ``start``/``end`` are the public schedule (default: the data set's period,
    :data:`~pipelines.flights.PERIOD_START` to ``period_end(limit_days)``).
    """
    return _build(p, epsilon, output_dir, limit_days, seed, start, end)[0]


def _build(p, epsilon, output_dir, limit_days=None, seed=None, start=None, end=None):
    """Adds the demo to ``p``; returns (paths, {label: accounting}, budget)."""
    # The schedule is declared (job options), never taken from the flights.
    start = PERIOD_START if start is None else start
    end = period_end(limit_days) if end is None else end
    # The file is read inside the pipeline, as a job reads its source: an
    # in-memory Create would pickle and compress every event into the job graph.
    events = (p
              | "flights file" >> beam.Create([flights_csv_path()])
              | "read flights" >> beam.FlatMap(read_flights, limit_days=limit_days)
              | "event time" >> beam.Map(departure_time)
              | "progress events" >> beam.ParDo(LogProgress("events read")))
    # Both transforms read every event, so their costs add up (sequential
    # composition): half the budget each keeps the total at epsilon.
    count = events | COUNT_LABEL >> dpb.ContinualCount(
        epsilon=epsilon / 2, step=STEP, start=start, end=end, rng=seed)
    delay = events | SUM_LABEL >> dpb.ContinualSum(
        value_fn=delay_minutes, lower=DELAY_LOWER, upper=DELAY_UPPER,
        epsilon=epsilon / 2, step=STEP, start=start, end=end, rng=seed)
    budget = dpb.Budget(epsilon=epsilon)
    accountings = {COUNT_LABEL: count.accounting, SUM_LABEL: delay.accounting}
    report = ((count.accounting, delay.accounting)
              | "check budget" >> dpb.CombineAccounting(budget))

    paths = {name: join_path(output_dir, f"{name}.jsonl")
             for name in ("releases", "ledger", "report", "invalid")}
    outputs = {
        "releases": (count.releases, delay.releases),
        "ledger": (count.accounting, delay.accounting),
        "report": (report,),
        "invalid": (count.invalid, delay.invalid),
    }
    # Releases are logged by the transforms themselves (dp_beam.progress).
    for name, pcolls in outputs.items():
        merged = pcolls[0] if len(pcolls) == 1 else pcolls | f"merge {name}" >> beam.Flatten()
        merged | f"write {name}" >> dpb.io.WriteJsonLines(paths[name])
    return paths, accountings, budget


def step_range(step_seconds, start, end):
    """The steps a transform releases for ``start``/``end`` (ISO-8601 or epoch seconds)."""
    schedule = resolve_schedule(step_seconds, start, end)
    return range(schedule.start_step, schedule.end_step)


def running_truth(flights, step_seconds, start=None, end=None):
    """Non-private running count and clamped delay sum per step, empty steps included.

    Computed in plain Python from the same events, for comparison on public
    data only; returns ``{label: [(window_end, running_value), ...]}``. With
    ``start`` and ``end`` (the job's public schedule) the series has one point
    per released step and leaves out flights outside it, as the transforms do;
    without them it spans the flights' own first to last step.
    """
    counts, sums = defaultdict(int), defaultdict(float)
    steps = step_range(step_seconds, start, end) if start is not None else None
    for e in flights:
        k = e["ts"] // step_seconds
        if steps is not None and k not in steps:
            continue
        counts[k] += 1
        if e["dep_delay"] is not None:
            sums[k] += min(max(e["dep_delay"], DELAY_LOWER), DELAY_UPPER)
    if steps is None:
        steps = range(min(counts), max(counts) + 1)
    truth = {}
    for label, per_step in ((COUNT_LABEL, counts), (SUM_LABEL, sums)):
        total, series = 0, []
        for k in steps:
            total += per_step.get(k, 0)
            series.append(((k + 1) * step_seconds, total))
        truth[label] = series
    return truth


def summarise(paths, elapsed, out=None):
    # Resolved per call: a default bound at import would keep a replaced stream.
    out = out or sys.stdout
    releases = read_jsonl(paths["releases"])
    invalid = read_jsonl(paths["invalid"])
    ledger = read_jsonl(paths["ledger"])
    steps = defaultdict(int)
    for r in releases:
        steps[r["transform"]] += 1
    print(f"wall time: {elapsed:.1f} s", file=out)
    for name, n in sorted(steps.items()):
        print(f"steps released by {name!r}: {n}", file=out)
    print_dead_letters_and_budget(invalid, ledger, paths["report"], out)


def make_parser():
    parser = job_parser("continual_count", __doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="total privacy budget (event level, default 1); the count and the "
                             "sum each get half, and compose sequentially to it")
    parser.add_argument("--truth", action="store_true",
                        help="also plot the non-private values (public demo data only)")
    return parser


def parse_args(argv):
    args, beam_args = make_parser().parse_known_args(argv)
    return check_options(args), beam_args


def _construct(args, beam_args, create_output=True):
    options = PipelineOptions(beam_args, runner=args.runner)
    p = beam.Pipeline(options=options)
    start, end = release_period(args)
    paths, accountings, budget = _build(p, args.epsilon, output_dir(args.output, create_output),
                                        limit_days=args.days, seed=args.seed, start=start,
                                        end=end)
    return p, paths, accountings, budget


def build_pipeline(argv):
    """Constructs the job without running it: ``(pipeline, {label: accounting}, budget)``."""
    return plan_only(argv, parse_args, _construct)


def main(argv=None):
    args, beam_args = parse_args(argv)
    p, paths, _, _ = _construct(args, beam_args)
    finished = run(p, "continual_count", args.runner, paths, args.no_wait, _LOG)
    if finished is None:
        return paths
    elapsed = finished.elapsed
    if "://" in paths["releases"]:
        summarise(paths, elapsed)
        print("plot: skipped for a remote output; render it with `dp-beam report`")
        finished.check_invalid(args.max_invalid_fraction)
        return paths

    from dp_beam.report import plot_series, series_of

    half = args.epsilon / 2
    titles = {
        COUNT_LABEL: f"Running count of departures, hourly steps (ε = {half:g})",
        SUM_LABEL: (f"Running sum of departure delay in minutes, clamped to "
                    f"[{DELAY_LOWER}, {DELAY_UPPER}] (ε = {half:g})"),
    }
    truth = None
    if args.truth:
        truth = running_truth(load_flights(limit_days=args.days), int(STEP.total_seconds()),
                              *release_period(args))
    output_dir = os.path.dirname(paths["releases"])
    png = os.path.join(output_dir, "continual_count.png")
    plot_series(series_of(read_jsonl(paths["releases"])), png, truth=truth, titles=titles,
                counts={COUNT_LABEL},
                ylabels={COUNT_LABEL: "departures so far", SUM_LABEL: "delay minutes so far"},
                dpi=110)
    summarise(paths, elapsed)
    print(f"plot: {png}")
    finished.check_invalid(args.max_invalid_fraction)
    return paths


if __name__ == "__main__":
    from dp_beam.cli import job_main

    sys.exit(job_main(main, "continual_count"))
