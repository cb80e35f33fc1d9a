"""Beam transforms: thin streaming adapters around dp_beam.mechanisms."""

from dp_beam.transforms.accounting import CombineAccounting, Stability, plan
from dp_beam.transforms.continual import ContinualCount, ContinualSum
from dp_beam.transforms.erm import ContinualERM, MultiResolutionERM, SlidingWindowERM
from dp_beam.transforms.mean import ContinualMean
from dp_beam.transforms.release import ContinualResult, OrderedReleaseDoFn, ReleaseSpec

__all__ = ["CombineAccounting", "ContinualCount", "ContinualERM", "ContinualMean",
           "MultiResolutionERM", "SlidingWindowERM", "ContinualResult", "ContinualSum",
           "OrderedReleaseDoFn", "ReleaseSpec", "Stability", "plan"]
