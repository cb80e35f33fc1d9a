"""Parameter and constraint validation (dp_beam.mechanisms.regression.constraints).
"""

import pytest

from dp_beam.mechanisms.regression import (
    L1Ball,
    L2Ball,
    PrivIncERMParams,
    PrivIncReg1,
    PrivIncReg1Params,
    PrivIncReg2Params,
)

from .helpers import TEST_SEED


def test_parameters_are_validated_naming_the_parameter():
    ok = dict(dim=2, epsilon=1.0, delta=1e-6)
    for bad, name in ((dict(dim=0), "dim"), (dict(epsilon=-1.0), "epsilon"), (dict(delta=None), "delta"),
                      (dict(delta=1.5), "delta"), (dict(constraint="l2"), "constraint"),
                      (dict(counter="honaker"), "counter"), (dict(solver="sgd"), "solver"),
                      (dict(horizon=0), "horizon"), (dict(split="x"), "split"),
                      (dict(beta=1.0), "beta")):
        with pytest.raises(ValueError, match=name):
            PrivIncReg1Params(**{**ok, **bad})
    with pytest.raises(ValueError, match="radius"):
        L2Ball(-1.0)
    with pytest.raises(ValueError, match="radius"):
        L1Ball(float("inf"))
    with pytest.raises(ValueError, match="horizon"):
        PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=None)
    with pytest.raises(ValueError, match="noise"):
        PrivIncERMParams(dim=2, epsilon=1.0, delta=1e-6, horizon=5, noise="coord")
    with pytest.raises(ValueError, match="projection_dim"):
        PrivIncReg2Params(dim=3, epsilon=1.0, delta=1e-6, projection_dim=0)
    mech = PrivIncReg1(PrivIncReg1Params(**ok, horizon=2), rng=TEST_SEED)
    with pytest.raises(ValueError, match="x must have shape"):
        mech.push([1.0, 2.0, 3.0], 0.0)
    mech.push([0.1, 0.2], 0.0)
    mech.push([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="horizon"):
        mech.push([0.1, 0.2], 0.0)
