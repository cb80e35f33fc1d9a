"""Releases per second with many keys on streaming input: one timer per key vs one per shard.

The streaming counterpart of ``scale.py``. K declared keys and ``--steps``
hourly steps, two events per key and step, fed by a ``TestStream`` that adds
each step's events and then moves the watermark past the step's end, on
``BundleBasedDirectRunner`` (the one offline runner that runs ``TestStream``,
see the README's Runners section), all cases in one invocation, interleaved,
the median of ``--repeats`` runs kept:

* ``per-key``: ``ContinualCount`` with ``shards=0``: one stateful key and one
  event-time timer per stream, so every step fires K timers;
* ``sharded``: ``ContinualCount`` with the default ``shards=None`` (K // 64
  shards): one stateful key and one timer per shard, which runs the per-key
  release code for all its streams (``transforms/shards.py``;
  ``tests/transforms/test_shards.py`` checks that the records are the same
  bit for bit);
* ``windowed``: a non-private per-key hourly count, ``WindowInto(FixedWindows)``
  and ``CombinePerKey(count)``, which Beam fires per key and window as the
  watermark passes; every key has events in every step here, so it emits as
  many counts as the private cases release.

Rates are outputs per second of wall time and of CPU time (CPU time is the
steadier measure on a shared machine); the ratios are each private case's
rates over the windowed count's in the same run. This runner is several times
slower per element than ``FnApiRunner``, so its absolute rates say nothing of a
production runner; the ratios say what one timer per shard saves.

    python benchmarks/streaming_scale.py [--keys 100,1000] [--steps 24] [--repeats 3]
"""

import argparse
import statistics
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.testing import test_stream  # noqa: E402

import dp_beam as dpb  # noqa: E402

HOUR = 3600.0
CASES = ("per-key", "sharded", "windowed")


def stream_for(keys, steps, per_step=2):
    """A TestStream of ``per_step`` events per key and step; the watermark passes each step's
    end once its events are in."""
    s = test_stream.TestStream()
    s.advance_watermark_to(0)
    for step in range(steps):
        s.add_elements([beam.window.TimestampedValue((f"k{k}", t, 1.0), t)
                        for k in range(keys)
                        for t in (step * HOUR + 60.0 * j for j in range(per_step))])
        s.advance_watermark_to((step + 1) * HOUR)
    s.advance_watermark_to_infinity()
    return s


class _Count(beam.DoFn):
    """Counts its input, so that every case ends in the same cheap step; each bundle appends
    its count to ``path`` (the runner reports no metrics for a streaming run)."""

    def __init__(self, path):
        self._path = path

    def start_bundle(self):
        self._n = 0

    def process(self, element):
        self._n += 1

    def finish_bundle(self):
        if self._n:
            with open(self._path, "a") as f:
                f.write(f"{self._n}\n")


def run_once(case, keys, steps):
    """(wall seconds, CPU seconds of this process, outputs) of one pipeline run."""
    wall, cpu = time.perf_counter(), time.process_time()
    p = beam.Pipeline(options=PipelineOptions(flags=[], runner="BundleBasedDirectRunner",
                                              streaming=True))
    events = p | stream_for(keys, steps)
    if case == "windowed":
        out = (events | beam.WindowInto(beam.window.FixedWindows(HOUR))
               | beam.Map(lambda e: (e[0], 1)) | beam.CombinePerKey(sum))
    else:
        out = (events | dpb.ContinualCount(
            epsilon=1.0, step=HOUR, start=0, end=steps * HOUR, key_fn=lambda e: e[0],
            keys=[f"k{k}" for k in range(keys)], shards=0 if case == "per-key" else None)).releases
    with tempfile.TemporaryDirectory() as tmp:
        counts = os.path.join(tmp, "counts")
        _ = out | beam.ParDo(_Count(counts))
        p.run().wait_until_finish()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        with open(counts) as f:
            return wall, cpu, sum(int(line) for line in f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="100,1000")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be >= 1")
    print("out/s in wall time (CPU time in brackets); medians of "
          f"{args.repeats} interleaved runs, {args.steps} steps, 2 events per key and step, "
          "BundleBasedDirectRunner, TestStream")
    print(f"{'keys':>6} | " + " | ".join(f"{c:>19}" for c in CASES)
          + " | per-key / windowed | sharded / windowed")
    for case in CASES:
        run_once(case, 2, 1)        # warm-up: imports and first-use costs of every case
    for keys in (int(k) for k in args.keys.split(",")):
        wall = {c: [] for c in CASES}
        cpu = {c: [] for c in CASES}
        for _ in range(args.repeats):
            for case in CASES:      # interleaved: load drifts hit every case alike
                w, c, outputs = run_once(case, keys, args.steps)
                if outputs != keys * args.steps:
                    raise SystemExit(f"{case}: {outputs} outputs, expected {keys * args.steps}")
                wall[case].append(w)
                cpu[case].append(c)
        n = keys * args.steps
        rate = {c: n / statistics.median(wall[c]) for c in CASES}
        crate = {c: n / statistics.median(cpu[c]) for c in CASES}
        ratios = [f"{rate[c] / rate['windowed']:.2f} ({crate[c] / crate['windowed']:.2f})"
                  for c in ("per-key", "sharded")]
        print(f"{keys:>6} | " + " | ".join(f"{rate[c]:>8,.0f} ({crate[c]:>8,.0f})" for c in CASES)
              + f" | {ratios[0]:>18} | {ratios[1]}", flush=True)


if __name__ == "__main__":
    main()
