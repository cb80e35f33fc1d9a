"""Continual-counting mechanisms by name, and their sensitivity under multiple participation.

All mechanisms share the constructor and methods of
:class:`~dp_beam.mechanisms.counting.tree.BinaryTreeMechanism`, so a transform can
take ``mechanism="blt"`` and build any of them with the same arguments.

The multi-participation bounds are those of ``docs/privacy/counting.md``, C-8.
"""

import math
import numbers
from typing import Optional

from .blt import BLTMechanism
from .honaker import HonakerTreeMechanism
from .participation import tree_participation_norm
from .smooth_binary import SmoothBinaryMechanism
from .toeplitz import SqrtToeplitzMechanism
from .tree import BinaryTreeMechanism

__all__ = ["MECHANISMS", "default_mechanism", "get_mechanism", "participation_norm",
           "participation_sensitivity"]

MECHANISMS = {
    "tree": BinaryTreeMechanism,
    "honaker": HonakerTreeMechanism,
    "smooth_binary": SmoothBinaryMechanism,
    "blt": BLTMechanism,
    "sqrt_toeplitz": SqrtToeplitzMechanism,
}


def get_mechanism(name: str) -> type:
    """The mechanism class registered under ``name`` (a key of :data:`MECHANISMS`)."""
    try:
        return MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"mechanism must be one of {sorted(MECHANISMS)}, got {name!r}") from None


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _single_and_multi(mechanism_name, horizon, k, b):
    cls = get_mechanism(mechanism_name)
    if cls is BinaryTreeMechanism:
        # The tree's right factor has one row per p-sum node (left children
        # only); the full-tree bound covers it.
        levels = horizon.bit_length()
        return math.sqrt(levels), tree_participation_norm(horizon, k, b, levels)
    return cls._plan(horizon).l2, cls.participation_norm(horizon, k, b)


def participation_norm(mechanism_name: str, horizon: int, k: int, b: int) -> float:
    """``max_P ‖Σ_{s∈P} R[:, s]‖₂`` for the mechanism's right factor R over ``horizon`` steps.

    P ranges over the participation patterns of one privacy unit: at most k
    steps, consecutive ones at least b steps apart (b = 1: any k steps),
    each contributing a change of L2 norm <= 1. Exact for ``blt`` and
    ``sqrt_toeplitz`` (greedy pattern, see
    :func:`~dp_beam.mechanisms.counting.participation.toeplitz_participation_norm`);
    an upper bound for the tree family (attained for ``honaker`` when T and
    b are powers of two and k·b <= T), which is what calibration needs.
    """
    horizon = _positive_int("horizon", horizon)
    return _single_and_multi(mechanism_name, horizon, _positive_int("k", k), _positive_int("b", b))[1]


def participation_sensitivity(
    mechanism_name: str, horizon: Optional[int], k: int, b: int, noise: str = "laplace"
) -> float:
    """The ``sensitivity`` to pass for a unit in up to k steps at least b apart.

    Mechanisms calibrate their noise to ``sensitivity × (largest single
    column norm of R)``, in the norm of their noise: L1 for Laplace noise
    (``plan.l1``, the tree's ``levels``), L2 for Gaussian noise. So the
    multiplier is ``max_P ‖Σ_{s∈P} R[:, s]‖ / max_s ‖R[:, s]‖`` in that norm,
    for a unit whose per-step change is at most 1 in the same norm; multiply
    by the per-step bound of the unit's change.

    * ``noise="gaussian"``: :func:`participation_norm` over the single column
      L2 norm (<= k by the triangle inequality, usually much less for the
      Toeplitz factorisations; for vectors the worst case aligns all changes,
      as R >= 0 entrywise).
    * ``noise="laplace"`` (the mechanisms' default): the right factors that
      offer Laplace noise (``tree``, ``honaker``, ``smooth_binary``) are 0/1
      matrices whose columns all have the calibrated L1 norm (the tree's
      p-sum columns at most that), so non-negative columns add up in L1:
      ``‖Σ_{s∈P} R[:, s]‖₁ = Σ_{s∈P} ‖R[:, s]‖₁``, and the multiplier is the
      largest pattern size ``min(k, ⌊(T−1)/b⌋ + 1)``. The L2 ratio would be
      too small here (tree, T = 1024, k = 4, b = 1: 3.77 instead of 4, an
      ε about 6 % over the stated one). ``blt`` and ``sqrt_toeplitz`` offer
      no Laplace noise and raise ``ValueError`` naming ``noise``.

    ``horizon=None`` (unbounded, epoch construction) returns k for both
    noises: the unit's steps may straddle epochs of different right factors,
    and the triangle-inequality multiplier is valid for every split (the
    argument of C-6 in ``docs/privacy/counting.md`` needs ``Σ_k D_k <= Δ`` with
    D_k the per-epoch change).

    >>> participation_sensitivity("tree", 1024, 4, 1)
    4.0
    >>> round(participation_sensitivity("tree", 1024, 4, 1, noise="gaussian"), 2)
    3.77
    """
    k = _positive_int("k", k)
    b = _positive_int("b", b)
    cls = get_mechanism(mechanism_name)
    if noise not in ("laplace", "gaussian"):
        raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
    if noise == "laplace" and not getattr(cls, "LAPLACE", True):
        raise ValueError(f"noise must be 'gaussian' for {mechanism_name}: "
                         f"{cls._laplace_refusal()}")
    if horizon is None:
        return float(k)
    horizon = _positive_int("horizon", horizon)
    if noise == "laplace":
        return float(min(k, (horizon - 1) // b + 1))
    single, multi = _single_and_multi(mechanism_name, horizon, k, b)
    return multi / single


def default_mechanism(noise: str = "laplace", horizon: Optional[int] = None) -> str:
    """The default mechanism for a noise family and horizon: the most accurate
    one whose release (value, std and exact 95 % interval) stays cheap.

    Measured as the largest std of a release over the horizon (ε = 1, unit
    sensitivity; ``benchmarks/continual_error.py`` for Gaussian noise): with
    Gaussian noise BLT is best (21.2 vs the tree's 69.3 at T = 8,760; 52.1 vs
    79.5 unbounded); with Laplace noise (BLT and the square-root factorisation
    do not apply) the smooth binary mechanism is best for a known horizon (33.7
    vs 68.6 at T = 8,760). With Laplace noise and no horizon Honaker's estimator
    is more accurate (51.2 vs 70.8 over 8,760 steps) but its exact interval
    inverts a different weighted Laplace sum at every step (21 ms per release
    measured, against 0.1–3.5 ms for the others), which made the flights
    throughput benchmark 4× slower; the tree stays the default there and
    ``mechanism="honaker"`` is one argument away. A test re-derives these
    choices.
    """
    if noise == "gaussian":
        return "blt"
    return "smooth_binary" if horizon is not None else "tree"
