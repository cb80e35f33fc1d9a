"""The release record of the private ERM transforms (dp_beam.records_erm): fields, defaults
and the round trip through to_json and pickle (the coder Beam uses for NamedTuples)."""

import json
import pickle

from dp_beam.records import to_json
from dp_beam.records_erm import ModelRecord

FIELDS = ("key", "step", "window_start", "window_end", "t", "kind", "level", "weights",
          "intercept", "classes", "trained_on", "blocks", "data_window", "depends_on",
          "regulariser", "noise", "noise_scale", "noise_std", "call_epsilon", "call_rho",
          "mechanism", "transform")
TUPLES = ("classes", "trained_on", "blocks", "data_window", "depends_on", "regulariser")


def record(**kw):
    base = dict(key="k", step=3, window_start=10.0, window_end=20.0, t=8, kind="continual",
                level=1, weights=[0.5, -0.25], intercept=0.125, classes=(0, 1),
                trained_on=(0, 8), blocks=(0, 4), data_window=(0, 8), depends_on=((0, 8),),
                regulariser=None, noise="l2_laplace", noise_scale=0.75, noise_std=1.5,
                call_epsilon=0.5, call_rho=0.125, mechanism="continual_erm")
    base.update(kw)
    return ModelRecord(**base)


def from_json(obj):
    """Rebuild a record from its JSON form: JSON turns tuples into lists."""
    assert obj["record"] == "ModelRecord"
    values = {k: v for k, v in obj.items() if k != "record"}
    for name in TUPLES:
        if values[name] is not None:
            values[name] = tuple(tuple(v) if isinstance(v, list) else v for v in values[name])
    return ModelRecord(**values)


def test_fields_and_defaults():
    assert ModelRecord._fields == FIELDS
    assert ModelRecord._field_defaults == {"transform": ""}
    assert record().transform == ""


def test_round_trip_through_json():
    for r in (record(), record(regulariser=(0, 4), call_epsilon=None, transform="ContinualERM",
                               weights=[[0.1, 0.2], [0.3, 0.4]], intercept=[0.0, 1.0])):
        obj = to_json(r)
        assert obj["classes"] == [0, 1] and obj["depends_on"] == [[0, 8]]
        back = from_json(json.loads(json.dumps(obj)))
        assert back == r and type(back) is ModelRecord


def test_non_finite_noise_is_written_as_its_repr():
    assert to_json(record(noise_std=float("inf")))["noise_std"] == "inf"


def test_round_trip_through_pickle():
    r = record()
    back = pickle.loads(pickle.dumps(r))
    assert back == r and type(back) is ModelRecord
