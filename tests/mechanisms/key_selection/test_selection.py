"""The key-selection front (dp_beam.mechanisms.key_selection.selection):
validation, public parameters, privacy cost, states of the wrong method."""

import math
import pickle

import numpy as np
import pytest

from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms import (
    KeyCounter,
    KeySelection,
    KeyedNoise,
    ZeroNoise,
    eps_from_rho_delta,
    rho_from_eps_delta,
)
from dp_beam.mechanisms.key_selection.thresholds import (laplace_tail_quantile,
                                                         sparse_vector_admission_bounds)

from .helpers import svt


# -- 1. validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(epsilon=0.0, delta=1e-6), "epsilon"),
        (dict(epsilon=-1.0, delta=1e-6), "epsilon"),
        (dict(epsilon=float("inf"), delta=1e-6), "epsilon"),
        (dict(epsilon=float("nan"), delta=1e-6), "epsilon"),
        (dict(epsilon="1", delta=1e-6), "epsilon"),
        (dict(epsilon=True, delta=1e-6), "epsilon"),
        (dict(epsilon=1.0, delta=0.0), "delta"),
        (dict(epsilon=1.0, delta=1.0), "delta"),
        (dict(epsilon=1.0, delta=None), "delta"),
        (dict(epsilon=1.0, delta=float("nan")), "delta"),
        (dict(epsilon=1.0, delta="1e-6"), "delta"),
        (dict(epsilon=1.0, delta=1e-6, max_keys_per_unit=0), "max_keys_per_unit"),
        (dict(epsilon=1.0, delta=1e-6, max_keys_per_unit=1.5), "max_keys_per_unit"),
        (dict(epsilon=1.0, delta=1e-6, max_keys_per_unit=True), "max_keys_per_unit"),
        (dict(epsilon=1.0, delta=1e-6, noise="gauss"), "noise"),
        (dict(epsilon=1.0, delta=1e-6, noise=None), "noise"),
        (dict(epsilon=1.0, delta=1e-6, horizon=0), "horizon"),
        (dict(epsilon=1.0, delta=1e-6, horizon=2.5), "horizon"),
        (dict(epsilon=1.0, delta=1e-6, horizon=True), "horizon"),
        (dict(epsilon=5000.0, delta=1e-6), "epsilon"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        KeySelection(**kwargs)


def test_counter_and_query_validation():
    sel = KeySelection(1.0, 1e-6, horizon=10)
    for bad in (0, -1, 1.5, True, 11):
        with pytest.raises(ValueError, match="first_t"):
            sel.new_counter(bad, rng=ZeroNoise())
    for bad in (0, 1.5, True, 11):
        with pytest.raises(ValueError, match="t must"):
            sel.threshold(bad)
    counter = sel.new_counter(10, rng=ZeroNoise())
    before = counter.to_state()
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="new_units"):
            counter.step(bad)
    assert counter.to_state() == before
    assert counter.step(np.int64(0)) is False
    with pytest.raises(ValueError, match="horizon exceeded"):
        counter.step(0)
    assert counter.t == 10
    with pytest.raises(ValueError, match="scales"):
        laplace_tail_quantile([], 0.1)
    with pytest.raises(ValueError, match="scales"):
        laplace_tail_quantile([1.0, 0.0], 0.1)
    with pytest.raises(ValueError, match="probability"):
        laplace_tail_quantile([1.0], 1.0)


def test_properties_are_read_only_and_secure_by_default():
    sel = KeySelection(0.5, 1e-5, max_keys_per_unit=2, noise="gaussian", horizon=100)
    assert (sel.epsilon, sel.delta, sel.max_keys_per_unit, sel.noise, sel.horizon) == (
        0.5, 1e-5, 2, "gaussian", 100)
    with pytest.raises(AttributeError):
        sel.epsilon = 1.0
    counter = sel.new_counter(1)
    assert isinstance(counter._tree.noise_source, KeyedNoise)
    counter.step(0)
    assert isinstance(counter, KeyCounter) and counter.t == 1
    # Beam serialises both: they pickle, secure source included.
    assert pickle.loads(pickle.dumps(sel)).threshold(7) == sel.threshold(7)
    assert pickle.loads(pickle.dumps(counter)).t == 1


# -- 6. privacy cost -----------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3])
def test_laplace_cost_composes_m_counters_to_epsilon(m):
    sel = KeySelection(1.2, 1e-6, max_keys_per_unit=m, horizon=100)
    counter = sel.counter_cost()
    assert counter["epsilon"] == pytest.approx(1.2 / m, rel=1e-15)
    assert m * counter["epsilon"] == pytest.approx(1.2, rel=1e-12)
    assert sel.noise_scales(1) == pytest.approx([7 * m / 1.2], rel=1e-6)  # h·Δ/(ε/m), h = 7
    assert sel.delta_per_key == pytest.approx(1e-6 / (m * (1 + math.exp(1.2))), rel=1e-12)
    # Claim 7: δ = m·δ₁·(1 + e^ε).
    assert m * sel.delta_per_key * (1 + math.exp(1.2)) == pytest.approx(1e-6, rel=1e-12)
    cost = sel.privacy_cost()
    assert cost == {"epsilon": 1.2, "delta": 1e-6, "rho": pytest.approx(m * (1.2 / m) ** 2 / 2, rel=1e-12)}


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("horizon", [365, None])
def test_gaussian_cost_composes_m_counters_to_rho_and_epsilon_at_half_delta(m, horizon):
    eps, delta = 0.7, 1e-6
    sel = KeySelection(eps, delta, max_keys_per_unit=m, noise="gaussian", horizon=horizon)
    rho = rho_from_eps_delta(eps, delta / 2)
    counter = sel.counter_cost()
    # m counters at ρ/m each compose to ρ (never above it) ⇒ (ε, δ/2)-DP.
    assert m * counter["rho"] <= rho
    assert m * counter["rho"] == pytest.approx(rho, rel=1e-12)
    assert eps_from_rho_delta(m * counter["rho"], delta / 2) == pytest.approx(eps, rel=1e-12)
    # σ of a node for L2 sensitivity √h at ρ/m.
    h = 365 .bit_length() if horizon else 1
    assert sel.noise_scales(1)[-1] == pytest.approx(math.sqrt(h) / math.sqrt(2 * rho / m), rel=1e-6)
    assert sel.delta_per_key == pytest.approx((delta / 2) / (m * (1 + math.exp(eps))), rel=1e-12)
    assert delta / 2 + m * sel.delta_per_key * (1 + math.exp(eps)) == pytest.approx(delta, rel=1e-12)
    assert sel.privacy_cost() == {"epsilon": eps, "delta": delta, "rho": pytest.approx(rho, rel=1e-15)}


@pytest.mark.parametrize("kwargs", [{}, {"noise": "gaussian", "horizon": 64},
                                    {"method": "sparse_vector", "max_keys_per_unit": 3}])
def test_costs_are_immutable_cost_values(kwargs):
    sel = KeySelection(1.0, 1e-6, **kwargs)
    for cost in (sel.privacy_cost(), sel.counter_cost()):
        assert isinstance(cost, Cost)
        with pytest.raises(AttributeError):
            cost.epsilon = 2.0
    assert sel.privacy_cost().epsilon == 1.0 and sel.privacy_cost().delta == 1e-6


# -- 8. validation and public parameters ---------------------------------------------------


def test_sparse_vector_validation_names_the_parameter():
    for bad in ("tree", None, 1, "Counter"):
        with pytest.raises(ValueError, match="method"):
            KeySelection(1.0, 1e-6, method=bad)
    with pytest.raises(ValueError, match="noise must be 'laplace' with method='sparse_vector'"):
        svt(noise="gaussian")
    with pytest.raises(ValueError, match="epsilon"):
        svt(epsilon=700.0)          # δ₁ below what the certified bound handles
    sel = svt(horizon=10)
    for bad in (0, -1, 1.5, True, 11):
        with pytest.raises(ValueError, match="first_t"):
            sel.new_counter(bad, rng=ZeroNoise())
        with pytest.raises(ValueError, match="t must"):
            sel.threshold(bad)
    key = sel.new_counter(10, rng=ZeroNoise())
    before = key.to_state()
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="new_units"):
            key.step(bad)
    assert key.to_state() == before
    assert key.step(np.int64(0)) is False
    with pytest.raises(ValueError, match="horizon exceeded"):
        key.step(0)
    # Method-specific accessors refuse the other method.
    with pytest.raises(ValueError, match="counter"):
        sel.tail_probability(1)
    counter = KeySelection(1.0, 1e-6, horizon=10)
    for name in ("offset_scale", "step_scale"):
        with pytest.raises(ValueError, match="sparse_vector"):
            getattr(counter, name)
    with pytest.raises(ValueError, match="sparse_vector"):
        counter.base_threshold()
    with pytest.raises(ValueError, match="units"):
        sel.admission_bounds(-1)
    for kwargs, name in [(dict(excess=float("nan")), "excess"), (dict(offset_scale=0.0), "offset_scale"),
                         (dict(step_scale=-1.0), "step_scale"), (dict(horizon=0), "horizon"),
                         (dict(tail_mass=0.0), "tail_mass")]:
        args = dict(excess=1.0, offset_scale=1.0, step_scale=1.0, horizon=5, tail_mass=1e-9)
        args.update(kwargs)
        with pytest.raises(ValueError, match=name):
            sparse_vector_admission_bounds(**args)


@pytest.mark.parametrize("m", [1, 3])
def test_sparse_vector_parameters_and_cost(m):
    sel = svt(1.2, 1e-6, max_keys_per_unit=m, horizon=100)
    assert (sel.method, sel.mechanism) == ("sparse_vector", "key_selection+sparse_vector(laplace)")
    assert KeySelection(1.2, 1e-6).mechanism == "key_selection+tree(laplace)"
    # Claim 12: ε₁ = ε₂ = ε/(2m), Δ = 1.
    assert sel.offset_scale == sel.step_scale == pytest.approx(2 * m / 1.2, rel=1e-15)
    assert sel.noise_scales(7) == [sel.offset_scale, sel.step_scale]
    assert sel.noise_std(7) == pytest.approx(math.sqrt(4) * sel.step_scale, rel=1e-6)
    # Claim 16: δ = m·δ₁·(1 + e^ε), as for the Laplace counter.
    assert sel.delta_per_key == KeySelection(1.2, 1e-6, max_keys_per_unit=m).delta_per_key
    assert m * sel.delta_per_key * (1 + math.exp(1.2)) == pytest.approx(1e-6, rel=1e-12)
    assert sel.counter_cost() == {"epsilon": pytest.approx(1.2 / m, rel=1e-15), "delta": 0.0,
                                  "rho": pytest.approx((1.2 / m) ** 2 / 2, rel=1e-12)}
    assert sel.privacy_cost() == {"epsilon": 1.2, "delta": 1e-6,
                                  "rho": pytest.approx(m * (1.2 / m) ** 2 / 2, rel=1e-12)}
    assert sel.privacy_cost() == KeySelection(1.2, 1e-6, max_keys_per_unit=m, horizon=100).privacy_cost()
    assert "method='sparse_vector'" in repr(sel)


def test_states_do_not_cross_methods():
    counter = KeySelection(1.0, 1e-6, horizon=64)
    sparse = svt(1.0, 1e-6, horizon=64)
    with pytest.raises(ValueError, match="mechanism"):
        sparse.restore(counter.new_counter(2, rng=ZeroNoise()).to_state())
    with pytest.raises(ValueError, match="mechanism"):
        counter.restore(sparse.new_counter(2, rng=ZeroNoise()).to_state())
