"""Output perturbation for private ERM and its noise calibration.

``docs/privacy/erm.md`` E-4, E-6 and E-5 to E-7 (seed
004: Watson et al., *Continual and Sliding Window Release for Private ERM*):
:class:`OutputPerturbation` is Algorithm 1 (PSGD, output perturbation) and
Algorithm 3 (PBERM, regularised toward a released model); the
``alg*_noise_scale`` functions are the closed-form noise scales of
Algorithms 2–5 that the tests check the calibrated scales against.
"""

import math
from typing import Dict, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike

from ..calibration import rho_from_eps, rho_from_eps_delta
from ..checks import check_real
from ..l2_laplace import l2_laplace_noise
from ..noise import RngLike, make_noise
from ..noise_grid import grid_padded_scale, round_to_grid
from .loss import LogisticLoss
from .solver import solve_erm

__all__ = [
    "NOISE_KINDS",
    "alg2_noise_scale",
    "alg3_noise_scale",
    "alg5_base_noise_scale",
    "alg5_finetune_noise_scale",
    "OutputPerturbation",
]

#: Output-perturbation noise (erm.md E-4): ``"l2_laplace"`` (default, ε-DP for the
#: L2 sensitivity), ``"coord_laplace_l1"`` (i.i.d. Laplace calibrated to the L1
#: bound √p·Δ₂, ε-DP) and ``"gaussian"`` (ρ-zCDP, hence (ε, δ)-DP).
NOISE_KINDS = ("l2_laplace", "coord_laplace_l1", "gaussian")


def alg2_noise_scale(lipschitz: float, lam: float, base_size: int, epsilon: float) -> float:
    """Alg. 2 noise scale ``b = 4L/(λBε)``, constant over scales k (erm.md E-3, E-4, E-5 to E-7)."""
    return 4.0 * lipschitz / (lam * base_size * epsilon)


def alg3_noise_scale(lipschitz: float, lam: float, block_size: int, epsilon: float) -> float:
    """Alg. 3 / Alg. 4 update noise ``b = 4L/(λ b0 ε)`` (erm.md E-3, E-4, E-5 to E-7)."""
    return 4.0 * lipschitz / (lam * block_size * epsilon)


def alg5_base_noise_scale(lipschitz: float, lam: float, base_blocks: int, block_size: int,
                          epsilon: float) -> float:
    """Alg. 5 base-model noise ``b = 6L/(λ ε P w0)`` (erm.md E-3, E-4, E-5 to E-7)."""
    return 6.0 * lipschitz / (lam * epsilon * base_blocks * block_size)


def alg5_finetune_noise_scale(lipschitz: float, lam: float, block_size: int,
                              epsilon: float) -> float:
    """Alg. 5 fine-tune noise ``b = 12L/(λ w0 ε)``, constant over levels (erm.md E-3, E-4, E-7)."""
    return 12.0 * lipschitz / (lam * block_size * epsilon)


class OutputPerturbation:
    """Algorithm 1 (PSGD output perturbation) and Algorithm 3 (PBERM), erm.md E-3, E-4, E-6.

    ``train(X, y, theta_ref, fraction)`` minimises
    ``(1/n)Σℓ + λ‖θ − θ_ref‖²`` over the n given points (normalised by the
    actual n, the E-6 fix) with :func:`solve_erm`, then adds noise calibrated
    so that the call costs ``fraction`` of this component's budget:

    * ``"l2_laplace"``: L2-Laplace with ``b = Δ₂/(fraction·ε)``, Δ₂ = 2L/(λn);
      the call is (fraction·ε)-DP (Lemma A.1 of 004). Per-coordinate std
      ``√(p+1)·b``.
    * ``"coord_laplace_l1"``: i.i.d. Lap(√p·Δ₂/(fraction·ε)) per coordinate;
      ‖·‖₁ <= √p‖·‖₂ makes it (fraction·ε)-DP. Std ``√2·√p·Δ₂/(fraction·ε)``.
    * ``"gaussian"`` (our addition, not in the paper): N(0, σ²I) with ``σ = Δ₂/√(2·fraction·ρ)``, so the
      call is (fraction·ρ)-zCDP; ρ = ρ(ε, δ) by the simple conversion. Fractions
      that sum to <= 1 per record then compose to ρ-zCDP, hence (ε, δ)-DP.

    θ_ref is 0 for a model trained from scratch, or a previously **released**
    (noisy) model for PBERM: it is public, so using it is post-processing.
    """

    def __init__(self, loss: LogisticLoss, lam: float, epsilon: float, noise: str = "l2_laplace",
                 delta: Optional[float] = None, rng: RngLike = None,
                 tol_fraction: float = 0.5) -> None:
        self.loss = loss
        self.lam = check_real("lam", lam, positive=True)
        self.epsilon = check_real("epsilon", epsilon, positive=True)
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
        self.noise = noise
        if noise == "gaussian":
            if delta is None:
                raise ValueError("delta must be in (0, 1) for Gaussian noise, got None")
            self.delta = check_real("delta", delta)
            if not 0.0 < self.delta < 1.0:
                raise ValueError(f"delta must be in (0, 1) for Gaussian noise, got {delta!r}")
            self.rho = rho_from_eps_delta(self.epsilon, self.delta)
        else:
            if delta not in (None, 0, 0.0):
                raise ValueError(f"delta must be None or 0 for {noise!r} noise (pure epsilon-DP), got {delta!r}")
            self.delta = 0.0
            self.rho = rho_from_eps(self.epsilon)
        self.tol_fraction = check_real("tol_fraction", tol_fraction, positive=True)
        if self.tol_fraction > 1.0:
            raise ValueError(f"tol_fraction must be <= 1, got {tol_fraction!r}")
        self.source = make_noise(rng)

    def sensitivity(self, n: int) -> float:
        """Paper-conservative L2 sensitivity ``2L/(λn)`` of the minimiser (E-3, E-4)."""
        return 2.0 * self.loss.lipschitz / (self.lam * n)

    def call_noise(self, n: int, fraction: float) -> dict:
        """``{"kind", "scale", "std"}`` of a call on n points costing ``fraction`` of the budget.

        The scale is calibrated for the L2 sensitivity plus ``√p`` noise-grid
        steps: :meth:`train` rounds the minimiser to the grid of its noise
        (see there), which can move it by half a step per coordinate
        (:func:`~dp_beam.mechanisms.noise_grid.grid_padded_scale`).
        """
        delta2 = self.sensitivity(n)
        p = self.loss.n_params
        if self.noise == "l2_laplace":
            def scale_of(s):
                return s / (fraction * self.epsilon)
        elif self.noise == "coord_laplace_l1":
            def scale_of(s):
                return math.sqrt(p) * s / (fraction * self.epsilon)
        else:
            def scale_of(s):
                return s / math.sqrt(2.0 * fraction * self.rho)
        scale = grid_padded_scale(delta2, scale_of, spread=math.sqrt(p))
        if self.noise == "l2_laplace":
            std = math.sqrt(p + 1.0) * scale
        elif self.noise == "coord_laplace_l1":
            std = math.sqrt(2.0) * scale
        else:
            std = scale
        return {"kind": self.noise, "scale": scale, "std": std}

    def draw(self, scale: float) -> np.ndarray:
        p = self.loss.n_params
        if self.noise == "l2_laplace":
            return l2_laplace_noise(self.source, scale, p)
        if self.noise == "coord_laplace_l1":
            return self.source.laplace(scale, p)
        return self.source.gaussian(scale, p)

    def train(self, X: ArrayLike, yi: ArrayLike, theta_ref: Optional[ArrayLike],
              fraction: float) -> Tuple[np.ndarray, Dict[str, float]]:
        """Noisy minimiser and its noise description (``X`` clipped, ``yi`` indices)."""
        theta, _ = solve_erm(self.loss, X, yi, self.lam, theta_ref, self.tol_fraction)
        noise = self.call_noise(X.shape[0], fraction)
        draw = self.draw(noise["scale"])
        if self.source.exact_grid:
            # Keyed production noise: θ and the noise on one grid, so the
            # sum is exact and its low-order bits carry nothing about the
            # data (Mironov 2012). Coordinate noise is already on the grid;
            # the L2-Laplace vector is a float computation on grid draws and
            # is rounded to it here (post-processing of data-free noise).
            theta = round_to_grid(theta, noise["scale"])
            draw = round_to_grid(draw, noise["scale"])
        return theta + draw, noise
