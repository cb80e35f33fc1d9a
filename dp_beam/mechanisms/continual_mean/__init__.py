"""Continual mean estimation under user-level privacy (seed 003).

Algorithms 2, 4, 5, 6 and 7 of George, Ramesh, Singh, Tyagi (arXiv:2212.09980),
with bounded values in d dimensions; the privacy argument is
docs/privacy/mean.md (M-1 to M-10). Engine-free: NumPy and OpenDP only, no Beam.

Pieces, each usable on its own:

* :class:`MeanConfig` — the user-facing parameters, frozen and validated,
  taken alike by :class:`MeanParams`, :class:`ContinualMeanMechanism` and the
  Beam transform ``dp_beam.ContinualMean``.
* :class:`MeanParams` — every canonical constant of Algorithm 6 (L, ε_B, ε_M, β_M,
  G_ℓ, k_ℓ, γ_ℓ, Δ_ℓ, W_ℓ, noise scales) for both neighbour relations.
* :func:`withhold_release` — the per-user exponential withhold-release
  schedule (M-2) on an O(1) per-user state.
* :func:`private_median` — Algorithm 7 (M-6): arrays, quantisation grid and
  the exponential mechanism.
* :class:`ContinualMeanCore` — the central part of Algorithm 6 (M-3 to M-7): the
  L+1 binary mechanisms, buffering of inactive levels, activation, medians and
  the estimate, fed one aggregate (:class:`MeanAggregate`) per time step. The
  Beam transform builds the same aggregates in parallel and feeds the same
  core, so the two share every formula.
* :class:`ContinualMeanMechanism` — the engine-free whole: per-user state plus core.
* Baselines :class:`NaiveMean` (Algorithm 2), :class:`SingleTreeMean`
  (Algorithm 4) and :class:`MultiTreeMean` (Algorithm 5), element-indexed as
  in the paper, and their per-time-step forms :class:`StepNaiveMean` and
  :class:`StepPriorMean` for comparisons with the same cap, noise family and
  neighbour relation.

Neighbour relations (M-1; AC-7)
    ``neighbours="values"`` is the paper's model: two streams are neighbours
    when one user's *values* differ, the arrival pattern (who sends a sample
    when) being identical and public. Counts, release times, activation times
    and the diversity flag are then released for free. ``neighbours=
    "participation"`` (the default) protects the presence of a whole user:
    neighbours differ by adding or removing all samples of one user. Counts
    are then private too, so they are released through one more binary
    mechanism (the *count tree*), activation and the denominator of the
    estimate are read from noisy counts, elements are centred before they
    enter a tree and the medians use an array layout in which one user
    touches one array. It costs a little accuracy and is what a deployment
    that cannot make participation public needs.

Time indexing
    The paper feeds a tree B_ℓ one *element* at a time (horizon n). Here, as in
    every dp_beam transform, a tree is stepped once per *time step* with the
    sum of the elements of that step (an empty step feeds zero). Each user
    still puts at most one element into each B_ℓ over the whole stream, so a
    user changes the sequence of tree inputs by at most one element's
    sensitivity and the tree calibration of C-3 to C-5 applies with ``c_u = 1``;
    only the depth changes from ``h(n)`` to ``h(horizon in steps)`` (or the
    unbounded construction, C-6; M-3). Feeding one sample per step reproduces the
    paper's schedule exactly. The paper's parameter tables are reproduced by
    :class:`MeanParams` with ``tree_levels=h(n)``.

Sensitivities (M-4 for values, M-5 for participation, M-6 for the medians)
    Values are rescaled to [0, 1] per coordinate (post-processing) and each user's sums
    are d-vectors.

    *values* (replace one user's values): a level-0/1 element is one sample,
    which moves by at most 1 per coordinate; a level-ℓ ≥ 2 element is
    projected onto ``I_ℓ = [c_ℓ − Δ_ℓ, c_ℓ + Δ_ℓ]`` (c_ℓ = 2^{ℓ−1}μ̃_ℓ), so it
    moves by at most the full width ``W_ℓ = 2Δ_ℓ`` (M-4). One user, one
    element per tree: tree L1 sensitivity ``d·W_ℓ``, L2 ``√d·W_ℓ``. Medians:
    a user's ≤ 2^{ℓ−1} samples are contiguous, so they touch ≤ 2 arrays and
    the cost ``c(y)`` moves by ≤ 2 (Claim E.1).

    *participation* (add/remove one user): an element is now present or
    absent, so what matters is its magnitude, not its spread. Each element is
    centred before it enters a tree: ``x − ½`` for levels 0 and 1 (|·| ≤ ½ per
    coordinate) and ``Π_{I_ℓ}(S) − c_ℓ`` for ℓ ≥ 2 (|·| ≤ Δ_ℓ, since the
    projection lands within Δ_ℓ of the centre). One user, one element per
    tree: tree sensitivity ``d·e_ℓ`` (L1) or ``√d·e_ℓ`` (L2) with ``e_0 = e_1 =
    ½`` and ``e_ℓ = Δ_ℓ``. The centres are added back with noisy counts from
    the count tree, whose per-step input is the vector of new elements per
    level ``(n_0..n_L)`` and of ``A_ℓ`` increments divided by ``2^{ℓ−1}``
    (ℓ = 2..L). Over the whole stream a user adds at most 1 to each of these
    2L coordinates (one element per level; ``min(M_u, 2^{ℓ−1})/2^{ℓ−1} ≤ 1``),
    so the count tree has L1 sensitivity 2L and L2 sensitivity √(2L) (L+1 and
    √(L+1) when L ≤ 1). The median uses *hashed* arrays: a public hash of the
    user id assigns each user to one of k_ℓ arrays, each array is filled with
    the first samples of its users in first-arrival order and only full arrays
    enter the cost. Adding or removing a user changes, creates or removes at
    most the one array of its bucket, so each of ``#{Ỹ < y}`` and
    ``#{Ỹ > y}`` moves by ≤ 1 and ``c(y)`` by ≤ 1: the cost sensitivity is 1.
    The contiguous layout of the paper would shift every later array (cost
    sensitivity up to k), which is why it is not used here. Everything else
    that reads data (activation, the denominator, the diversity flag, the
    choice of which samples fill the arrays up to the activation time) is a
    function of the data through the count tree's noisy output or of public
    quantities only, and the trees of a step are run after the count tree of
    that step: adaptive sequential composition (AC-2) gives the total.
    Where a user's presence could still shift *which* of another user's
    samples enter an array (the first-arrival order within a bucket), the
    shift stays inside the user's own bucket, which is the one array already
    counted. The within-bucket argument assumes buckets are chosen by a
    public, data-independent hash (M-6).

Presets
    ``preset="paper"`` is the paper's Algorithm 6 with its canonical
    constants (everything below under "Budget split" and the sensitivities
    above). ``preset="tuned"`` (the default) is the same algorithm with
    data-independent, privacy-preserving engineering that makes it beat
    Algorithm 2 at realistic sizes: tight ranges, trivially wide levels left
    untruncated, the prior of a level taken from the already released
    estimate instead of a private median, one value tree for all levels, a
    small weighted count tree and budgets by use. :class:`MeanParams` lists
    each change with its privacy argument; docs/user_mean_accuracy.md has
    the measurements.

Budget split (M-7; ``preset="paper"``)
    ε/2 to the binary mechanisms (equal shares over the L+1 value trees, plus
    the count tree under participation) and ε/(2L) to each of the L−1 medians
    (``per_L``; ``per_L_minus_1`` gives ε/(2(L−1))). With L ≤ 1 there are
    no medians and the trees get all of ε. With d coordinates each median is
    run per coordinate at ``ε_M/d`` (basic composition, AC-2). Gaussian noise
    (``noise="gaussian"``) works in zCDP: ρ = ρ(ε, δ) of C-5,
    ρ/2 to the trees and ρ/2 to the d·(L−1) pure-DP medians
    (``ε_m = √(ρ/(d(L−1)))``, each ``ε_m²/2``-zCDP).

Submodules, one concept each: :mod:`.schedule` (M-2), :mod:`.params` and
its tuned plan :mod:`.plan` (M-7, M-8), :mod:`.median` (Algorithm 7),
:mod:`.aggregate` and :mod:`.core` (Algorithm 6), :mod:`.lockstep` (many
streams' trees stepped together), :mod:`.stream` (the engine-free whole) and
:mod:`.baselines`; the exponential mechanism is
:mod:`dp_beam.mechanisms.exponential`. Every name is re-exported here.
"""

from ..exponential import exponential_mechanism
from .aggregate import MeanAggregate
from .baselines import (MultiTreeMean, NaiveMean, SingleTreeMean, StepNaiveMean, StepPriorMean,
                        prior_truncation)
from .core import ContinualMeanCore, MeanStep
from .lockstep import MeanLockstep
from .median import grid, median_cost, private_median, quantize
from .config import NEIGHBOURS, PRESETS, MeanConfig, check_keywords, mean_config
from .params import MeanParams
from .schedule import (UserState, element_size, release_level, represented_count, user_hash,
                       withhold_release)
from .stream import ContinualMeanMechanism

# The module was one file before it was split: these names were importable
# from it, and pickles of MeanAggregate name _rebuild_aggregate here.
from .aggregate import _rebuild_aggregate, contribution  # noqa: F401
from .baselines import _Baseline, _counter, _PriorMean, _resolve_noise  # noqa: F401
from .median import _bucket, _contiguous_arrays, _hashed_arrays  # noqa: F401
from .config import h, positive_int as _pos_int, positive_real as _pos_real  # noqa: F401
from .plan import (CENTRE_OFFSET, CLIP_TAIL, LAPLACE_TREES, PLAN_HORIZON,  # noqa: F401
                   PLAN_USER_FRACTIONS, PRIOR_CONFIDENCE, PRIOR_RATIOS, QUERY_SHARE,
                   _clip_term, _unit_noise_std, prior_error_bound)
from .stream import rescale_setup as _rescale_setup  # noqa: F401

__all__ = [
    "NEIGHBOURS",
    "MeanConfig",
    "mean_config",
    "check_keywords",
    "MeanParams",
    "MeanAggregate",
    "UserState",
    "withhold_release",
    "release_level",
    "element_size",
    "represented_count",
    "grid",
    "quantize",
    "median_cost",
    "exponential_mechanism",
    "private_median",
    "ContinualMeanCore",
    "ContinualMeanMechanism",
    "MeanLockstep",
    "MeanStep",
    "NaiveMean",
    "SingleTreeMean",
    "MultiTreeMean",
    "StepNaiveMean",
    "StepPriorMean",
    "prior_truncation",
    "PRESETS",
    "user_hash",
]
