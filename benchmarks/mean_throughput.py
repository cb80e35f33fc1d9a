"""Events per second of ContinualMean against a non-private daily mean and PipelineDP's DP mean.

All cases read the same in-memory flights of 2013, stamp them with their
scheduled departure in the pipeline, and end in the same metric-only DoFn, on
the same runner (as ``throughput.py``), so the ratios isolate the
aggregation each one does:

- ``source only``: nothing after the source, the floor every case pays;
- ``non-private``: flights with a tail number and a delay, delay clamped to
  [-30, 120], ``FixedWindows(1 day)`` + ``CombineGlobally(MeanCombineFn)``:
  one plain mean per day;
- ``ContinualMean``: ``dp_beam.ContinualMean`` as in the ``user_mean`` job
  (aircraft = user, ε = 1, m = 512 flights per aircraft, daily steps, secure
  noise); it validates every flight itself (dead letters included) and
  releases the running mean every day of the data set's public period;
- ``PipelineDP``: ``pipeline_dp.DPEngine`` on ``BeamBackend``, Laplace noise,
  ``Metrics.MEAN`` per day (partition = day, public partitions = every day
  of the year, privacy id = tail number), same ε = 1, delay bounds [-30, 120],
  after dropping the flights without a tail number or a delay. Contribution
  bounding (``--pipelinedp-bounds``): ``total`` (default) sets
  ``max_contributions=512``, at most 512 flights per aircraft over the year,
  which is ContinualMean's m exactly; ``per-day`` sets
  ``max_partitions_contributed=256, max_contributions_per_partition=2``, the
  split with product 512 that keeps the most flights (94.9 %; an aircraft
  flies on at most 322 days and at most 5 times a day).

PipelineDP releases one batch mean per day, ContinualMean a continual
running mean; both answer "mean delay by day" with the same per-aircraft
budget and contribution bound, which is what makes their throughput
comparable, not their outputs. Both use the same public days: the UTC days
of the data set's period (2013 in New York local time: 366 UTC days),
declared, never the span of the events, whatever ``--events`` keeps.

    python benchmarks/mean_throughput.py [--repeats 3] [--events N] [--pipelinedp-bounds total|per-day]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402

import dp_beam as dpb  # noqa: E402
from benchmarks.throughput import interleaved_rates  # noqa: E402
from dp_beam.transforms.schedule import resolve_schedule  # noqa: E402
from pipelines.flights import PERIOD_START, load_flights, period_end  # noqa: E402

DAY = 86400
LOWER, UPPER = -30.0, 120.0
EPSILON = 1.0
M = 512
# The public period of the data set (its definition: the flights of 2013 in
# New York local time), the schedule of the private releases.
START, END = PERIOD_START, period_end()


def usable(event):
    return event["tailnum"] is not None and event["dep_delay"] is not None


def clamped_delay(event):
    return min(max(event["dep_delay"], LOWER), UPPER)


def source_only(events, days):
    return events


def non_private(events, days):
    return (events
            | "usable" >> beam.Filter(usable)
            | "delay" >> beam.Map(clamped_delay)
            | "daily" >> beam.WindowInto(beam.window.FixedWindows(DAY))
            | "mean" >> beam.CombineGlobally(beam.combiners.MeanCombineFn()).without_defaults())


def continual_mean(events, days):
    return (events | "dp mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["tailnum"], value_fn=lambda e: e["dep_delay"], lower=LOWER,
        upper=UPPER, max_samples_per_user=M, epsilon=EPSILON, step=DAY, start=START, end=END,
        max_users=10_000)).releases


def pipeline_dp_mean(bounds):
    def build(events, days):
        import pipeline_dp

        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=0.0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        if bounds == "total":
            limits = dict(max_contributions=M)
        else:
            limits = dict(max_partitions_contributed=256, max_contributions_per_partition=2)
        params = pipeline_dp.AggregateParams(
            metrics=[pipeline_dp.Metrics.MEAN], noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            min_value=LOWER, max_value=UPPER, **limits)
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda e: e["tailnum"],
            partition_extractor=lambda e: e["ts"] // DAY,
            value_extractor=lambda e: e["dep_delay"])
        result = engine.aggregate(events | "usable" >> beam.Filter(usable), params, extractors,
                                  public_partitions=days)
        accountant.compute_budgets()
        return result
    return build


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None,
                        help="use the first N flights (default: all 336,776)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the median is kept")
    parser.add_argument("--pipelinedp-bounds", choices=("total", "per-day"), default="total",
                        help="PipelineDP contribution bounds (see the module docstring)")
    parser.add_argument("--cases", nargs="*", default=None,
                        help="run only these cases (default: all)")
    parser.add_argument("--runner", default="FnApiRunner",
                        help="Beam runner, pinned: the default one tries to download a binary")
    args = parser.parse_args(argv)

    events = load_flights()
    if args.events is not None:
        events = events[:args.events]
    # Public partitions for PipelineDP: the days ContinualMean releases, from
    # the declared period (never from the events' first and last times).
    schedule = resolve_schedule(DAY, START, END)
    days = list(range(schedule.start_step, schedule.end_step))
    cases = {"source only": source_only, "non-private": non_private,
             "ContinualMean": continual_mean,
             "PipelineDP": pipeline_dp_mean(args.pipelinedp_bounds)}
    if args.cases:
        cases = {name: cases[name] for name in args.cases}
    print(f"{len(events):,} flights ({sum(map(usable, events)):,} with tail number and delay), "
          f"{len(days)} days, runner {args.runner}, median of {args.repeats} runs, "
          f"PipelineDP bounds: {args.pipelinedp_bounds}")
    # Rounds of one run per case, so that a change in the machine's load over
    # the benchmark touches every case alike.
    rates = interleaved_rates(cases, days, events, args.runner, args.repeats, width=14)
    for other in ("non-private", "PipelineDP"):
        if "ContinualMean" in rates and other in rates:
            print(f"{'ContinualMean / ' + other:>26}: {rates['ContinualMean'] / rates[other]:10.2f}")
    return rates


if __name__ == "__main__":
    main()
