"""PrivIncReg2's projection (dp_beam.mechanisms.regression.incremental; spec §4.6).
"""

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.regression import (
    L1Ball,
    PrivIncReg2,
    PrivIncReg2Params,
    lift,
    project_features,
)


def test_privincreg2_projection_clipping_restarts_and_space():
    params = PrivIncReg2Params(dim=12, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=64,
                               projection_dim=4)
    mech = PrivIncReg2(params, rng=5)
    phi = mech.projection
    # Drawn at construction, before any record; the same seed gives the same Φ.
    np.testing.assert_array_equal(PrivIncReg2(params, rng=5).projection, phi)
    rng = np.random.default_rng(10)
    sizes = set()
    for t in range(1, 65):
        x = rng.normal(size=12) * (10 ** rng.integers(0, 6))      # adversarial norms
        assert np.linalg.norm(project_features(phi, x)) <= 1.0 + 1e-12
        rel = mech.push(x, rng.normal() * 5)
        assert params.constraint.contains(rel.theta)
        # The release is the lift of its own projection (Φθ = √m·v with v = Φθ/√m ∈ K).
        np.testing.assert_allclose(phi @ rel.theta, phi @ lift(phi, phi @ rel.theta, params.constraint),
                                   atol=1e-8)
        sizes.add(mech.state_size())
    assert len(sizes) == 1                         # BLT: the state does not grow with t
    restored = PrivIncReg2.from_state(mech.to_state(), rng=1)
    np.testing.assert_array_equal(restored.projection, phi)
    with pytest.raises(ValueError, match="projection"):
        PrivIncReg2(params, rng=ZeroNoise())


def test_projection_dim_rule_is_capped_and_grows_with_the_stream():
    small = PrivIncReg2Params(dim=200, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=256,
                              feature_width=3.0, expected_records=1000)
    large = PrivIncReg2Params(dim=200, epsilon=1.0, delta=1e-6, constraint=L1Ball(1.0), horizon=256,
                              feature_width=3.0, expected_records=10 ** 6)
    assert 1 <= small.resolved_projection_dim() < large.resolved_projection_dim() <= 200
