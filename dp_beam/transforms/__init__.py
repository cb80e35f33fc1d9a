"""Beam transforms: thin streaming adapters around dp_beam.mechanisms."""

from dp_beam.transforms.accounting import CombineAccounting, Stability, plan
from dp_beam.transforms.continual import ContinualCount, ContinualSum
from dp_beam.transforms.erm import ContinualERM, MultiResolutionERM, SlidingWindowERM
from dp_beam.transforms.keys import PrivateKeys
from dp_beam.transforms.mean import ContinualMean
from dp_beam.transforms.release import OrderedReleaseDoFn
from dp_beam.transforms.release_spec import ContinualResult, ReleaseSpec

__all__ = ["CombineAccounting", "ContinualCount", "ContinualERM", "ContinualMean",
           "MultiResolutionERM", "SlidingWindowERM", "ContinualResult", "PrivateKeys", "ContinualSum",
           "OrderedReleaseDoFn", "ReleaseSpec", "Stability", "plan"]
