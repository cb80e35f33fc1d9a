"""What a DoFn pays per element for reading the element's event time, by the way it asks.

The validating stage of every transform reads each event's Beam timestamp. A DoFn whose
``process`` takes only the element runs through Beam's simple invoker; any other parameter
moves it to the per-window invoker. ``DoFn.TimestampParam`` also builds a ``Timestamp``
object per element, ``DoFn.WindowedValueParam`` hands over the windowed value, whose
``timestamp_micros`` is the same integer. This runs ``--elements`` timestamped elements
through a DoFn of each kind on the in-process ``FnApiRunner`` and prints the wall seconds of
each pipeline (the source and the timestamping Map included, the same in every case), the
kinds interleaved over ``--repeats`` rounds.

    python benchmarks/dofn_params.py [--elements 1000000] [--repeats 2]
"""

import argparse
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


class _ElementOnly(beam.DoFn):
    def process(self, element):
        return ()


class _TimestampParam(beam.DoFn):
    # The validating stage's signature before: the timestamp, and the declared keys' side input.
    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        unused = timestamp.micros
        return ()


class _WindowedValueParam(beam.DoFn):
    # Its signature now.
    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        unused = windowed.timestamp_micros
        return ()


KINDS = {"element only": _ElementOnly, "TimestampParam": _TimestampParam,
         "WindowedValueParam": _WindowedValueParam}


def _stamped(x):
    return beam.window.TimestampedValue(x, x)


def run_once(dofn_class, elements):
    """Wall seconds of one pipeline: ``elements`` ints, timestamped, through ``dofn_class``."""
    p = beam.Pipeline(options=PipelineOptions(runner="FnApiRunner"))
    _ = (p | beam.Create(list(range(elements)), reshuffle=False) | beam.Map(_stamped)
         | beam.ParDo(dofn_class()))
    start = time.perf_counter()
    p.run().wait_until_finish()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if args.elements < 1 or args.repeats < 1:
        parser.error("--elements and --repeats must be >= 1")
    seconds = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind, cls in KINDS.items():
            seconds[kind].append(run_once(cls, args.elements))
    for kind, runs in seconds.items():
        print(f"{kind:>19}: " + ", ".join(f"{s:.2f}" for s in runs) + " s", flush=True)


if __name__ == "__main__":
    main()
