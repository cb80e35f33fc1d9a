"""Event ids as sort keys (event_ids.py): every accepted id orders against every other one, and
every refused id gets a reason instead of an exception."""

import fractions
import random

import numpy as np
import pytest

from dp_beam.transforms.event_ids import MAX_ID_DEPTH, id_key


@pytest.mark.parametrize("value, key", [
    (3, (0, 3)),
    (np.int64(3), (0, 3)),
    (2.5, (0, 2.5)),
    (np.float32(0.5), (0, 0.5)),
    ("x", (1, "x")),
    (b"x", (2, b"x")),
    ((1, "a"), (3, ((0, 1), (1, "a")))),
    ([1, [b"z"]], (3, ((0, 1), (3, ((2, b"z"),))))),
])
def test_accepted_ids_and_their_keys(value, key):
    assert id_key(value) == (key, None)


def test_ids_of_every_kind_sort_numbers_first_then_str_bytes_tuples():
    ids = [(1, 2), b"b", "a", 2, 1.5, (1,), "b", b"a", -3]
    keys = [id_key(v)[0] for v in ids]
    random.Random(0).shuffle(keys)
    assert sorted(keys) == [(0, -3), (0, 1.5), (0, 2), (1, "a"), (1, "b"), (2, b"a"), (2, b"b"),
                            (3, ((0, 1),)), (3, ((0, 1), (0, 2)))]
    # An int and an equal float are the same id.
    assert id_key(2)[0] == id_key(2.0)[0]


@pytest.mark.parametrize("value, reason", [
    (None, "id_fn returned None"),
    (float("nan"), "id_fn returned a non-finite number nan"),
    (float("-inf"), "id_fn returned a non-finite number -inf"),
    (fractions.Fraction(10 ** 400, 3), "id_fn returned a number out of the float range (Fraction)"),
    ({"a": 1}, "id_fn returned dict: an event id must be an int, a finite float, a str, "
               "bytes or a tuple of these"),
    ((1, None), "id_fn returned None"),
])
def test_refused_ids_have_a_reason(value, reason):
    assert id_key(value) == (None, reason)


def test_nesting_deeper_than_the_limit_is_refused():
    value = 1
    for _ in range(MAX_ID_DEPTH):
        value = (value,)
    assert id_key(value)[1] is None
    key, err = id_key((value,))
    assert key is None and err.startswith("id_fn returned tuple")
