"""The L2-Laplace distribution: noise with density ∝ exp(−‖ν‖₂/scale).

``docs/privacy/erm.md`` E-4 (seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*, Lemma
A.1): adding this noise with ``scale = Δ₂/ε`` to a function of L2 sensitivity
Δ₂ is ε-DP. Output perturbation of private ERM
(:class:`~dp_beam.mechanisms.erm.OutputPerturbation`) is its first user; the
sampler itself knows nothing of ERM and draws from any
:class:`~dp_beam.mechanisms.noise.NoiseSource`.
"""

import math
import numbers

import numpy as np

from .checks import check_dim
from .noise import NoiseSource

__all__ = ["l2_laplace_noise"]


def _check(scale, dim):
    # Same checks and messages as the ERM validators, kept local: the ERM
    # package imports this module, so importing back from it would be circular.
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be a real number, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if not scale >= 0:
        raise ValueError(f"scale must be >= 0, got {scale!r}")
    return scale, check_dim(dim)


def l2_laplace_noise(source: NoiseSource, scale: float, dim: int) -> np.ndarray:
    """Draw ν ∈ R^dim with density ∝ exp(−‖ν‖₂/scale) (erm.md E-4).

    ν = R·U with R ~ Gamma(dim, scale) and U uniform on the unit sphere,
    independent. Why this is exact: in polar coordinates the density of ν at
    radius r is f_R(r)/(r^{dim−1}·|S^{dim−1}|) ∝ r^{dim−1}e^{−r/scale}/r^{dim−1}
    = e^{−r/scale}, a function of ‖ν‖ only.

    Both parts come from the injected :class:`~dp_beam.mechanisms.noise.NoiseSource`,
    which offers Laplace and Gaussian draws and a direction:

    * R = Σ_{i=1}^{dim} |Z_i| with Z_i ~ Lap(scale). Lap(b) is symmetric with
      density e^{−|z|/b}/(2b), so |Z| has density e^{−z/b}/b on z ≥ 0, i.e.
      |Z| ~ Exp(b); a sum of dim independent Exp(b) is Gamma(dim, b) exactly.
    * U = g/‖g‖ with g ~ N(0, I_dim) (:meth:`~dp_beam.mechanisms.noise.NoiseSource.direction`):
      the standard normal vector is rotation invariant, so its direction is
      uniform on the sphere and independent of its norm. The keyed source
      computes g in floats from its stream (Box–Muller,
      :meth:`~dp_beam.mechanisms.noise_key.KeyedNoise.direction`); the radius
      keeps its exact draws.

    A zero radius (only a source that is switched off gives one) returns the
    zero vector without drawing a direction. The number of draws is fixed
    (one Laplace call of dim values, one direction), independent of the data.

    Caveat: ν is a float computation on grid draws and a float direction. With the keyed source
    :meth:`~dp_beam.mechanisms.erm.OutputPerturbation.train` rounds ν and the minimiser to the noise
    grid, so the release is an exact grid sum and shows no data through its
    low-order bits; the law of the rounded ν is the rounded float L2-Laplace,
    not an exactly specified discrete distribution (no exact sampler for a
    discrete L2-Laplace is known to us), which is the one place where the
    released law is that of a float computation. The coordinate noises
    (``"coord_laplace_l1"``, ``"gaussian"``) are exact discrete laws.
    """
    scale, dim = _check(scale, dim)
    radius = float(np.sum(np.abs(source.laplace(scale, dim))))
    if radius == 0.0:
        return np.zeros(dim, dtype=np.float64)
    return radius * source.direction(dim)
