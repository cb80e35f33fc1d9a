"""The release record of IncrementalRegression (dp_beam.records_regression): fields, defaults
and the round trip through to_json and pickle (the coder Beam uses for NamedTuples)."""

import json
import pickle

from dp_beam.records import to_json
from dp_beam.records_regression import RegressionRecord

FIELDS = ("key", "step", "window_start", "window_end", "t", "n", "theta", "constraint", "method",
          "solver", "covers", "noise_std_gram", "noise_std_xy", "noise_std_model", "alpha",
          "mechanism", "transform")


def record(**kw):
    base = dict(key="JFK", step=5, window_start=18000.0, window_end=21600.0, t=6, n=1240,
                theta=[0.9, -0.1], constraint="l2_ball(4)", method="privincreg1", solver="exact",
                covers=(0, 5), noise_std_gram=43.4, noise_std_xy=61.4, noise_std_model=0.0,
                alpha=5104.2, mechanism="privincreg1(blt)")
    base.update(kw)
    return RegressionRecord(**base)


def from_json(obj):
    """Rebuild a record from its JSON form: JSON turns the ``covers`` tuple into a list."""
    assert obj["record"] == "RegressionRecord"
    values = {k: v for k, v in obj.items() if k != "record"}
    if values["covers"] is not None:
        values["covers"] = tuple(values["covers"])
    return RegressionRecord(**values)


def test_fields_and_defaults():
    assert RegressionRecord._fields == FIELDS
    assert RegressionRecord._field_defaults == {"transform": ""}


def test_round_trip_through_json():
    for r in (record(), record(covers=None, method="privincerm", transform="IncrementalRegression")):
        obj = to_json(r)
        assert obj["theta"] == list(r.theta)
        back = from_json(json.loads(json.dumps(obj)))
        assert back == r and type(back) is RegressionRecord


def test_numpy_values_and_non_finite_alpha_serialise():
    import numpy as np

    obj = to_json(record(theta=np.array([0.5, 0.25]), alpha=float("inf")))
    assert obj["theta"] == [0.5, 0.25] and obj["alpha"] == "inf"
    json.dumps(obj)


def test_round_trip_through_pickle():
    r = record()
    back = pickle.loads(pickle.dumps(r))
    assert back == r and type(back) is RegressionRecord
