"""The exponential mechanism over a finite candidate set, one sampler per noise source.

Algorithm 7 of seed 003 (``docs/privacy/mean.md`` M-6) picks
its private median with it, and the growing-database boxes of seed 000 pick
candidates with it, so it lives apart from either. The candidates are
indexed; the caller supplies their costs (lower is better) and the cost
sensitivity.
"""

from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from .noise import NoiseSource, SecureNoise, SeededNoise, ZeroNoise

__all__ = ["exponential_mechanism"]


def exponential_mechanism(cost: ArrayLike, epsilon: float, sensitivity: float,
                          source: NoiseSource) -> int:
    """Index of a candidate sampled with ``P(i) ∝ exp(−ε·cost_i/(2·sensitivity))``; ε-DP.

    The sampler follows the noise source (``docs/design.md`` D5):
    :class:`~dp_beam.mechanisms.noise_key.KeyedNoise` (the transforms'
    production source) samples the softmax pmf exactly with keyed coins
    (:meth:`~dp_beam.mechanisms.noise_key.KeyedNoise.exponential_choice`);
    :class:`SecureNoise` uses OpenDP's report-noisy-max (``make_noisy_max``
    with ``max_divergence``), which draws from the OS CSPRNG with exact
    arithmetic and whose privacy map is checked here to give at most ε for
    this sensitivity; it samples an ε-DP distribution that concentrates at
    least as much as the softmax. :class:`SeededNoise` (tests) samples the
    softmax pmf exactly with its generator; :class:`ZeroNoise` (tests, not
    private) returns the lowest-cost candidate.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.size == 1:
        return 0
    if isinstance(source, ZeroNoise):
        return int(np.argmin(cost))
    if isinstance(source, SeededNoise):
        logits = -epsilon * cost / (2.0 * sensitivity)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return int(source.generator.choice(cost.size, p=p))
    if getattr(source, "exact_grid", False):
        # Keyed production noise (KeyedNoise): the softmax pmf sampled with
        # exact coins, γ_i = ε·cost_i/(2Δ) in rational arithmetic.
        factor = Fraction(epsilon) / (2 * Fraction(sensitivity))
        return int(source.exponential_choice([factor * Fraction(float(c)) for c in cost]))
    if isinstance(source, SecureNoise):
        import opendp.prelude as dp

        dp.enable_features("contrib")
        domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=int(cost.size))
        scale = 2.0 * sensitivity / epsilon
        meas = dp.m.make_noisy_max(domain, dp.linf_distance(T=float, monotonic=False),
                                   dp.max_divergence(), scale=scale, negate=True)
        if meas.map(float(sensitivity)) > epsilon * (1 + 1e-9):
            raise RuntimeError("OpenDP noisy max does not certify the median's epsilon")
        return int(meas([float(c) for c in cost]))
    raise ValueError(f"no exponential-mechanism sampler for noise source {type(source).__name__}: "
                     "use SecureNoise, SeededNoise or ZeroNoise")
