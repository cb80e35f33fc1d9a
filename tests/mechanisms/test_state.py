"""The generic state records (dp_beam.mechanisms.state): round trips, nested records, arrays,
omitted fields, and the errors that name a missing or an unknown field."""

import dataclasses
import json
import pickle
from typing import Optional

import numpy as np
import pytest

from dp_beam.mechanisms.state import OMITTED, StateRecord, optional, plain, state_field


def _floats(value):
    return np.asarray(value, dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class Inner(StateRecord):
    count: int
    values: np.ndarray = state_field(decode=_floats)


@dataclasses.dataclass(frozen=True)
class Header(StateRecord):
    mechanism: str
    t: int


@dataclasses.dataclass(frozen=True)
class Outer(Header):
    inner: Optional[Inner] = state_field(decode=optional(Inner.from_state))
    pair: tuple = (0, 0)
    extra: object = state_field(default=OMITTED)


def _outer(**kw):
    base = dict(mechanism="outer", t=3, inner=Inner(2, np.array([[1.0, 2.5], [0.0, -1.0]])),
                pair=(np.array([1, 2]), "x"))
    return Outer(**{**base, **kw})


def test_to_state_is_plain_and_in_declaration_order_with_base_fields_first():
    state = _outer().to_state()
    assert list(state) == ["mechanism", "t", "inner", "pair"]
    assert state["inner"] == {"count": 2, "values": [[1.0, 2.5], [0.0, -1.0]]}
    assert type(state["inner"]["values"]) is list
    assert state["pair"] == ([1, 2], "x")            # a tuple stays a tuple
    json.dumps(state)                                  # nothing NumPy is left


def test_round_trip_decodes_the_declared_fields_only():
    state = _outer().to_state()
    back = Outer.from_state(pickle.loads(pickle.dumps(state)))
    assert isinstance(back.inner, Inner)
    assert isinstance(back.inner.values, np.ndarray) and back.inner.values.shape == (2, 2)
    np.testing.assert_array_equal(back.inner.values, [[1.0, 2.5], [0.0, -1.0]])
    assert back.pair == ([1, 2], "x")                 # undeclared: as stored
    assert back.to_state() == state


def test_optional_nested_record_may_be_none():
    state = _outer(inner=None).to_state()
    assert state["inner"] is None
    assert Outer.from_state(state).inner is None


def test_an_omitted_field_is_left_out_and_read_back_as_omitted():
    state = _outer().to_state()
    assert "extra" not in state
    assert Outer.from_state(state).extra is OMITTED
    with_extra = _outer(extra={"k": np.arange(2)}).to_state()
    assert with_extra["extra"] == {"k": [0, 1]}
    assert Outer.from_state(with_extra).extra == {"k": [0, 1]}


def test_a_field_with_a_default_may_be_missing():
    state = _outer().to_state()
    del state["pair"]
    assert Outer.from_state(state).pair == (0, 0)


@pytest.mark.parametrize("name", ["mechanism", "t", "inner"])
def test_a_missing_field_raises_naming_it(name):
    state = _outer().to_state()
    del state[name]
    with pytest.raises(ValueError, match=f"missing field '{name}'"):
        Outer.from_state(state)


def test_a_missing_field_of_a_nested_record_raises_naming_it():
    state = _outer().to_state()
    del state["inner"]["values"]
    with pytest.raises(ValueError, match="missing field 'values'"):
        Outer.from_state(state)


def test_an_unknown_field_raises_naming_it():
    state = {**_outer().to_state(), "surplus": 1}
    with pytest.raises(ValueError, match="unknown field 'surplus'"):
        Outer.from_state(state)


@pytest.mark.parametrize("state", [None, [("t", 1)], "state"])
def test_a_state_that_is_not_a_dict_raises(state):
    with pytest.raises(ValueError, match="state must be a dict"):
        Header.from_state(state)


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Header("h", 1).t = 2


def test_plain_converts_containers_recursively_and_keeps_other_values():
    value = {"a": [np.zeros(2), (np.int64(3), None)], "b": Header("h", 1), "c": 1.5}
    out = plain(value)
    assert out == {"a": [[0.0, 0.0], (np.int64(3), None)], "b": {"mechanism": "h", "t": 1}, "c": 1.5}
    assert type(out["a"][1][0]) is np.int64          # scalars are not converted


def test_omitted_survives_pickling_as_the_same_object():
    assert pickle.loads(pickle.dumps(OMITTED)) is OMITTED
