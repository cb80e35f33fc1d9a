"""Steps per second of the ordered release DoFn with each continual-counting mechanism.

One event per step, so the per-step release work (state, mechanism step,
noise, record) dominates rather than per-event work. Event times are 0, 1, …,
``--steps`` − 1 seconds, so the public schedule is ``start=0``,
``end=--steps`` (one-second steps), declared from that parameter. Every
mechanism runs the same pipeline (``ContinualCount`` with Gaussian noise,
which all of them support) on the same runner in one invocation; the median
of ``--repeats`` runs is kept and each rate is printed with its ratio to the
tree's.

    python benchmarks/release_throughput.py [--steps 20000] [--repeats 3] [--mechanisms tree,blt]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

import dp_beam as dpb  # noqa: E402


@beam.typehints.with_output_types(float)
class _Times(beam.Create):
    """Create with a declared type: type inference per element would dominate."""


def run_once(mechanism, steps):
    start = time.perf_counter()
    p = beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner"))
    _ = (p
         | _Times([float(s) for s in range(steps)], reshuffle=False)
         | beam.Map(lambda t: beam.window.TimestampedValue(t, t))
         | dpb.ContinualCount(epsilon=1.0, step=1, start=0, end=steps, mechanism=mechanism,
                              noise="gaussian", delta=1e-6, horizon=steps)).releases
    p.run().wait_until_finish()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanisms", default="tree,honaker,smooth_binary,blt")
    args = parser.parse_args(argv)
    names = args.mechanisms.split(",")
    rates = {}
    for name in names:
        times = [run_once(name, args.steps) for _ in range(args.repeats)]
        rates[name] = args.steps / statistics.median(times)
        print(f"{name:>14}: {rates[name]:9,.0f} steps/s  (runs: "
              + ", ".join(f"{t:.2f} s" for t in times) + ")", flush=True)
    if "tree" in rates:
        for name in names:
            print(f"{name:>14} / tree: {rates[name] / rates['tree']:.2f}")


if __name__ == "__main__":
    main()
