"""Privacy costs and their conversions: pure ε, (ε, δ) and ρ-zCDP.

Conversions and (ε, δ) composition use ``dp-accounting`` (Google's
accountants) rather than re-derived formulas:

* ρ-zCDP → (ε, δ): the RDP accountant's conversion of the Rényi curve
  ``ε(α) = ρα`` (Canonne, Kamath, Steinke 2020), tighter than the classic
  ``ρ + 2√(ρ ln(1/δ))`` of Bun and Steinke, which is kept for comparison.
* (ε, δ) composition of many charges: privacy loss distributions (PLD). A
  Gaussian charge is composed exactly (its ρ fixes its noise multiplier
  ``1/√(2ρ)``); any other charge enters as the worst-case (ε, δ)-DP pair, which
  dominates every (ε, δ)-DP mechanism, so the result holds whatever the
  mechanism inside (``docs/privacy/accounting.md`` AC-2).
* Group privacy and stability (``docs/privacy/accounting.md`` AC-6): a transformation that lets one
  record change k records, or a user with k events under an event-level
  guarantee, multiplies ε by k, δ by ``k·e^{(k−1)ε}`` and ρ by ``k²``.
"""

import math
from typing import Iterable, Optional, Tuple

__all__ = ["best_epsilon", "GAUSSIAN", "pld_epsilon", "scale", "zcdp_to_epsilon",
           "zcdp_to_epsilon_classic"]

GAUSSIAN = "gaussian"


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """Smallest ε such that ρ-zCDP implies (ε, δ)-DP, by the RDP accountant.

    >>> round(zcdp_to_epsilon(0.5, 1e-6), 3)
    5.222
    >>> round(zcdp_to_epsilon_classic(0.5, 1e-6), 3)
    5.757
    """
    _check_delta(delta)
    if rho == 0:
        return 0.0
    from dp_accounting import ZCDpEvent
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


def zcdp_to_epsilon_classic(rho: float, delta: float) -> float:
    """Bun–Steinke 2016 Prop. 1.3: ``ε = ρ + 2√(ρ ln(1/δ))`` (looser)."""
    _check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _check_delta(delta):
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def scale(epsilon: float, delta: float, rho: float, k: int) -> Tuple[float, float, float]:
    """Cost of a mechanism when one unit can change k of its records (group privacy, AC-6).

    >>> scale(0.5, 0.0, 0.125, 3)
    (1.5, 0.0, 1.125)
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if k == 1:
        return epsilon, delta, rho
    d = k * math.exp((k - 1) * epsilon) * delta if delta else 0.0
    return k * epsilon, min(d, 1.0), k * k * rho


def pld_epsilon(charges: Iterable[Tuple[float, float, float, str]], delta: float) -> float:
    """ε at ``delta`` of the composition of ``(epsilon, delta, rho, noise)`` charges by PLD.

    Gaussian charges (``noise == "gaussian"`` with ρ > 0) use the exact
    Gaussian privacy loss with noise multiplier ``1/√(2ρ)``; every other charge
    the worst-case (ε, δ)-DP privacy loss. Pessimistic discretisation keeps
    the result an upper bound.
    """
    _check_delta(delta)
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    total = None
    for eps, dlt, rho, noise in charges:
        if noise == GAUSSIAN and rho > 0:
            part = pld.from_gaussian_mechanism(standard_deviation=1.0 / math.sqrt(2.0 * rho),
                                               sensitivity=1.0)
        else:
            if eps == 0 and dlt == 0:
                continue
            part = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, dlt))
        total = part if total is None else total.compose(part)
    if total is None:
        return 0.0
    return float(total.get_epsilon_for_delta(delta))


def best_epsilon(charges: Iterable[Tuple[float, float, float, str]],
                 delta: float) -> Tuple[Optional[float], str]:
    """The smallest valid ε at δ over basic composition, PLD and the zCDP route.

    Every route is an upper bound on the same composition, so their minimum is
    one too; the name of the route that gave it is returned with it.
    ``delta == 0`` admits basic composition of pure-ε charges only.
    """
    charges = list(charges)
    basic_eps = sum(c[0] for c in charges)
    basic_delta = sum(c[1] for c in charges)
    if delta == 0:
        return (basic_eps, "basic composition") if basic_delta == 0 else (None, "none")
    options = []
    if basic_delta <= delta:
        options.append((basic_eps, "basic composition"))
    options.append((pld_epsilon(charges, delta), "privacy loss distribution"))
    if all(c[1] == 0 or c[3] == GAUSSIAN for c in charges):
        # Every charge has a ρ (pure ε gives ε²/2; Gaussian its own), so ρ adds up.
        options.append((zcdp_to_epsilon(sum(c[2] for c in charges), delta), "zCDP"))
    return min(options)
