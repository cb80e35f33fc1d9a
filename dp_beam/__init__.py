"""dp_beam: differentially private continual release over event streams, as Beam transforms.

Engine-free mechanisms live in :mod:`dp_beam.mechanisms`; the Beam transforms
(:class:`ContinualCount`, :class:`ContinualSum`, :class:`CombineAccounting`)
are thin adapters around them.
"""

from dp_beam import accounting, io, mechanisms, records
from dp_beam.accounting import Budget
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import AccountingReport, InvalidElement, KeyAdmitted, LedgerEntry, Release
from dp_beam.records_mean import MeanRelease
from dp_beam.transforms import (CombineAccounting, ContinualCount, ContinualERM, ContinualMean,
                                ContinualResult, ContinualSum, MultiResolutionERM,
                                PrivateKeys, SlidingWindowERM, Stability, plan)

__version__ = "0.1.0"

__all__ = ["AccountingReport", "Budget", "CombineAccounting", "ContinualCount", "ContinualERM",
           "ContinualMean", "KeyAdmitted", "MultiResolutionERM", "NoiseKey", "PrivateKeys", "SlidingWindowERM",
           "ContinualResult", "ContinualSum", "InvalidElement", "LedgerEntry", "MeanRelease",
           "Release", "Stability", "accounting", "io", "mechanisms", "plan", "records"]
