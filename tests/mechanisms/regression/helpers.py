"""Shared helpers of the regression tests.
"""

import numpy as np


TEST_SEED = 0   # a test seed: SeededNoise, not private


def unit_points(rng, n, d, radius=1.0):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0, radius, size=(n, 1))
