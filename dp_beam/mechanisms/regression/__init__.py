"""Private incremental regression (seed 002): PrivIncReg1, PrivIncReg2, PrivIncERM.

Kasiviswanathan, Nissim, Jin, *Private Incremental Regression* (PODS 2017;
arXiv:1701.01093), as specified in
``docs/privacy/regression.md``. Engine-free:
NumPy/SciPy and the project's counters, no Beam.

* :mod:`.constraints` — the constraint sets :class:`L2Ball`, :class:`L1Ball`;
* :mod:`.moments` — the Gram (upper triangle) and x·y running sums released
  by a continual counter (BLT by default, the tree as the paper's TreeMech),
  with their sensitivities;
* :mod:`.solvers` — NoisyProjGrad with the r_t, η_t of R-9 (derived from Cor. B.2); the exact QP on
  the PSD-projected noisy Gram; PrivIncReg2's lift;
* :mod:`.incremental` — :class:`PrivIncReg1`, :class:`PrivIncReg2`;
* :mod:`.batch` — :class:`PrivIncERM` over the project's output-perturbation ERM.

Example (a test seed; production leaves ``rng=None``):

>>> import numpy as np
>>> from dp_beam.mechanisms.regression import L1Ball, PrivIncReg2, PrivIncReg2Params
>>> test_seed = 0
>>> params = PrivIncReg2Params(dim=6, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0),
...                            horizon=16, projection_dim=3)
>>> mech = PrivIncReg2(params, rng=test_seed)
>>> release = mech.push(np.array([0.5, 0, 0, 0, 0, 0]), 0.4)
>>> mech.projection.shape, params.constraint.contains(release.theta), release.method
((3, 6), True, 'privincreg2')
"""

from .base import RegressionRelease
from .batch import (PrivIncERM, PrivIncERMParams, RidgeOutputPerturbation, SquaredLoss,
                    advanced_composition, default_lambda, default_tau, per_run_budget)
from .constraints import Constraint, L1Ball, L2Ball, check_constraint, constraint_from_dict
from .incremental import (SOLVERS, PrivIncReg1, PrivIncReg1Params, PrivIncReg2, PrivIncReg2Params,
                          project_features, projection_dim)
from .moments import (COUNTERS, SPLITS, NoisyMoments, clip_point, encode_point, encode_points,
                      gram_sensitivity, smat, svec, svec_dim, upper_triangle, xy_sensitivity)
from .solvers import (gradient_error_bound, lift, noisy_proj_grad, npg_schedule, psd_part,
                      quadratic_value, solve_quadratic)

__all__ = [
    "L2Ball", "L1Ball", "Constraint", "check_constraint", "constraint_from_dict",
    "COUNTERS", "SPLITS", "SOLVERS",
    "NoisyMoments", "svec", "smat", "svec_dim", "upper_triangle", "clip_point", "encode_point",
    "encode_points",
    "gram_sensitivity", "xy_sensitivity",
    "npg_schedule", "gradient_error_bound", "noisy_proj_grad", "solve_quadratic", "psd_part",
    "quadratic_value", "lift",
    "RegressionRelease",
    "PrivIncReg1Params", "PrivIncReg1", "PrivIncReg2Params", "PrivIncReg2", "projection_dim",
    "project_features",
    "PrivIncERMParams", "PrivIncERM", "SquaredLoss", "RidgeOutputPerturbation",
    "per_run_budget", "advanced_composition", "default_tau", "default_lambda",
]
