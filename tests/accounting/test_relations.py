"""Neighbour relations (relations.py): the conversion table and group privacy of size two."""

import math

import pytest

from dp_beam.accounting.relations import (ADD_REMOVE, REPLACE, VALUES, check_relation, convert,
                                          factor, why_unbounded)
from dp_beam.records import RELATIONS


def test_the_relations_are_the_records_ones():
    assert (ADD_REMOVE, REPLACE, VALUES) == RELATIONS == ("add/remove", "replace", "values")


@pytest.mark.parametrize("charge, total, expected", [
    (ADD_REMOVE, ADD_REMOVE, 1), (ADD_REMOVE, REPLACE, 2), (ADD_REMOVE, VALUES, 2),
    (REPLACE, ADD_REMOVE, None), (REPLACE, REPLACE, 1), (REPLACE, VALUES, 1),
    (VALUES, ADD_REMOVE, None), (VALUES, REPLACE, None), (VALUES, VALUES, 1),
])
def test_factor_table(charge, total, expected):
    assert factor(charge, total) == expected
    if expected is None:
        assert why_unbounded(charge, total).startswith("private only for")


def test_check_relation():
    assert check_relation("replace") == "replace"
    with pytest.raises(ValueError, match=r"^neighbours must be one of .*got 'swap'$"):
        check_relation("swap", "neighbours")
    with pytest.raises(ValueError, match="got None"):
        factor(None, REPLACE)


def test_convert_is_group_privacy_of_two():
    assert convert(0.5, 1e-6, 0.1, 1) == (0.5, 1e-6, 0.1)
    eps, delta, rho = convert(0.5, 1e-6, 0.1, 2)
    assert (eps, rho) == (1.0, 0.4)
    assert delta == pytest.approx((1 + math.exp(0.5)) * 1e-6, rel=1e-15)
    assert convert(1.0, 0.0, 0.0, 2) == (2.0, 0.0, 0.0)
    # δ is a probability: capped at 1, also where e^ε would overflow.
    assert convert(5.0, 0.5, 0.0, 2)[1] == 1.0
    assert convert(1000.0, 1e-9, 0.0, 2) == (2000.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="k must be 1 or 2, got 3"):
        convert(1.0, 0.0, 0.0, 3)
