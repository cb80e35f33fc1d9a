"""State I/O per firing of the ERM release: one self-contained state cell vs small state + block log.

The Beam release DoFn restores each stream from its state at every firing and
writes it back. Before the per-key log, an ERM stream's state held every block
it retained (for ``ContinualERMMechanism``: the whole history), so the cell rewritten at
every firing grew with t. Now the rewritten cell holds the small state (partial
block, O(log t) models, counters) and each complete block is added once to a
``BagState`` log that is read back only when a model trains on older blocks
(spec private_erm_and_incremental_regression.md §3).

The script replays what the DoFn does, engine-free, with one firing per block:
it restores the stream, feeds one block, and encodes every state write with
Beam's ``PickleCoder`` (the coder of both cells), counting bytes.

* before: the stream with its in-memory log; a firing reads and writes the
  whole ``to_state()``;
* after: the stream with a :class:`~dp_beam.transforms.release.BagLog` over a
  counting bag; a firing reads and writes the small ``to_state()``, adds its
  block to the bag (plus the tiny ``log_meta`` cell, and a rewrite when the log
  compacts) and reads the bag only if a training needs older blocks.

The released models of both are compared bit for bit.

    python benchmarks/erm_state.py [--transform continual|sliding|multires] [--blocks 256]
        [--block-size 32] [--features 10] [--max-scale 4|none]

Settings: ContinualERMMechanism with B = 2·b0; SlidingWindowERMMechanism with w = 15·w0;
MultiResolutionERMMechanism with ``--max-scale`` (default 4).
"""

import argparse
import os
import sys
import time

# Run as a script, the repository root is not on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from apache_beam.coders import PickleCoder  # noqa: E402

from dp_beam.mechanisms import erm  # noqa: E402
from dp_beam.transforms.bag_log import BagLog  # noqa: E402

CODER = PickleCoder()


def nbytes(value):
    return len(CODER.encode(value))


class CountingCell:
    def __init__(self):
        self.value, self.written, self.read_bytes = None, 0, 0

    def read(self):
        if self.value is not None:
            self.read_bytes += nbytes(self.value)
        return self.value

    def write(self, value):
        self.value = value
        self.written += nbytes(value)


class CountingBag:
    def __init__(self):
        self.items, self.written, self.read_bytes = [], 0, 0

    def read(self):
        self.read_bytes += sum(nbytes(v) for v in self.items)
        return list(self.items)

    def add(self, value):
        self.items.append(value)
        self.written += nbytes(value)

    def clear(self):
        self.items = []


def make_stream(kind, block_size, features, rng, log, max_scale=4):
    common = dict(epsilon=1.0, block_size=block_size, n_features=features, classes=[0, 1],
                  feature_bound=1.0, lam=0.1, rng=rng, log=log)
    if kind == "continual":
        return erm.ContinualERMMechanism(base_size=2 * block_size, **common)
    if kind == "sliding":
        return erm.SlidingWindowERMMechanism(window=15 * block_size, **common)
    return erm.MultiResolutionERMMechanism(max_scale=max_scale, **common)


def replay(kind, n_blocks, block_size, features, X, y, with_log, max_scale):
    """Per firing: (state bytes read, of which from the log, state bytes written, seconds)."""
    gen = np.random.default_rng(2024)      # the same noise for both runs
    cls = type(make_stream(kind, block_size, features, None, None, max_scale))
    bag, meta = CountingBag(), CountingCell()
    cell, releases, firings = None, [], []
    for c in range(n_blocks):
        start = time.perf_counter()
        read_before, bag_before = bag.read_bytes + meta.read_bytes, bag.read_bytes
        log = BagLog(bag, meta) if with_log else None
        if cell is None:
            stream = make_stream(kind, block_size, features, gen, log, max_scale)
            read = 0
        else:
            stream = cls.from_state(CODER.decode(cell), rng=gen, log=log)
            read = len(cell)
        releases += stream.step(X[c * block_size:(c + 1) * block_size], y[c * block_size:(c + 1) * block_size])
        written_before = bag.written + meta.written
        cell = CODER.encode(stream.to_state())
        if log is not None:
            log.flush()
        written = len(cell) + bag.written + meta.written - written_before
        read += bag.read_bytes + meta.read_bytes - read_before
        firings.append((read, bag.read_bytes - bag_before, written, time.perf_counter() - start))
    return firings, releases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transform", choices=("continual", "sliding", "multires"), default="continual")
    parser.add_argument("--blocks", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--max-scale", default="4", help="multires: cap on k, or 'none'")
    args = parser.parse_args(argv)
    max_scale = None if args.max_scale == "none" else int(args.max_scale)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.blocks * args.block_size, args.features)) / np.sqrt(args.features)
    y = (X @ rng.normal(size=args.features) > 0).astype(int)

    before, rel_before = replay(args.transform, args.blocks, args.block_size, args.features, X, y, False, max_scale)
    after, rel_after = replay(args.transform, args.blocks, args.block_size, args.features, X, y, True, max_scale)
    same = len(rel_before) == len(rel_after) and all(
        a == b and np.array_equal(a.params, b.params) for a, b in zip(rel_before, rel_after))

    block_bytes = nbytes((1, (X[:args.block_size], y[:args.block_size].astype(np.int64))))
    print(f"{args.transform}: {args.blocks} blocks of {args.block_size} points, d = {args.features}, "
          f"one firing per block; PickleCoder bytes (one block in the log: {block_bytes} B)")
    print(f"{'firing':>7} {'before write':>13} {'after write':>12} {'ratio':>7} "
          f"{'before read':>12} {'after read':>11}")
    marks = sorted({1, 2} | {1 << k for k in range(2, args.blocks.bit_length())} | {args.blocks})
    for c in marks:
        (rb, _, wb, _), (ra, _, wa, _) = before[c - 1], after[c - 1]
        print(f"{c:>7} {wb:>13,} {wa:>12,} {wb / wa:>7.1f} {rb:>12,} {ra:>11,}")
    tot = lambda f, i: sum(x[i] for x in f)  # noqa: E731
    print(f"{'total':>7} {tot(before, 2):>13,} {tot(after, 2):>12,} {tot(before, 2) / tot(after, 2):>7.1f} "
          f"{tot(before, 0):>12,} {tot(after, 0):>11,}")
    print(f"largest write per firing: before {max(x[2] for x in before):,} B, "
          f"after {max(x[2] for x in after):,} B")
    print(f"after: firings that read the log {sum(x[1] > 0 for x in after)} of {args.blocks}, "
          f"{tot(after, 1):,} B read from it")
    print(f"seconds (training included): before {tot(before, 3):.2f}, after {tot(after, 3):.2f}")
    print(f"releases identical bit for bit: {same} ({len(rel_after)} models)")


if __name__ == "__main__":
    main()
