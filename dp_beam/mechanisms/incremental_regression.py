"""Private incremental regression (seed 002), engine-free: the public entry point.

Re-exports :mod:`dp_beam.mechanisms.regression` (split into modules of at
most 600 lines): PrivIncReg1 and PrivIncReg2 of Kasiviswanathan, Nissim, Jin,
*Private Incremental Regression* (arXiv:1701.01093),
PrivIncERM, the constraint sets and the solvers, as specified in
``docs/privacy/regression.md``.

Example (a test seed; production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.incremental_regression import L2Ball, PrivIncReg1, PrivIncReg1Params
>>> test_seed = 0
>>> mech = PrivIncReg1(PrivIncReg1Params(dim=3, epsilon=1.0, delta=1e-6, horizon=32,
...                                      constraint=L2Ball(2.0)), rng=test_seed)
>>> release = mech.push(np.array([0.6, 0.0, 0.8]), -0.5)
>>> release.t, release.n, len(release.theta), bool(np.linalg.norm(release.theta) <= 2.0)
(1, 1, 3, True)
"""

from .regression import *  # noqa: F401,F403
from .regression import __all__  # noqa: F401
