"""Events per second of ``dpb.IncrementalRegression`` against non-private incremental least squares in Beam.

All cases read the same in-memory flights of 2013 (the 327,346 with departure
and arrival delays, distance and hour), stamp them with their scheduled
departure in the pipeline, and end in the same metric-only DoFn, on the same
runner (as ``throughput.py``), so the ratio isolates what each aggregation
costs. Features and label are those of ``incremental_regression.py`` (d = 11,
public scaling, ‖x‖ <= 1, |y| <= 1), C the L2 ball of radius 4, hourly steps
over the data set's public period (2013 in New York local time, 8,760 hours):

- ``source only``: nothing after the source, the floor every case pays;
- ``non-private``: per event ``(x xᵀ, x·y)``; a ``CombinePerKey`` of numpy sums
  keyed by the hour (global window: the batch runners' windowed grouping
  scans every window seen so far for each new one, ``BEAM_NOTES.md``); all
  hourly sums to one key; one DoFn that walks the hours of the period in
  order, keeps the running Gram and x·y sums and releases the least-squares
  model over C of every hour (the same solver as the private default, on the
  exact sums: ``solve_quadratic``), empty hours included;
- ``IncrementalRegression``: ``dpb.IncrementalRegression`` with its defaults
  (PrivIncReg1, BLT counters, the exact solver), ε = 1, δ = 10⁻⁶, production
  noise (a fresh noise key), the same features, label, C and hours. It also
  validates and clips every event (dead letters included) and keeps the
  counters in per-stream state.

Both release one model per hour of the period; the cases run in rounds (one
run of each per round) so that a change of the machine's load touches all of
them alike, and the median per case is kept.

    python benchmarks/incremental_regression_throughput.py [--repeats 3] [--events N]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
from apache_beam.transforms.window import GlobalWindows  # noqa: E402

import dp_beam as dpb  # noqa: E402
from benchmarks.incremental_regression import DELTA, RADIUS, features, label  # noqa: E402
from benchmarks.throughput import interleaved_rates  # noqa: E402
from dp_beam.mechanisms.regression import L2Ball, solve_quadratic  # noqa: E402
from dp_beam.transforms.schedule import resolve_schedule  # noqa: E402
from pipelines.flights import PERIOD_START, load_delay_flights, period_end  # noqa: E402

HOUR = 3600
EPSILON = 1.0
DIM = 11
START, END = PERIOD_START, period_end()


def usable(flight):
    return all(flight[k] is not None for k in ("dep_delay", "arr_delay", "distance", "hour"))


def source_only(events, steps):
    return events


class _MomentSums(beam.CombineFn):
    """``(Σ x xᵀ, Σ x·y, count)`` with numpy accumulators, updated in place."""

    def create_accumulator(self):
        return [np.zeros((DIM, DIM)), np.zeros(DIM), 0]

    def add_input(self, acc, value):
        gram, xy = value
        acc[0] += gram
        acc[1] += xy
        acc[2] += 1
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for acc in accs:
            out[0] += acc[0]
            out[1] += acc[1]
            out[2] += acc[2]
        return out

    def extract_output(self, acc):
        return acc


def _moments(event):
    x = features(event)
    return event["ts"] // HOUR, (np.outer(x, x), x * label(event))


class _RunningLeastSquares(beam.DoFn):
    """All hourly sums of the period → one least-squares model over C per hour, in order."""

    def __init__(self, steps):
        self._first, self._last = steps

    def process(self, element):
        _, sums = element
        by_step = dict(sums)
        constraint = L2Ball(RADIUS)
        gram, xy, n = np.zeros((DIM, DIM)), np.zeros(DIM), 0
        for step in range(self._first, self._last):
            if step in by_step:
                g, b, c = by_step[step]
                gram += g
                xy += b
                n += c
            theta, _ = solve_quadratic(gram, xy, constraint, psd=False)
            yield step, n, theta


def non_private(events, steps):
    return (events
            | "global" >> beam.WindowInto(GlobalWindows())
            | "moments" >> beam.Map(_moments)
            | "per hour" >> beam.CombinePerKey(_MomentSums())
            | "one key" >> beam.Map(lambda kv: (None, kv))
            | "gather" >> beam.GroupByKey()
            | "running fit" >> beam.ParDo(_RunningLeastSquares(steps)))


def private(events, steps):
    return (events | "dp regression" >> dpb.IncrementalRegression(
        features_fn=features, label_fn=label, dim=DIM, epsilon=EPSILON, delta=DELTA, step=HOUR,
        start=START, end=END, constraint=L2Ball(RADIUS))).releases


CASES = {"source only": source_only, "non-private": non_private,
         "IncrementalRegression": private}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None,
                        help="use the first N usable flights (default: all 327,346)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the median is kept")
    parser.add_argument("--cases", nargs="*", default=None, help="run only these cases")
    parser.add_argument("--runner", default="FnApiRunner",
                        help="Beam runner, pinned: the default one tries to download a binary")
    args = parser.parse_args(argv)

    events = [f for f in load_delay_flights() if usable(f)]
    if args.events is not None:
        events = events[:args.events]
    schedule = resolve_schedule(HOUR, START, END)
    steps = (schedule.start_step, schedule.end_step)
    cases = {name: CASES[name] for name in (args.cases or CASES)}
    print(f"{len(events):,} flights, d = {DIM}, {steps[1] - steps[0]:,} hourly steps, "
          f"runner {args.runner}, median of {args.repeats} interleaved rounds")
    rates = interleaved_rates(cases, steps, events, args.runner, args.repeats, width=22)
    if "IncrementalRegression" in rates and "non-private" in rates:
        ratio = rates["IncrementalRegression"] / rates["non-private"]
        print(f"{'IncrementalRegression / non-private':>30}: {ratio:10.2f}")
    return rates


if __name__ == "__main__":
    main()
