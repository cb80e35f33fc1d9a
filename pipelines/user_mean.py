"""Demo job: the running mean departure delay of NYC flights, private for each aircraft, daily.

Every flight of 2013 is an event stamped with its scheduled departure; the
aircraft (``tailnum``) is the privacy unit and the departure delay in
minutes, clamped to [-30, 120], the value. ``dp_beam.ContinualMean`` (seed
003, Algorithm 6; spec withhold_release_and_composition.md §2.9) releases
the mean over all flights so far at the end of every day, user-level ε-DP
(default ε = 1) for every aircraft over the whole year, with at most 512
flights per aircraft (the most any aircraft has is 546). The neighbour relation is the
transform's default, ``participation``: whether and when an aircraft flies
is protected too, not only its delays. Flights without a tail number or a
departure delay (cancelled) go to the invalid output with their reason.
The mean is released every day of a public schedule, ``--start`` to ``--end``
(by default the data set's period, 2013 in New York local time, or its first
``--days`` days; days are UTC days, so the local period spans one more),
whether aircraft flew that day or not. Outputs, under ``--output``:

- ``releases.jsonl``: one private release per day (``MeanRelease``: value, noise std, 95 % half-width)
- ``ledger.jsonl``: the privacy charge of the transform
- ``report.jsonl``: the accounting report, checked against the budget
- ``invalid.jsonl``: flights the transform could not use, with the reason
- ``user_mean.png``: the private running mean with its 95 % band (and the
  non-private running mean with ``--truth``)

Run ``python -m pipelines.user_mean --output out [--truth] [--days N]`` or
``dp-beam run user_mean ...``; ``dp-beam plan user_mean`` prints the plan.
Unrecognised flags are passed to Beam (``--runner PortableRunner ...``);
``--output`` may be a ``gs://`` folder.
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
from pipelines.continual_count import departure_time, read_flights, step_range, summarise
from pipelines.jobs import (LogProgress, check_options, job_parser, output_dir, plan_only,
                            release_period, run)
from pipelines.flights import PERIOD_START, flights_csv_path, load_flights, period_end

STEP = timedelta(days=1)
DELAY_LOWER, DELAY_UPPER = -30, 120
MAX_SAMPLES_PER_USER = 512
#: Public upper bound on the aircraft in the data (4,037 fly from NYC in 2013).
#: It only sets the truncation widths of Algorithm 6 (accuracy), never privacy.
MAX_USERS = 10_000
LABEL = "mean departure delay"

_LOG = logging.getLogger("dp_beam.jobs.user_mean")


def aircraft(event):
    return event["tailnum"]


def delay_minutes(event):
    return event["dep_delay"]


def _build(p, epsilon, output_dir, limit_days=None, seed=None, start=None, end=None):
    """Adds the job to ``p``; returns (paths, {label: accounting}, budget)."""
    # The schedule is declared (job options), never taken from the flights.
    start = PERIOD_START if start is None else start
    end = period_end(limit_days) if end is None else end
    # Read inside the pipeline, as a job reads its source (see continual_count).
    events = (p
              | "flights file" >> beam.Create([flights_csv_path()])
              | "read flights" >> beam.FlatMap(read_flights, limit_days=limit_days)
              | "event time" >> beam.Map(departure_time)
              | "progress events" >> beam.ParDo(LogProgress("events read", logger=_LOG.name)))
    mean = events | LABEL >> dpb.ContinualMean(
        user_fn=aircraft, value_fn=delay_minutes, lower=DELAY_LOWER, upper=DELAY_UPPER,
        max_samples_per_user=MAX_SAMPLES_PER_USER, epsilon=epsilon, step=STEP,
        start=start, end=end, max_users=MAX_USERS, rng=seed)
    budget = dpb.Budget(epsilon=epsilon)
    report = mean.accounting | "check budget" >> dpb.CombineAccounting(budget)

    paths = {name: join_path(output_dir, f"{name}.jsonl")
             for name in ("releases", "ledger", "report", "invalid")}
    # Releases are logged by the transform itself (dp_beam.progress).
    for name, pcoll in (("releases", mean.releases), ("ledger", mean.accounting),
                        ("report", report), ("invalid", mean.invalid)):
        pcoll | f"write {name}" >> dpb.io.WriteJsonLines(paths[name])
    return paths, {LABEL: mean.accounting}, budget


def build(p, epsilon, output_dir, limit_days=None, seed=None, start=None, end=None):
    """Adds the job to pipeline ``p``; returns the paths it writes.

    ``start``/``end`` are the public schedule (default: the data set's period,
    :data:`~pipelines.flights.PERIOD_START` to ``period_end(limit_days)``).
    """
    return _build(p, epsilon, output_dir, limit_days, seed, start, end)[0]


def running_truth(flights, step_seconds=int(STEP.total_seconds()), start=None, end=None):
    """Non-private running mean of the clamped delays per step, empty steps included.

    The same events the transform uses: flights with a tail number and a
    delay, each aircraft's first ``MAX_SAMPLES_PER_USER`` in time order.
    For comparison on public data only; returns ``[(window_end, mean), ...]``
    (``nan`` before the first usable flight). With ``start`` and ``end`` (the
    job's public schedule) there is one point per released step and flights
    outside it are left out, as the transform does; without them the series
    spans the flights' own first to last step.
    """
    sums, counts, seen = defaultdict(float), defaultdict(int), defaultdict(int)
    if start is not None:
        steps = step_range(step_seconds, start, end)
    else:
        steps = range(min(e["ts"] // step_seconds for e in flights),
                      max(e["ts"] // step_seconds for e in flights) + 1)
    for e in sorted(flights, key=lambda e: e["ts"]):
        if e["ts"] // step_seconds not in steps:
            continue
        if e["tailnum"] is None or e["dep_delay"] is None:
            continue
        if seen[e["tailnum"]] >= MAX_SAMPLES_PER_USER:
            continue
        seen[e["tailnum"]] += 1
        k = e["ts"] // step_seconds
        sums[k] += min(max(e["dep_delay"], DELAY_LOWER), DELAY_UPPER)
        counts[k] += 1
    total, n, series = 0.0, 0, []
    for k in steps:
        total += sums.get(k, 0.0)
        n += counts.get(k, 0)
        series.append(((k + 1) * step_seconds, total / n if n else float("nan")))
    return series


def plot_mean(releases, out_png, truth=None, title=""):
    """The private running mean with its 95 % band (and ``truth``, if given) over time.

    ``releases`` are release dicts (``MeanRelease`` as JSON) of one stream,
    drawn by :func:`dp_beam.report.plot_series` (the report's own drawing).
    The vertical range is the clamping range [lower, upper]: the first
    days' bands are far wider and would flatten the rest. Days whose
    diversity flag is false (the accuracy guarantee does not apply to them)
    are shaded. Returns the path written.
    """
    from dp_beam.report import plot_series, series_of

    streams = series_of(releases)
    if not streams:
        raise ValueError("no releases to plot")
    labels = {t for t, _ in streams}
    plot_series(streams, out_png, truth={t: truth for t in labels} if truth else None,
                titles={t: title for t in labels}, bounds={t: (DELAY_LOWER, DELAY_UPPER)
                                                           for t in labels},
                ylabels={t: "mean departure delay so far (minutes)" for t in labels}, dpi=110)
    return out_png


def make_parser():
    parser = job_parser("user_mean", __doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="total privacy budget (user level: per aircraft over the whole "
                             "run, default 1); the job's one transform spends all of it")
    parser.add_argument("--truth", action="store_true",
                        help="also plot the non-private running mean (public demo data only)")
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
    finished = run(p, "user_mean", args.runner, paths, args.no_wait, _LOG)
    if finished is None:
        return paths
    summarise(paths, finished.elapsed)
    releases = read_jsonl(paths["releases"])
    truth = (running_truth(load_flights(limit_days=args.days), int(STEP.total_seconds()),
                           *release_period(args)) if args.truth else None)
    if releases:
        last = max(releases, key=lambda r: r["step"])
        line = (f"last day: private mean {last['value']:.2f} ± {last['ci95']:.2f} min "
                f"(95 %), diverse={last['diverse']}")
        if truth:
            line += f"; non-private {truth[-1][1]:.2f} min"
        print(line)
    if "://" in paths["releases"]:
        print("plot: skipped for a remote output; render it with `dp-beam report`")
        finished.check_invalid(args.max_invalid_fraction)
        return paths
    title = (f"Running mean departure delay per flight, clamped to [{DELAY_LOWER}, "
             f"{DELAY_UPPER}] min, daily releases, ε = {args.epsilon:g} per aircraft "
             f"(≤ {MAX_SAMPLES_PER_USER} flights each)")
    png = plot_mean(releases, os.path.join(os.path.dirname(paths["releases"]), "user_mean.png"),
                    truth=truth, title=title)
    print(f"plot: {png}")
    finished.check_invalid(args.max_invalid_fraction)
    return paths


if __name__ == "__main__":
    from dp_beam.cli import job_main

    sys.exit(job_main(main, "user_mean"))
