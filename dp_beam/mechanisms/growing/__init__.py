"""Differential privacy for growing databases (seed 000; ``docs/privacy/growing.md``).

Engine-free mechanisms for a database that grows by one record at a time
(time = size, neighbours replace one record): the black-box schedulers
BBScheduler and BBImprover with their black boxes, the growing sparse-vector
family (ATG, NATG, NSG, LaplaceG) and Private Multiplicative Weights for
Growing databases (PMWG).
"""

from .boxes import ERMBox, LaplaceHistogram, MWEMHistogram, SmallDB, query_matrix
from .common import EpochTimes, as_query, epoch_times, exact_gamma, harmonic_tail, rho_star
from .pmwg import (PMWG, PMWGAnswer, PMWGParams, mix, mw_update, project_update,
                   relative_entropy)
from .schedulers import (BBImprover, BBImproverParams, BBScheduler, BBSchedulerParams, BlackBox,
                         Run)
from .svt import (ATG, NATG, NSG, GrowthNoise, LaplaceG, SVTAnswer, nsg_coefficients,
                  nsg_privacy_cost)

__all__ = [
    "BlackBox", "Run", "BBScheduler", "BBSchedulerParams", "BBImprover", "BBImproverParams",
    "LaplaceHistogram", "SmallDB", "MWEMHistogram", "ERMBox", "query_matrix",
    "PMWG", "PMWGParams", "PMWGAnswer", "mix", "mw_update", "project_update", "relative_entropy",
    "ATG", "NATG", "NSG", "LaplaceG", "GrowthNoise", "SVTAnswer", "nsg_coefficients",
    "nsg_privacy_cost",
    "EpochTimes", "epoch_times", "exact_gamma", "harmonic_tail", "rho_star", "as_query",
]
