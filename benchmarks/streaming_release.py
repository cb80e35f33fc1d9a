"""CPU per released stream-step of the streaming release DoFns, driven directly, one firing per step.

On streaming input every step's end fires the release, which then releases
one step per stream. ``streaming_scale.py`` runs whole pipelines on
``BundleBasedDirectRunner``, whose per-element cost hides the release's own;
this script measures the release itself: the DoFns of
``dp_beam/transforms/release.py`` and ``shards.py`` are driven as a runner
drives them, with in-memory state cells that decode their value at the
firing's first read and encode it at its write with Beam's ``PickleCoder``
(the cells' coder), as the SDK harness reads state at the start of a bundle
and commits it at its end.

K declared keys of ``ContinualCount`` (ε = 1, hourly), ``--steps`` steps, two
events per key and step, the same aggregates in every case:

* ``per-key``: ``shards=0``: one set of state cells per stream, one firing per
  stream and step, which restores the stream's mechanism from its state,
  steps it and writes the state back;
* ``sharded``: the default shards (K // 64): one cell per shard holding its
  streams' entries, one firing per shard and step; the streams (tree, or BLT
  with ``--noise gaussian``) opened together are kept as arrays with a column
  per stream (``LockstepTrees.arrays``, ``LockstepBLT.arrays``) and stepped
  from them.

Only the firings are timed (process CPU time); the per-element calls that
buffer the aggregates are not. The records of both cases are compared (the
same noise key), so a run also checks that they release the same values. The
size of the encoded state after the last step (all cells, per key) is
printed too.

    python benchmarks/streaming_release.py [--keys 1000] [--steps 72] [--repeats 3]
        [--noise laplace|gaussian]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from apache_beam import pvalue  # noqa: E402
from apache_beam.coders import PickleCoder  # noqa: E402
from apache_beam.utils.timestamp import Timestamp  # noqa: E402

import dp_beam as dpb  # noqa: E402
from dp_beam.transforms.release import OrderedReleaseDoFn  # noqa: E402
from dp_beam.transforms.schedule import StreamStart  # noqa: E402
from dp_beam.transforms.shards import ShardedReleaseDoFn, default_shards, shard_of  # noqa: E402

HOUR = 3600.0
CASES = ("per-key", "sharded")
#: Fixed so that the two cases' releases can be compared.
BENCH_KEY = dpb.NoiseKey.from_bytes(bytes(range(32)))
_CODER = PickleCoder()


class _Cell:
    """A state cell whose value lives encoded between firings (one decode per firing's first
    read, one encode per write)."""

    def __init__(self):
        self._encoded, self._value, self._loaded = None, None, False

    def read(self):
        if not self._loaded:
            self._value = None if self._encoded is None else _CODER.decode(self._encoded)
            self._loaded = True
        return self._value

    def write(self, value):
        self._value, self._loaded = value, True
        self._encoded = _CODER.encode(value)

    def clear(self):
        self._encoded, self._value, self._loaded = None, None, True

    def commit(self):
        """The end of a bundle: the next read decodes again."""
        self._loaded = False

    def size(self):
        return len(self._encoded or b"")


class _Bag:
    def __init__(self):
        self._items = []

    def read(self):
        return [_CODER.decode(item) for item in self._items]

    def add(self, value):
        self._items.append(_CODER.encode(value))

    def clear(self):
        self._items = []

    def commit(self):
        pass

    def size(self):
        return sum(len(item) for item in self._items)


class _Timer:
    def __init__(self):
        self.at = None

    def set(self, when):
        self.at = float(when)

    def clear(self):
        self.at = None


def _inner(keys, noise):
    options = dict(noise="gaussian", delta=1e-6) if noise == "gaussian" else {}
    count = dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, keys=keys, key_fn=lambda e: e,
                               noise_key=BENCH_KEY, **options)
    inner = OrderedReleaseDoFn(count.release_spec("count"), bounded=False,
                               noise_key=count._noise_key)
    inner.setup()
    return inner


def _releases(outputs):
    return [tuple(o.value)[:5] for o in outputs if not isinstance(o, pvalue.TaggedOutput)]


def run_per_key(keys, steps, noise):
    """(CPU seconds of the firings, releases, encoded state bytes after the last firing) of
    the per-key release."""
    inner = _inner(keys, noise)
    cells = {k: (_Bag(), _Cell(), _Cell(), _Cell(), _Cell(), _Timer()) for k in keys}
    for k in keys:
        buffer, _, nxt, first, earliest, timer = cells[k]
        list(inner._process((k, (0, StreamStart())), buffer, nxt, first, earliest, timer))
    cpu, out = 0.0, []
    for step in range(steps):
        for k in keys:
            buffer, _, nxt, first, earliest, timer = cells[k]
            list(inner._process((k, (step, (2.0, 2))), buffer, nxt, first, earliest, timer))
        start = time.process_time()
        for k in keys:
            timer = cells[k][5]
            due, timer.at = timer.at, None
            out += inner._fire(k, Timestamp.of(due), *cells[k])
            for cell in cells[k][:5]:
                cell.commit()
        cpu += time.process_time() - start
    state = sum(cell.size() for stream in cells.values() for cell in stream[:5])
    return cpu, _releases(out), state


def run_sharded(keys, steps, noise):
    """(CPU seconds of the firings, releases, encoded state bytes after the last firing) of
    the sharded release."""
    dofn = ShardedReleaseDoFn(_inner(keys, noise))
    shards = default_shards(len(keys))
    cells = {s: (_Cell(), _Cell(), _Cell(), _Timer()) for s in range(shards)}
    routed = {s: [] for s in range(shards)}
    for k in keys:
        routed[shard_of(k, shards)].append(k)
    for s, shard_keys in routed.items():
        streams, _, armed, timer = cells[s]
        for k in shard_keys:
            list(dofn.process((s, (k, (0, StreamStart()))), streams, armed, timer))
    cpu, out = 0.0, []
    for step in range(steps):
        for s, shard_keys in routed.items():
            streams, _, armed, timer = cells[s]
            for k in shard_keys:
                list(dofn.process((s, (k, (step, (2.0, 2)))), streams, armed, timer))
        start = time.process_time()
        for s in routed:
            streams, groups, armed, timer = cells[s]
            due, timer.at = timer.at, None
            if due is not None:
                out += dofn.on_release(Timestamp.of(due), streams, groups, armed, timer)
            for cell in (streams, groups, armed):
                cell.commit()
        cpu += time.process_time() - start
    state = sum(cell.size() for shard in cells.values() for cell in shard[:3])
    return cpu, _releases(out), state


RUNS = {"per-key": run_per_key, "sharded": run_sharded}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise", choices=("laplace", "gaussian"), default="laplace")
    args = parser.parse_args(argv)
    if args.keys < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--keys, --steps and --repeats must be >= 1")
    keys = [f"k{k}" for k in range(args.keys)]
    cpu = {c: [] for c in CASES}
    released, state = {}, {}
    for _ in range(args.repeats):
        for case in CASES:          # interleaved: load drifts hit both cases alike
            seconds, releases, state[case] = RUNS[case](keys, args.steps, args.noise)
            if len(releases) != args.keys * args.steps:
                raise SystemExit(f"{case}: {len(releases)} releases, expected "
                                 f"{args.keys * args.steps}")
            cpu[case].append(seconds)
            released[case] = sorted(releases)
    if released["per-key"] != released["sharded"]:
        raise SystemExit("the per-key and sharded releases differ")
    n = args.keys * args.steps
    per = {c: statistics.median(cpu[c]) / n * 1e6 for c in CASES}
    print(f"{args.keys} keys x {args.steps} steps, {args.noise} noise, one firing per step; "
          f"CPU us per released stream-step (median of {args.repeats}), firings only")
    print(f"  per-key {per['per-key']:.1f} | sharded {per['sharded']:.1f} | "
          f"per-key / sharded {per['per-key'] / per['sharded']:.2f}; the same releases")
    print(f"  state after the last step, encoded, bytes per key: per-key "
          f"{state['per-key'] / args.keys:.0f} | sharded {state['sharded'] / args.keys:.0f}")


if __name__ == "__main__":
    main()
