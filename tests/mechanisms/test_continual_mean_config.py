"""MeanConfig (one parameter list for the mean), its costs and the core's state format."""

import dataclasses
import math
import pickle

import numpy as np
import pytest

import dp_beam as dpb
from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms import SeededNoise, ZeroNoise
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, ContinualMeanMechanism, MeanConfig,
                                               MeanParams, StepNaiveMean, StepPriorMean)


def test_config_is_frozen_and_validates_with_the_parameter_name():
    config = MeanConfig(1000, 16, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epsilon = 2.0
    for kw, name in ((dict(epsilon=0), "epsilon"), (dict(max_users=0), "max_users"),
                     (dict(beta=1.0), "beta"), (dict(neighbours="users"), "neighbours"),
                     (dict(noise="gaussian"), "delta"), (dict(delta=1e-6, noise="laplace"), "delta"),
                     (dict(horizon=0), "horizon"), (dict(prior_ratio=-1.0), "prior_ratio"),
                     (dict(prior_query=1), "prior_query"), (dict(user_spread=1.0), "user_spread"),
                     (dict(mechanism="nope"), "mechanism"), (dict(median_budget="x"), "median_budget"),
                     (dict(tree_levels=0), "tree_levels"), (dict(preset="x"), "preset")):
        args = {"max_users": 1000, "max_samples_per_user": 16, "epsilon": 1.0, **kw}
        with pytest.raises(ValueError, match=name):
            MeanConfig(**args)


def test_params_from_a_config_equal_params_from_its_arguments():
    kw = dict(neighbours="values", delta=1e-6, horizon=100, dim=2)
    a = MeanParams(MeanConfig(1000, 64, 1.0, **kw))
    b = MeanParams(1000, 64, 1.0, **kw)
    assert a.config == b.config
    assert a.privacy_cost() == b.privacy_cost()
    assert a.eps_level == b.eps_level and a.prior_levels == b.prior_levels
    # Derived once: the plan cannot be changed afterwards, and it still pickles.
    with pytest.raises(AttributeError, match="read-only"):
        a.epsilon = 2.0
    c = pickle.loads(pickle.dumps(a))
    assert c.eps_level == a.eps_level and c.config == a.config


def test_eps_tree_is_a_float_or_none():
    paper = MeanParams(1000, 16, 1.0, 0.1, neighbours="values", preset="paper")
    assert isinstance(paper.eps_tree, float) and paper.rho_tree is None
    tuned = MeanParams(1000, 16, 1.0, delta=1e-6)
    assert tuned.eps_tree is None and tuned.rho_tree is None   # budgets by use: eps_level


@pytest.mark.parametrize("kw", [dict(), dict(delta=1e-6), dict(preset="paper"),
                                dict(preset="paper", delta=1e-6, neighbours="values")])
def test_costs_are_cost_values_with_the_ledger_numbers(kw):
    p = MeanParams(1000, 16, 1.0, **kw)
    cost = p.privacy_cost()
    assert isinstance(cost, Cost)
    assert cost == {"epsilon": cost.epsilon, "delta": cost.delta, "rho": cost.rho}
    assert cost.epsilon == pytest.approx(1.0, rel=1e-9) or cost.epsilon < 1.0
    if p.noise == "laplace":
        assert cost == Cost.laplace(cost.epsilon)
    for baseline in (StepNaiveMean(0.0, 1.0, 8, 1.0, delta=kw.get("delta")),
                     StepPriorMean(0.0, 1.0, 8, 1.0, prior=0.5, max_users=10, delta=kw.get("delta"))):
        assert isinstance(baseline.privacy_cost(), Cost)
        assert baseline.privacy_cost().epsilon == pytest.approx(1.0)


@pytest.mark.parametrize("delta", [None, 1e-6])
def test_transform_cost_is_k_streams(delta):
    t = dpb.ContinualMean(user_fn=str, value_fn=float, lower=0, upper=1, max_samples_per_user=16,
                          epsilon=1.0, step=10, start=0, key_fn=str, keys=["a", "b"],
                          max_keys_per_user=2, delta=delta, max_users=100)
    cost = t.cost()
    stream = t.params.privacy_cost()
    assert isinstance(cost, Cost)
    assert cost.rho == pytest.approx(2 * stream.rho)
    assert cost.epsilon == pytest.approx(1.0)
    assert cost.delta == (0.0 if delta is None else delta)


def test_the_transform_takes_every_parameter_of_the_mechanism():
    # The transform's keyword parameters are MeanConfig's: prior_ratio and prior_query
    # (once missing from the transform) reach the plan as they do in the mechanism.
    kw = dict(max_users=20, neighbours="values", prior_ratio=1.0, prior_query=True, tree_levels=7)
    t = dpb.ContinualMean(user_fn=str, value_fn=float, lower=0, upper=1, max_samples_per_user=256,
                          epsilon=20.0, step=10, start=0, **kw)
    engine_free = ContinualMeanMechanism(0, 1, 256, 20.0, rng=ZeroNoise(), **kw)
    assert t.params.config == engine_free.params.config
    assert t.params.prior_ratio_used == 1.0 and t.params.query and t.params.tree_levels == 7
    assert t.params.eps_level == engine_free.params.eps_level
    forced = dpb.ContinualMean(user_fn=str, value_fn=float, lower=0, upper=1,
                               max_samples_per_user=256, epsilon=20.0, step=10, start=0,
                               max_users=20, neighbours="values", prior_query=False)
    assert not forced.params.query
    with pytest.raises(ValueError, match="prior_query"):
        dpb.ContinualMean(user_fn=str, value_fn=float, lower=0, upper=1, max_samples_per_user=256,
                          epsilon=1.0, step=10, start=0, prior_query=True)


def test_the_mechanism_takes_a_config_or_its_keywords():
    config = MeanConfig(10, 4, 1.0, neighbours="values")
    a = ContinualMeanMechanism(0.0, 10.0, config=config, rng=ZeroNoise())
    b = ContinualMeanMechanism(0.0, 10.0, 4, 1.0, max_users=10, neighbours="values", rng=ZeroNoise())
    assert [a.step([("u", 2.0)]).estimate, a.step([("u", 4.0)]).estimate] == \
        [b.step([("u", 2.0)]).estimate, b.step([("u", 4.0)]).estimate]
    with pytest.raises(TypeError, match=r"^ContinualMeanMechanism.__init__\(\) got an unexpected"):
        ContinualMeanMechanism(0.0, 10.0, 4, 1.0, max_users=10, max_user=3)
    with pytest.raises(TypeError, match="either config"):
        ContinualMeanMechanism(0.0, 10.0, 4, config=config)


def _old_to_state(core):
    """The hand-written state map the generic one replaced (the saved format)."""
    return {
        "mechanism": core.name, "t": core.t,
        "trees": {lv: tr.to_state() for lv, tr in core.trees.items()},
        "count_tree": None if core.count_tree is None else core.count_tree.to_state(),
        "active": dict(core.active), "prior": {k: v.tolist() for k, v in core.prior.items()},
        "buffer": {k: v.tolist() for k, v in core.buffer.items()},
        "counts": dict(core.counts), "samples_in": dict(core.samples_in), "a": dict(core.a),
        "max_count": core.max_count,
        "store": {k: [(i, x.tolist()) for i, x in v] for k, v in core.store.items()},
        "noisy_counts": None if core.noisy_counts is None else core.noisy_counts.tolist(),
        "last_est01": None if core.last_est01 is None else core.last_est01.tolist(),
        "last_bound": core.last_bound,
        "prefix_mean": core.prefix_mean.tolist(), "prefix_inv": core.prefix_inv,
        "query": None if core.query is None else (core.query[0].tolist(), core.query[1], core.query[2]),
    }


@pytest.mark.parametrize("kw", [dict(preset="paper", neighbours="values"), dict(preset="paper"),
                                dict(neighbours="values", delta=1e-6), dict(dim=2)])
def test_state_round_trip_and_format(kw):
    rnd = np.random.default_rng(5)
    make = lambda seed: ContinualMeanMechanism(0.0, 1.0, 16, 5.0, max_users=60, horizon=30,
                                               rng=SeededNoise(seed), **kw)
    cm = make(1)
    dim = cm.params.dim
    steps = [[(f"u{int(rnd.integers(0, 40))}", rnd.uniform(0, 1, dim)) for _ in range(8)]
             for _ in range(30)]
    for samples in steps[:15]:
        cm.step(samples)
    state = cm.core.to_state()
    assert list(state) == list(_old_to_state(cm.core))
    assert pickle.dumps(state) == pickle.dumps(_old_to_state(cm.core))
    restored = ContinualMeanCore.from_state(cm.params, state, cm.lower, cm.upper, rng=SeededNoise(9))
    assert pickle.dumps(restored.to_state()) == pickle.dumps(state)
    # A state saved before the release prior's fields existed still loads.
    old = {k: v for k, v in state.items() if k not in ("last_est01", "last_bound")}
    legacy = ContinualMeanCore.from_state(cm.params, old, cm.lower, cm.upper, rng=SeededNoise(9))
    assert legacy.last_est01 is None and legacy.last_bound == math.inf
