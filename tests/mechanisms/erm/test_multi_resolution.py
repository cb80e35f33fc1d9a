"""Alg. 2, the multi-resolution ERM mechanism (dp_beam.mechanisms.erm.multi_resolution; spec
private_erm_and_incremental_regression.md §4.2).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

from fractions import Fraction

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import MultiResolutionERMMechanism

from .helpers import UNIT, feed


def test_multiresolution_schedule_spec_example_and_coverage():
    # B = 8 b0 in the spec; in B-block units q = t/B.
    assert MultiResolutionERMMechanism.schedule(4) == [(0, (3, 4)), (1, (2, 4)), (2, (0, 4))]
    assert MultiResolutionERMMechanism.schedule(5) == [(0, (4, 5))]
    assert MultiResolutionERMMechanism.schedule(6) == [(0, (5, 6)), (1, (4, 6))]
    assert MultiResolutionERMMechanism.schedule(8, max_scale=1) == [(0, (7, 8)), (1, (6, 8))]
    cost, per_scale = {}, {}
    for q in range(1, 513):   # horizon 2^12 b0-batches = 512 B-blocks
        for k, (lo, hi) in MultiResolutionERMMechanism.schedule(q):
            per_scale.setdefault(k, []).extend(range(lo + 1, hi + 1))
            for b in range(lo + 1, hi + 1):
                cost[b] = cost.get(b, 0) + Fraction(1, 2 ** (k + 1))
    for k, blocks in per_scale.items():
        assert sorted(blocks) == list(range(1, len(blocks) + 1))      # disjoint, covering
    assert max(cost.values()) == Fraction(1023, 1024)


def test_multires_state_is_bounded_with_a_scale_cap():
    stream = MultiResolutionERMMechanism(1.0, 2, lam=0.5, max_scale=2, rng=ZeroNoise(), **UNIT)
    for _ in feed(stream, 20)[0]:
        pass
    points, models = stream.state_size()
    assert points <= 4 * 2 and models == 0
