"""Output records (records.py): the JSON form of every record and the stable ids of dead letters."""

import json

import numpy as np

from dp_beam.records import (SCHEMA_VERSION, InvalidElement, LedgerEntry, Release, invalid_id,
                             to_json)


def test_to_json_names_the_record_and_keeps_every_value_serialisable():
    r = Release(("AA", 1), np.int64(3), 10800.0, 14400.0, float("nan"), 2.0, float("inf"), "tree",
                "hourly", 4)
    out = to_json(r)
    assert out == {"record": "Release", "key": ["AA", 1], "step": 3, "window_start": 10800.0,
                   "window_end": 14400.0, "value": "nan", "noise_std": 2.0, "ci95": "inf",
                   "mechanism": "tree", "transform": "hourly", "t": 4}
    assert json.loads(json.dumps(out, allow_nan=False)) == out


def test_ledger_entries_carry_the_schema_version():
    e = LedgerEntry("hourly", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree", "stream")
    assert to_json(e)["version"] == SCHEMA_VERSION == 2
    assert e.relation == "add/remove"


def test_dead_letters_of_any_element_serialise():
    class Opaque:
        pass

    bad = InvalidElement.of("t", "bad", {1: Opaque(), "x": {2, 3}, "a": np.array([1.5])}, 5.0)
    out = to_json(bad)
    assert out["element"]["1"].startswith("<") and out["element"]["a"] == [1.5]
    json.dumps(out, allow_nan=False)


def test_invalid_ids_are_stable_and_depend_on_every_part():
    base = ("t", "reason", {"b": 1.0, "a": [1, 2]}, 3600.0, 1)
    first = invalid_id(*base)
    assert len(first) == 32 and int(first, 16) >= 0
    # Dict order does not matter; the same content is the same id.
    assert invalid_id("t", "reason", {"a": [1, 2], "b": 1.0}, 3600.0, 1) == first
    assert InvalidElement.of(*base).id == first
    for changed in (("u",) + base[1:], base[:1] + ("other",) + base[2:],
                    base[:2] + ({"b": 1.0, "a": [1, 3]},) + base[3:],
                    base[:3] + (3601.0, 1), base[:3] + (None, 1), base[:4] + (2,)):
        assert invalid_id(*changed) != first
    # Floats are exact: 0.1 + 0.2 is not 0.3.
    assert invalid_id("t", "r", 0.1 + 0.2) != invalid_id("t", "r", 0.3)


def test_objects_with_default_reprs_get_ids_from_their_fields_not_their_address():
    class Point:
        def __init__(self, x):
            self.x = x

    assert invalid_id("t", "r", Point(1)) == invalid_id("t", "r", Point(1))
    assert invalid_id("t", "r", Point(1)) != invalid_id("t", "r", Point(2))
