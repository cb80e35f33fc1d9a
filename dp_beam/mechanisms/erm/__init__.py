"""Private empirical risk minimisation with continual and sliding-window release.

``docs/privacy/erm.md`` (seed 004: Watson et al.,
*Continual and Sliding Window Release for Private ERM*), with the fixes of erm.md:

* :func:`l2_laplace_noise` — the ε-DP noise for an L2 sensitivity (E-4;
  :mod:`dp_beam.mechanisms.l2_laplace`);
* :class:`LogisticLoss` and :func:`solve_erm` — L2-regularised binary/softmax
  logistic regression on clipped features, solved to a certified tolerance
  (E-3, E-4; :mod:`.loss`, :mod:`.solver`);
* :class:`OutputPerturbation` — Algorithm 1 (PSGD, output perturbation) and
  Algorithm 3 (PBERM, regularised toward a released model, E-6), with the
  closed-form noise scales of Algorithms 2–5 (:mod:`.perturbation`);
* :class:`ModelRelease` and :func:`predict` — the released model
  (:mod:`.record`); :class:`BlockLog` — where a stream keeps its raw blocks
  (design D1.3, :mod:`.log`);
* :class:`ERMConfig` and its per-family subclasses :class:`ContinualERMConfig`,
  :class:`SlidingWindowERMConfig`, :class:`MultiResolutionERMConfig` — the
  validated parameters shared by the streams below and the Beam transforms
  (:mod:`.config`);
* :class:`MultiResolutionERMMechanism` (Algorithm 2, E-5), :class:`ContinualERMMechanism`
  (Algorithms 2 + 4, E-6) and :class:`SlidingWindowERMMechanism` (Algorithm 5 with the
  bucket / dependency-chain rule of E-7) — engine-free streams that consume
  blocks of points and return :class:`ModelRelease` records
  (:mod:`.multi_resolution`, :mod:`.continual`, :mod:`.sliding_window`, on the
  shared machinery of :mod:`.stream`).

Time is record count (E-1): a stream's ``t`` is the number of points consumed,
and intervals ``(a, b]`` are half-open record ranges. Privacy is event-level
under *replace one record* (E-1); all guarantees are pure ε-DP (δ = 0) unless
Gaussian noise is chosen.

The schedule (which data each model is trained on, its regulariser, its noise
scale) depends only on record counts and public parameters (design D1.3), so the whole
release sequence is a composition of output-perturbation calls whose per-record
costs are summed in the class docstrings (E-5 to E-7, E-9).
"""

# Callers (and tests) reach the solver's SciPy through this package, as they
# did through the single module it replaces.
from scipy import optimize  # noqa: F401

from ..checks import check_int as _int, check_real as _real  # noqa: F401
from ..l2_laplace import l2_laplace_noise
from .config import (
    ContinualERMConfig,
    ERMConfig,
    MultiResolutionERMConfig,
    SlidingWindowERMConfig,
)
from .continual import ContinualERMMechanism
from .log import BlockLog, MemoryBlockLog
from .loss import LogisticLoss, sigmoid as _sigmoid  # noqa: F401
from .multi_resolution import MultiResolutionERMMechanism
from .perturbation import (
    NOISE_KINDS,
    OutputPerturbation,
    alg2_noise_scale,
    alg3_noise_scale,
    alg5_base_noise_scale,
    alg5_finetune_noise_scale,
)
from .record import ModelRelease, predict, predict_proba  # noqa: F401
from .record import model_from_state as _model_from, model_to_state as _model_to  # noqa: F401
from .sliding_window import (  # noqa: F401
    WINDOW_POLICIES,
    SlidingWindowERMMechanism,
    _left_buckets,
    _right_buckets,
    sliding_buckets,
)
from .solver import _descent_steps, solve_erm  # noqa: F401
from .stream import ERMStream as _ERMStream, _merge, is_pow2 as _is_pow2  # noqa: F401

__all__ = [
    "NOISE_KINDS",
    "WINDOW_POLICIES",
    "ERMConfig",
    "ContinualERMConfig",
    "SlidingWindowERMConfig",
    "MultiResolutionERMConfig",
    "l2_laplace_noise",
    "alg2_noise_scale",
    "alg3_noise_scale",
    "alg5_base_noise_scale",
    "alg5_finetune_noise_scale",
    "LogisticLoss",
    "solve_erm",
    "OutputPerturbation",
    "ModelRelease",
    "BlockLog",
    "MemoryBlockLog",
    "MultiResolutionERMMechanism",
    "ContinualERMMechanism",
    "SlidingWindowERMMechanism",
    "sliding_buckets",
    "predict_proba",
    "predict",
]
