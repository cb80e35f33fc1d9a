"""Effect of hierarchical consistency (Hay et al. 2010) on the error of prefix sums.

The tree mechanism of dp_beam releases one node per step (the Fenwick nodes of
the binary decomposition): N nodes for N prefix sums, no redundancy, so there
is nothing for consistency to reconcile. A mechanism that measures the full
dyadic tree (all 2N−1 nodes, every event in h = log2 N + 1 nodes) has
redundant nodes, and the least-squares consistent tree (spec §4 R10) is a
free post-processing that lowers the error. This script measures that effect
offline: full trees of Laplace noise, prefix sums from the binary
decomposition of the raw noisy nodes vs of the consistent nodes, over
``--trials`` trees; it prints the mean and max per-prefix std of both and
their ratio.

    python benchmarks/consistency.py [--log2n 10] [--trials 2000] [--epsilon 1.0]
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dp_beam.mechanisms.counting.postprocess import hay_consistency  # noqa: E402


def prefix_from_levels(levels, n):
    """Prefix sums 1..n from the binary decomposition of each prefix (popcount nodes)."""
    trials = levels[0].shape[1]
    out = np.zeros((n, trials))
    for c in range(1, n + 1):
        total = np.zeros(trials)
        start = 0
        for i in range(len(levels) - 1, -1, -1):
            if (c >> i) & 1:
                total += levels[i][start >> i]
                start += 1 << i
        out[c - 1] = total
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log2n", type=int, default=10)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args(argv)
    n = 1 << args.log2n
    height = args.log2n + 1
    scale = height / args.epsilon  # each event is in one node per level (L1 sensitivity h)
    rng = np.random.default_rng(0)
    # Zero data: the noise alone is the error, and consistency is linear.
    noisy = [rng.laplace(0, scale, (n >> i, args.trials)) for i in range(height)]
    consistent = hay_consistency(noisy, k=2)
    raw = prefix_from_levels(noisy, n).std(axis=1)
    fixed = prefix_from_levels(consistent, n).std(axis=1)
    print(f"full binary tree over N = {n} steps, Laplace scale h/ε = {scale:g}, "
          f"{args.trials} trials")
    print(f"{'':>12} {'mean std':>10} {'max std':>10}")
    print(f"{'raw nodes':>12} {raw.mean():10.2f} {raw.max():10.2f}")
    print(f"{'consistent':>12} {fixed.mean():10.2f} {fixed.max():10.2f}")
    print(f"ratio consistent/raw: mean {fixed.mean() / raw.mean():.3f}, "
          f"max {fixed.max() / raw.max():.3f}")


if __name__ == "__main__":
    main()
