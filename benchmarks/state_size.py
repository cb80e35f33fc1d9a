"""Memory of the binary-tree mechanism: the largest state observed against its bound.

A tree mechanism keeps one partial sum per open level, so its state stays within
(⌊log2 T⌋ + 2)·dim floats however long the stream runs: that is what lets the
Beam release DoFn keep it in a single state cell, rewritten every step. The
script steps the mechanism through T steps with zero noise (the state's shape
does not depend on the noise), records ``state_size()`` after every step, and
the pickled size of ``to_state()`` where the state is largest and at the end.
It does so for a tree built for the horizon T and for an unbounded tree (the
transforms' default, ``horizon=None``) run for T steps.

    python benchmarks/state_size.py [--log2 10 16 20] [--dim 1]
"""

import argparse
import math
import os
import pickle
import sys
import time

# Run as a script, the repository root is not on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from dp_beam.mechanisms import BinaryTreeMechanism, ZeroNoise  # noqa: E402


def pickled_bytes(state):
    return len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def measure(steps, dim, bounded):
    mech = BinaryTreeMechanism(epsilon=1, horizon=steps if bounded else None, dim=dim,
                               rng=ZeroNoise())
    x = 1.0 if dim == 1 else np.ones(dim)
    max_size, worst_t, worst_state = -1, 0, None
    start = time.perf_counter()
    for t in range(1, steps + 1):
        mech.step(x)
        size = mech.state_size()
        if size > max_size:
            max_size, worst_t, worst_state = size, t, mech.to_state()
    elapsed = time.perf_counter() - start
    return {
        "horizon": steps if bounded else None,
        "T": steps,
        "max_state_size": max_size,
        "at_step": worst_t,
        "bound": (math.floor(math.log2(steps)) + 2) * dim,
        "pickled_at_max": pickled_bytes(worst_state),
        "pickled_at_end": pickled_bytes(mech.to_state()),
        "us_per_step": 1e6 * elapsed / steps,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log2", type=int, nargs="+", default=[10, 16, 20],
                        help="numbers of steps T as powers of two (default: 10 16 20)")
    parser.add_argument("--dim", type=int, default=1, help="dimension of each step's input")
    args = parser.parse_args(argv)

    print(f"BinaryTreeMechanism, dim {args.dim}, zero noise; sizes in floats, pickles in bytes")
    print(f"{'T':>9} {'horizon':>8} {'max state_size':>14} {'at step':>9} {'bound':>6} "
          f"{'pickle@max':>10} {'pickle@T':>9} {'µs/step':>8}")
    rows = []
    for k in args.log2:
        for bounded in (True, False):
            r = measure(2 ** k, args.dim, bounded)
            rows.append(r)
            flag = "" if r["max_state_size"] <= r["bound"] else "  EXCEEDS BOUND"
            horizon = "T" if bounded else "None"
            print(f"{r['T']:>9} {horizon:>8} {r['max_state_size']:>14} {r['at_step']:>9} "
                  f"{r['bound']:>6} {r['pickled_at_max']:>10} {r['pickled_at_end']:>9} "
                  f"{r['us_per_step']:>8.1f}{flag}", flush=True)
    return rows


if __name__ == "__main__":
    main()
