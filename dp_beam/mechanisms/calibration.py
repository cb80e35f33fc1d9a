"""Privacy calibration: noise scales from privacy parameters and conversions.

Noise calibration is ``docs/privacy/counting.md`` C-4 and C-5; the
accountant's conversions (pure ε ⇒ ε²/2-zCDP; ρ-zCDP ⇒ (ε, δ)-DP) are
``docs/privacy/accounting.md`` AC-8.
"""

import math
import numbers

import dp_accounting

from ..accounting.costs import zcdp_to_epsilon_classic

__all__ = [
    "CALIBRATIONS",
    "rho_from_eps_delta",
    "eps_from_rho_delta",
    "gaussian_sigma",
    "laplace_scale",
    "noise_scale",
    "rho_from_eps",
]

#: How an (ε, δ) target is turned into a Gaussian σ (counting.md C-5).
CALIBRATIONS = ("zcdp", "analytic")


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _positive(name, value):
    value = _number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _nonnegative(name, value):
    value = _number(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


def _delta(value):
    value = _number("delta", value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {value!r}")
    return value


def rho_from_eps_delta(epsilon: float, delta: float) -> float:
    """Largest ρ whose zCDP guarantee implies (ε, δ)-DP by the simple conversion.

    Solves ``ρ + 2√(ρ ln(1/δ)) = ε`` (counting.md C-5,
    accounting.md AC-8): with L = ln(1/δ) it is a quadratic in √ρ whose positive root is
    ``√ρ = √(L + ε) − √L``. Computed as ``ε / (√(L+ε) + √L)`` to avoid the
    cancellation of the difference form when ε ≪ L.
    """
    epsilon = _positive("epsilon", epsilon)
    delta = _delta(delta)
    log_term = math.log(1.0 / delta)
    root = epsilon / (math.sqrt(log_term + epsilon) + math.sqrt(log_term))
    return root * root


def eps_from_rho_delta(rho: float, delta: float) -> float:
    """ε with ρ-zCDP ⇒ (ε, δ)-DP: ``ε = ρ + 2√(ρ ln(1/δ))`` (Bun–Steinke 2016, Prop. 1.3).

    This is the simple conversion (accounting.md AC-8); tighter ones exist, so the ε it reports is conservative (never
    smaller than the truth). It is the exact inverse of :func:`rho_from_eps_delta`, and
    :func:`dp_beam.accounting.costs.zcdp_to_epsilon_classic` (the one the costs use) with
    the arguments checked.

    >>> round(eps_from_rho_delta(rho_from_eps_delta(1.0, 1e-6), 1e-6), 12)
    1.0
    """
    rho = _nonnegative("rho", rho)
    delta = _delta(delta)
    # The accountant's conversion, so that the formula is written once (accounting.md AC-8).
    return zcdp_to_epsilon_classic(rho, delta)


def rho_from_eps(epsilon: float) -> float:
    """zCDP parameter ``ε²/2`` implied by pure ε-DP (Bun–Steinke 2016, Prop. 1.4; AC-8)."""
    epsilon = _nonnegative("epsilon", epsilon)
    return 0.5 * epsilon * epsilon


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Laplace scale ``b = Δ1/ε`` for pure ε-DP of a query with L1 sensitivity Δ1.

    ``docs/privacy/counting.md`` C-4: i.i.d.
    ``Lap(Δ1/ε)`` per coordinate of a vector whose L1 sensitivity is Δ1.
    """
    l1_sensitivity = _nonnegative("l1_sensitivity", l1_sensitivity)
    epsilon = _positive("epsilon", epsilon)
    return l1_sensitivity / epsilon


def gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float,
                   calibration: str = "zcdp") -> float:
    """σ of i.i.d. Gaussian noise giving (ε, δ)-DP to a query with L2 sensitivity Δ2.

    The two calibrations of ``docs/privacy/counting.md`` C-5:

    * ``"zcdp"``: ``σ = Δ2/√(2ρ)`` with ``ρ = rho_from_eps_delta(ε, δ)``.
      The mechanism is then ρ-zCDP, which composes additively, and (ε, δ)-DP
      by the simple conversion.
    * ``"analytic"``: the smallest σ for which the Gaussian
      mechanism is exactly (ε, δ)-DP (Balle–Wang 2018), from
      ``dp_accounting.get_sigma_gaussian`` (stated for sensitivity 1, hence
      scaled by Δ2). Smaller noise, but zCDP composition then has to use the
      mechanism's actual ``ρ = Δ2²/(2σ²)``.
    """
    l2_sensitivity = _nonnegative("l2_sensitivity", l2_sensitivity)
    epsilon = _positive("epsilon", epsilon)
    delta = _delta(delta)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    if calibration == "zcdp":
        rho = rho_from_eps_delta(epsilon, delta)
        return l2_sensitivity / math.sqrt(2.0 * rho)
    return l2_sensitivity * float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def noise_scale(noise: str, l1_sensitivity: float, l2_sensitivity: float, epsilon: float,
                delta: float = 0.0, calibration: str = "zcdp") -> float:
    """The scale of a mechanism's ``noise``: :func:`laplace_scale` of the L1 sensitivity for
    ``"laplace"``, :func:`gaussian_sigma` of the L2 one for ``"gaussian"`` (C-4, C-5).

    A counter whose noise kind is a parameter states both sensitivities of
    its noised vector and calibrates through this one branch.

    >>> noise_scale("laplace", 3.0, 2.0, epsilon=1.5)
    2.0
    >>> noise_scale("gaussian", 3.0, 2.0, 1.0, 1e-6) == gaussian_sigma(2.0, 1.0, 1e-6)
    True
    """
    if noise == "laplace":
        return laplace_scale(l1_sensitivity, epsilon)
    if noise == "gaussian":
        return gaussian_sigma(l2_sensitivity, epsilon, delta, calibration)
    raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
