"""Continual counting: noisy running sums of a stream, released at every step.

The family behind ``ContinualCount`` and ``ContinualSum`` (and the counters of
the mean, regression and key-selection mechanisms): each mechanism consumes
one number or vector per step and releases the noisy prefix sum through it,
for a fixed horizon or an unbounded stream, with Laplace or Gaussian noise,
and states its noise (std and exact intervals) and privacy cost from public
parameters only. The neighbour relation and every sensitivity and cost
argument are the claims of ``docs/privacy/counting.md`` (C-1 to C-14).

Modules:

* :mod:`.tree`: :class:`BinaryTreeMechanism`, the binary (dyadic p-sum) tree.
* :mod:`.doubling`: which nodes a tree release sums; the epochs of the
  doubling construction for unbounded streams.
* :mod:`.parameters`: checks of the shared constructor parameters, the ρ they
  buy, the :class:`~dp_beam.accounting.cost.Cost` of a counter and the common
  start of ``from_state``.
* :mod:`.factorisation`: :class:`FactorisationMechanism`, the streaming
  ``B (R x + z)`` machinery the mechanisms below share, and the factorisation
  lower bound.
* :mod:`.honaker`, :mod:`.smooth_binary`, :mod:`.blt` (with the generated
  :mod:`.blt_table`), :mod:`.toeplitz`: the factorisation mechanisms.
* :mod:`.integer_units`: exact integer arithmetic of the integer right factor.
* :mod:`.lockstep`: many scalar streams of one configuration stepped together (a
  shard of a release), with each stream's own releases.
* :mod:`.intervals`: exact intervals of weighted sums of Laplace noises.
* :mod:`.participation`: sensitivity when a unit takes part in several steps.
* :mod:`.registry`: the mechanisms by name, the default choice and the
  multi-participation sensitivity.
* :mod:`.postprocess`: free post-processing of releases (monotone, isotonic,
  hierarchical consistency).
"""

from .blt import BLTMechanism, LockstepBLT, blt_errors, blt_parameters, optimise_blt
from .blt_table import BLT_TABLE
from .doubling import epoch_of, epoch_steps, release_intervals, release_levels
from .factorisation import RIGHT_FACTOR_SLACK, FactorisationMechanism, prefix_sum_lower_bound, prefix_sum_matrix
from .honaker import HonakerTreeMechanism
from .integer_units import dyadic, from_units, round_div_pow2, to_units
from .intervals import laplace_combination_halfwidth, laplace_release_halfwidth
from .lockstep import Lockstep, LockstepStreams, lockstep_of
from .parameters import (
    NOISE_KINDS,
    CounterConfig,
    check_calibration,
    check_delta,
    check_dim,
    check_epsilon,
    check_horizon,
    check_input,
    check_noise,
    check_sensitivity,
    privacy_cost,
    restore_parameters,
    zcdp_rho,
)
from .participation import toeplitz_participation_norm, tree_participation_norm
from .postprocess import MonotoneRelease, hay_consistency, isotonic_increasing
from .registry import MECHANISMS, default_mechanism, get_mechanism, participation_norm, participation_sensitivity
from .smooth_binary import SmoothBinaryMechanism, smooth_binary_shape
from .toeplitz import SqrtToeplitzMechanism, sqrt_toeplitz_coefficients
from .tree import BinaryTreeMechanism, LockstepTrees

__all__ = [
    "BLT_TABLE",
    "MECHANISMS",
    "NOISE_KINDS",
    "RIGHT_FACTOR_SLACK",
    "BLTMechanism",
    "BinaryTreeMechanism",
    "CounterConfig",
    "FactorisationMechanism",
    "HonakerTreeMechanism",
    "Lockstep",
    "LockstepBLT",
    "LockstepStreams",
    "LockstepTrees",
    "MonotoneRelease",
    "SmoothBinaryMechanism",
    "SqrtToeplitzMechanism",
    "blt_errors",
    "blt_parameters",
    "check_calibration",
    "check_delta",
    "check_dim",
    "check_epsilon",
    "check_horizon",
    "check_input",
    "check_noise",
    "check_sensitivity",
    "default_mechanism",
    "dyadic",
    "epoch_of",
    "epoch_steps",
    "from_units",
    "get_mechanism",
    "hay_consistency",
    "isotonic_increasing",
    "laplace_combination_halfwidth",
    "laplace_release_halfwidth",
    "lockstep_of",
    "optimise_blt",
    "participation_norm",
    "participation_sensitivity",
    "prefix_sum_lower_bound",
    "prefix_sum_matrix",
    "privacy_cost",
    "release_intervals",
    "release_levels",
    "restore_parameters",
    "round_div_pow2",
    "smooth_binary_shape",
    "sqrt_toeplitz_coefficients",
    "to_units",
    "toeplitz_participation_norm",
    "tree_participation_norm",
    "zcdp_rho",
]
