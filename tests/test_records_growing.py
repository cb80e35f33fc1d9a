"""The growing-database release records keep their fields, defaults and serialised form."""

import pickle

from dp_beam.records import to_json
from dp_beam.records_growing import HistogramRelease, QueryAnswer, SyntheticRelease

WHERE = ("key", "step", "window_start", "window_end", "t")
MADE_BY = ("mechanism", "transform")


def test_the_fields_of_each_record():
    assert SyntheticRelease._fields == WHERE + ("run", "epoch", "epsilon", "beta", "alpha",
                                                "pooled", "kind", "output") + MADE_BY
    assert QueryAnswer._fields == WHERE + ("query_id", "query_time", "kind", "value", "noise_std",
                                           "hard", "cap", "within_budget", "alpha") + MADE_BY
    assert HistogramRelease._fields == WHERE + ("query_id", "weights") + MADE_BY
    for cls in (SyntheticRelease, QueryAnswer, HistogramRelease):
        assert cls._field_defaults == {"transform": ""}
        assert list(cls.__annotations__) == list(cls._fields)


def test_records_serialise_as_before():
    r = HistogramRelease("k", 1, 10.0, 20.0, 5, "q", (0.5, 0.5), "pmwg")
    assert repr(r) == ("HistogramRelease(key='k', step=1, window_start=10.0, window_end=20.0, t=5, "
                       "query_id='q', weights=(0.5, 0.5), mechanism='pmwg', transform='')")
    assert to_json(r) == {"record": "HistogramRelease", "key": "k", "step": 1,
                          "window_start": 10.0, "window_end": 20.0, "t": 5, "query_id": "q",
                          "weights": [0.5, 0.5], "mechanism": "pmwg", "transform": ""}
    back = pickle.loads(pickle.dumps(r))
    assert back == r and type(back) is HistogramRelease
    assert type(r._replace(t=6)) is HistogramRelease
