"""Events per second of ContinualCount against the same windowed count without privacy.

Every case reads the same in-memory flights, stamps them with their scheduled
departure in the pipeline, and ends in the same cheap counting DoFn, on the
same runner, so the ratio isolates what the private transform adds: input
validation, the release DoFn with its state and timers, the noise, and the
empty hours it releases that the plain count skips. The private count releases
every hour of the data set's public period (2013 in New York local time,
8,760 hours), whatever ``--events`` keeps: its schedule is declared, not read
from the events. A third case runs the source and the sink alone: the floor
every case pays (in-memory sources are pickled and compressed into the
pipeline, which is not cheap).

    python benchmarks/throughput.py [--events N] [--repeats 3] [--payload flight|timestamp]
"""

import argparse
import os
import statistics
import sys
import time

# Run as a script, the repository root is not on sys.path; the data loader lives there.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
from apache_beam.metrics import Metrics  # noqa: E402
from apache_beam.metrics.metric import MetricsFilter  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

import dp_beam as dpb  # noqa: E402
from pipelines.flights import PERIOD_START, load_flights, period_end  # noqa: E402

STEP_SECONDS = 3600
NAMESPACE = "benchmark"


@beam.typehints.with_output_types(object)
class CreateEvents(beam.Create):
    """``beam.Create`` with a declared element type.

    Without it Create infers a type from every element, which for 336k dicts
    takes longer than running the pipeline.
    """


class CountSink(beam.DoFn):
    """Counts what reaches it in a metric: a sink whose cost is negligible."""

    def __init__(self):
        self.seen = Metrics.counter(NAMESPACE, "outputs")

    def process(self, element):
        self.seen.inc()


def event_time(event):
    ts = event["ts"] if isinstance(event, dict) else event
    return beam.window.TimestampedValue(event, ts)


def source_only(events):
    return events


def non_private(events):
    return (events
            | "hourly" >> beam.WindowInto(beam.window.FixedWindows(STEP_SECONDS))
            | "count" >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults())


def private(events):
    # The public schedule: the data set's period (its definition: the flights
    # of 2013, New York local time). Repeated or cut events keep their times.
    return (events | "dp count" >> dpb.ContinualCount(
        epsilon=1, step=STEP_SECONDS, start=PERIOD_START, end=period_end())).releases


CASES = {"source only": source_only, "non-private": non_private, "ContinualCount": private}


def make_events(n, payload):
    """``n`` flights: the full year cut short, or repeated with unchanged timestamps.

    Repeating keeps the number of hourly steps fixed, so a larger ``n`` raises
    the per-event share of the work rather than the per-step share.
    """
    flights = load_flights()
    if n is not None:
        reps, rest = divmod(n, len(flights))
        flights = flights * reps + flights[:rest]
    if payload == "timestamp":
        return [f["ts"] for f in flights]
    return flights


def run_once(build, events, runner):
    """Wall time of building and running one pipeline, and what reached the sink.

    ``build`` turns the event-stamped PCollection into the case's output.
    """
    start = time.perf_counter()
    # Empty flags: with None, Beam would parse this script's own sys.argv.
    p = beam.Pipeline(options=PipelineOptions([], runner=runner))
    # reshuffle=False: a Reshuffle would add the same shuffle to every case
    # and only dilute the difference being measured.
    stamped = (p | "events" >> CreateEvents(events, reshuffle=False)
               | "event time" >> beam.Map(event_time))
    build(stamped) | "sink" >> beam.ParDo(CountSink())
    result = p.run()
    result.wait_until_finish()
    elapsed = time.perf_counter() - start
    counters = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    outputs = sum(c.committed or c.attempted or 0 for c in counters)
    return elapsed, outputs


def interleaved_rates(cases, steps, events, runner, repeats, width=22):
    """Events/s per case: median of ``repeats`` rounds, each round running every case once
    (interleaved, so a drift in the machine's load touches every case alike).

    ``cases`` maps a name to ``build(stamped, steps)``; each run's time is printed.
    """
    times = {name: [] for name in cases}
    for i in range(repeats):
        for name, case in cases.items():
            elapsed, outputs = run_once(lambda stamped: case(stamped, steps), events, runner)
            times[name].append(elapsed)
            print(f"  {name:>{width}} run {i + 1}: {elapsed:7.2f} s, {outputs:,} outputs", flush=True)
    rates = {name: len(events) / statistics.median(t) for name, t in times.items()}
    print()
    for name, rate in rates.items():
        print(f"{name:>{width + 8}}: {rate:10,.0f} events/s")
    return rates


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None,
                        help="number of events (default: all 336,776 flights)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the median is kept")
    parser.add_argument("--payload", choices=("flight", "timestamp"), default="flight",
                        help="events are the flight dicts, or only their timestamps")
    parser.add_argument("--runner", default="FnApiRunner",
                        help="Beam runner, pinned: the default one tries to download a binary")
    args = parser.parse_args(argv)

    events = make_events(args.events, args.payload)
    print(f"{len(events):,} events ({args.payload}), runner {args.runner}, "
          f"median of {args.repeats} runs")
    rates = {}
    for case in CASES:
        times = []
        for i in range(args.repeats):
            elapsed, outputs = run_once(CASES[case], events, args.runner)
            times.append(elapsed)
            print(f"  {case:>14} run {i + 1}: {elapsed:7.2f} s, {outputs:,} outputs", flush=True)
        rates[case] = len(events) / statistics.median(times)
    print()
    for case, rate in rates.items():
        print(f"{case:>20}: {rate:10,.0f} events/s")
    ratio = rates["ContinualCount"] / rates["non-private"]
    print(f"{'DP / non-private':>20}: {ratio:10.2f}")
    return rates


if __name__ == "__main__":
    main()
