"""Shared data and stream helpers of the ERM tests.
"""

import numpy as np


# Binary, no intercept, ‖x‖ <= 1: L = 1, the spec's reference setting.
UNIT = dict(n_features=2, classes=[0, 1], feature_bound=1.0, fit_intercept=False)



def data(n, d=2, k=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = rng.integers(0, k, size=n)
    return X, y


def feed(stream, n_blocks, seed=0):
    bs = stream.block_size
    X, y = data(n_blocks * bs, d=stream.loss.n_features, k=len(stream.loss.classes), seed=seed)
    out = []
    for c in range(n_blocks):
        out.append(stream.step(X[c * bs:(c + 1) * bs], y[c * bs:(c + 1) * bs]))
    return out, X, y
