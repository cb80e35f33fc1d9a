"""Releases per second with many keys: per-key release, sharded release, non-private filled count.

``ContinualCount`` over K declared keys and ``--steps`` hourly steps, two
events per key and step, on one runner in one invocation, the cases
interleaved and the median of ``--repeats`` runs kept:

* ``per-key``: ``shards=0``, one stateful key (and one timer) per stream;
* ``sharded``: the default ``shards=None`` (K // 64 shards, one stateful DoFn
  and one timer per shard, the same records);
* ``filled``: a non-private per-key hourly count that also emits the empty
  steps, written as one cheap DoFn after a GroupByKey (what a pipeline
  without DP would run to publish the same table).

The printed ratio ``sharded / filled`` is the issue's target (>= 0.5 at
1,000 keys). ``--state-keys`` also prints the size of the sharded state
per key (pickled tree states after ``--steps`` steps) for that many keys,
computed without Beam.

    python benchmarks/scale.py [--keys 10,100,1000] [--steps 72] [--repeats 3] [--state-keys 100000]
"""

import argparse
import os
import pickle
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

import dp_beam as dpb  # noqa: E402
from dp_beam.mechanisms import BinaryTreeMechanism  # noqa: E402

HOUR = 3600.0


def events_for(keys, steps):
    return [(f"k{k}", s * HOUR + 60.0 * j) for k in range(keys) for s in range(steps) for j in range(2)]


def _stamp(e):
    return beam.window.TimestampedValue(e, e[1])


class _Filled(beam.DoFn):
    """Non-private: a key's count per hour, every hour of the schedule (empty ones too)."""

    def __init__(self, steps):
        self._steps = steps

    def process(self, element):
        key, times = element
        counts = [0] * self._steps
        for t in times:
            counts[int(t // HOUR)] += 1
        for step, count in enumerate(counts):
            yield key, step, count


def run_once(case, keys, steps, events):
    start = time.perf_counter()
    p = beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner"))
    stamped = p | beam.Create(events, reshuffle=False) | beam.Map(_stamp)
    if case == "filled":
        _ = (stamped | beam.Map(lambda e: (e[0], e[1])) | beam.GroupByKey()
             | beam.ParDo(_Filled(steps)))
    else:
        _ = (stamped
             | dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=steps * HOUR,
                                  key_fn=lambda e: e[0], keys=[f"k{k}" for k in range(keys)],
                                  shards=0 if case == "per-key" else None)).releases
    p.run().wait_until_finish()
    return time.perf_counter() - start


def state_bytes_per_key(keys, steps):
    """Pickled size of a shard's stream table per key, tree mechanism after ``steps`` steps."""
    entry = BinaryTreeMechanism(1.0, horizon=steps)
    for _ in range(steps):
        entry.step(2.0)
    state = entry.to_state()
    # A copy per key: pickle would store one shared object only once.
    table = {f"k{k}": {"mechanism": pickle.loads(pickle.dumps(state)), "next": steps, "first": 0}
             for k in range(keys)}
    return len(pickle.dumps(table, protocol=4)) / keys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", default="10,100,1000")
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--state-keys", type=int, default=100_000)
    args = parser.parse_args(argv)
    cases = ("per-key", "sharded", "filled")
    print(f"{'keys':>6} | " + " | ".join(f"{c + ' out/s':>15}" for c in cases)
          + " | sharded/per-key | sharded/filled")
    for keys in (int(k) for k in args.keys.split(",")):
        events = events_for(keys, args.steps)
        times = {c: [] for c in cases}
        for _ in range(args.repeats):
            for case in cases:      # interleaved: load drifts hit every case alike
                times[case].append(run_once(case, keys, args.steps, events))
        rate = {c: keys * args.steps / statistics.median(times[c]) for c in cases}
        print(f"{keys:>6} | " + " | ".join(f"{rate[c]:>15,.0f}" for c in cases)
              + f" | {rate['sharded'] / rate['per-key']:>15.2f} | {rate['sharded'] / rate['filled']:>14.2f}",
              flush=True)
    if args.state_keys:
        print(f"sharded state: {state_bytes_per_key(args.state_keys, args.steps):.0f} bytes per key "
              f"({args.state_keys:,} keys, tree after {args.steps} steps)")


if __name__ == "__main__":
    main()
