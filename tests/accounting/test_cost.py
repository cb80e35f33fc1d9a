"""The Cost value: validation, composition, group privacy and the mapping view."""

import math

import pytest

from dp_beam.accounting.cost import Cost
from dp_beam.accounting.costs import scale


def test_laplace_is_pure_and_half_eps_squared_zcdp():
    c = Cost.laplace(0.8)
    assert (c.epsilon, c.delta, c.rho) == (0.8, 0.0, 0.5 * 0.8 * 0.8)


def test_gaussian_uses_the_simple_conversion_unless_given():
    rho, delta = 0.02, 1e-6
    c = Cost.gaussian(rho, delta)
    assert c.epsilon == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)), rel=1e-15)
    assert Cost.gaussian(rho, delta, epsilon=0.5).epsilon == 0.5


def test_composition_adds_and_keeps_missing_rho_missing():
    a, b = Cost(0.5, 1e-7, 0.1), Cost(0.25, 1e-7, None)
    assert a + a == Cost(1.0, 2e-7, 0.2)
    assert (a + b).rho is None
    assert 3 * a == a + a + a == a * 3
    assert 0 * a == Cost(0.0, 0.0, 0.0)


def test_group_privacy_matches_the_ledger_scaling():
    c = Cost(0.5, 1e-6, 0.125)
    assert tuple(c.group(3).values()) == scale(0.5, 1e-6, 0.125, 3)


def test_reads_and_compares_like_the_ledger_dict():
    c = Cost.laplace(1.0)
    assert c == {"epsilon": 1.0, "delta": 0.0, "rho": 0.5}
    assert dict(c) == {"epsilon": 1.0, "delta": 0.0, "rho": 0.5}
    assert c["rho"] == 0.5 and list(c) == ["epsilon", "delta", "rho"]
    with pytest.raises(KeyError):
        c["sigma"]
    assert Cost.of({"epsilon": 1.0, "rho": 0.5}) == c
    assert hash(c) == hash(Cost.laplace(1.0))


def test_is_immutable():
    c = Cost.laplace(1.0)
    with pytest.raises(AttributeError):
        c.epsilon = 2.0


@pytest.mark.parametrize("kwargs, name", [
    ({"epsilon": -1.0}, "epsilon"),
    ({"epsilon": float("nan")}, "epsilon"),
    ({"epsilon": 1.0, "delta": 1.5}, "delta"),
    ({"epsilon": 1.0, "rho": -0.1}, "rho"),
    ({"epsilon": True}, "epsilon"),
])
def test_rejects_bad_values_naming_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Cost(**kwargs)


def test_of_rejects_a_mapping_without_epsilon():
    with pytest.raises(ValueError, match="epsilon"):
        Cost.of({"delta": 0.0})
