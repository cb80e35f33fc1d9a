"""Mechanism state as frozen dataclasses, written to and read from plain dicts generically.

Every mechanism keeps its state in a plain dict (``docs/design.md`` D1.1:
explicit, serialisable state that a Beam state cell or a checkpoint holds).
Writing that dict field by field in ``to_state`` and reading it back field
by field in ``from_state`` made each family repeat the same mapping twice,
and the two halves could drift apart (a field written but never read, a
missing field raising ``KeyError`` instead of ``ValueError``). Here a family
declares the shape of its state once, as a frozen dataclass deriving from
:class:`StateRecord`; the mapping to and from the dict is written once:

* :meth:`StateRecord.to_state` gives the fields in declaration order, NumPy
  arrays as nested lists, nested records as their dicts, lists, tuples and
  dicts converted element by element (keeping their type), anything else
  as it is. A field whose value is :data:`OMITTED` is left out, for states
  whose keys depend on the mechanism's configuration.
* :meth:`StateRecord.from_state` checks the dict, names a missing or an
  unknown field in its ``ValueError``, and decodes a field only where the
  field declares how (:func:`state_field`), e.g. lists back into arrays.

The records only move values: checking them (shapes, versions, horizons)
stays with the mechanism that knows what they mean. The wire format is that
of the hand-written dicts the records replaced (tests/mechanisms/
test_state_format.py pins it), so states written before still restore.

>>> import dataclasses
>>> import numpy as np
>>> @dataclasses.dataclass(frozen=True)
... class Point(StateRecord):
...     t: int
...     xs: np.ndarray = state_field(decode=np.asarray)
>>> p = Point(t=2, xs=np.array([0.5, 1.5]))
>>> p.to_state()
{'t': 2, 'xs': [0.5, 1.5]}
>>> Point.from_state({'t': 2, 'xs': [0.5, 1.5]}).xs
array([0.5, 1.5])
>>> Point.from_state({'t': 2})
Traceback (most recent call last):
...
ValueError: state is missing field 'xs'
"""

import dataclasses
from typing import Any, Callable, Dict, Optional, Type, TypeVar

import numpy as np

__all__ = ["OMITTED", "StateRecord", "float_array", "optional", "plain", "state_field"]

R = TypeVar("R", bound="StateRecord")


class _Omitted:
    """The type of :data:`OMITTED` (one instance; pickles back to it)."""

    def __repr__(self) -> str:
        return "OMITTED"

    def __reduce__(self) -> str:
        return "OMITTED"


OMITTED = _Omitted()
"""A field value meaning "not in the state dict": :meth:`StateRecord.to_state` leaves the
field out; a field declared with this default reads as it when the dict has no such key."""

_DECODE = "dp_beam.state.decode"


def state_field(decode: Optional[Callable[[Any], Any]] = None, **kwargs: Any) -> Any:
    """A dataclass field of a record that ``from_state`` passes through ``decode``.

    ``decode`` is called with the dict's value (never with :data:`OMITTED`);
    the other keywords are those of :func:`dataclasses.field` (``default=``
    makes the field optional in the dict).
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    if decode is not None:
        metadata[_DECODE] = decode
    return dataclasses.field(metadata=metadata, **kwargs)


def optional(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``decode`` for a value that may be None (None stays None).

    >>> optional(float)(None), optional(float)(2)
    (None, 2.0)
    """
    return lambda value: None if value is None else decode(value)


def float_array(value: Any) -> np.ndarray:
    """``decode`` for a field written from a float array: the list back as a float64 array.

    >>> float_array([[1, 2]]).dtype, float_array([[1, 2]]).shape
    (dtype('float64'), (1, 2))
    """
    return np.asarray(value, dtype=np.float64)


def plain(value: Any) -> Any:
    """``value`` with arrays as lists and records as dicts, containers rebuilt element by element.

    >>> plain({"a": (np.array([1, 2]), [np.float64(0.5)])})
    {'a': ([1, 2], [np.float64(0.5)])}
    """
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, StateRecord):
        return value.to_state()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class StateRecord:
    """Base of the frozen dataclasses that hold one shape of mechanism state.

    A subclass is itself a ``@dataclasses.dataclass(frozen=True)``; its fields,
    in declaration order (a base record's first), are the keys of the dict.
    """

    def to_state(self) -> Dict[str, Any]:
        """The plain dict of the fields (see the module docstring)."""
        state = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not OMITTED:
                state[f.name] = plain(value)
        return state

    @classmethod
    def from_state(cls: Type[R], state: Any) -> R:
        """The record of a :meth:`to_state` dict; ``ValueError`` naming a missing or unknown field."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict, got {type(state).__name__}")
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields}
        for name in state:
            if name not in known:
                raise ValueError(f"state has unknown field {name!r}")
        values = {}
        for f in fields:
            if f.name not in state:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ValueError(f"state is missing field {f.name!r}")
                continue
            decode = f.metadata.get(_DECODE)
            values[f.name] = state[f.name] if decode is None else decode(state[f.name])
        return cls(**values)
