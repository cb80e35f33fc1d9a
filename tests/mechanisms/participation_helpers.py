"""Brute-force participation sensitivity for small right factors (test helper)."""

import numpy as np


def patterns(horizon, k, b):
    """All non-empty sets of <= k steps (0-based) with consecutive gaps >= b."""

    def extend(prefix):
        yield prefix
        if len(prefix) == k:
            return
        start = prefix[-1] + b if prefix else 0
        for s in range(start, horizon):
            yield from extend(prefix + [s])

    for p in extend([]):
        if p:
            yield p


def brute_force_norm(right, k, b):
    horizon = right.shape[1]
    return max(np.linalg.norm(right[:, p].sum(axis=1)) for p in patterns(horizon, k, b))
