"""What every ERM stream shares (dp_beam.mechanisms.erm.stream): state round trips, per-point
pushes, input validation and privacy costs.

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import json

import numpy as np
import pytest

from dp_beam.mechanisms.erm import (
    ContinualERMMechanism,
    MultiResolutionERMMechanism,
    SlidingWindowERMMechanism,
)
from dp_beam.accounting.cost import Cost
from dp_beam.mechanisms.calibration import rho_from_eps_delta

from .helpers import UNIT, data

#: One stream of each family, from its noise source.
MAKERS = [
    lambda rng: MultiResolutionERMMechanism(1.0, 3, lam=0.5, max_scale=1, rng=rng, **UNIT),
    lambda rng: ContinualERMMechanism(1.0, 2, 4, lam=0.5, rng=rng, **UNIT),
    lambda rng: SlidingWindowERMMechanism(1.0, 2, 6, lam=0.5, rng=rng, **UNIT),
]


@pytest.mark.parametrize("make", MAKERS)
def test_state_round_trip_continues_identically(make):
    X, y = data(40, seed=11)
    a = make(np.random.default_rng(5))
    first = a.extend(X[:21], y[:21])
    gen = np.random.default_rng(5)
    b = make(gen)
    b.extend(X[:21], y[:21])
    state = json.loads(json.dumps(b.to_state()))
    c = type(b).from_state(state, rng=gen)     # continue the same seeded stream
    rest_a = a.extend(X[21:], y[21:])
    rest_c = c.extend(X[21:], y[21:])
    assert first and rest_a
    assert [r.t for r in rest_a] == [r.t for r in rest_c]
    for r1, r2 in zip(rest_a, rest_c):
        np.testing.assert_array_equal(r1.params, r2.params)
        assert r1 == r2


def test_push_per_point_equals_step_per_block():
    X, y = data(12, seed=2)
    a = SlidingWindowERMMechanism(1.0, 2, 6, lam=0.5, rng=3, **UNIT)
    b = SlidingWindowERMMechanism(1.0, 2, 6, lam=0.5, rng=3, **UNIT)
    via_push = [r for i in range(12) for r in a.push(X[i], y[i])]
    via_step = [r for c in range(6) for r in b.step(X[2 * c:2 * c + 2], y[2 * c:2 * c + 2])]
    assert len(via_push) == len(via_step) == 4
    for r1, r2 in zip(via_push, via_step):
        np.testing.assert_array_equal(r1.params, r2.params)


@pytest.mark.parametrize("make", MAKERS)
def test_extend_releases_and_keeps_what_a_push_per_point_does(make):
    # Rows far outside the bound are clipped, as one array by extend and one by one by push:
    # the bits must agree, in the releases and in the state (the partial block included).
    X, y = data(23, seed=8)
    X = X * np.linspace(0.2, 40.0, 23)[:, None]
    a, b = make(5), make(5)
    via_push = [r for i in range(23) for r in a.push(X[i], y[i])]
    via_extend = b.extend(X[:9], y[:9]) + b.extend(X[9:], y[9:])
    assert len(via_push) == len(via_extend) >= 5
    for r1, r2 in zip(via_push, via_extend):
        assert r1.params.tobytes() == r2.params.tobytes() and r1 == r2
    assert json.dumps(a.to_state()) == json.dumps(b.to_state())
    assert b.extend(np.zeros((0, 2)), []) == [] and b.extend([], []) == []


@pytest.mark.parametrize("bad,match", [
    (lambda X, y: (np.where(np.arange(7)[:, None] == 5, np.nan, X), y), "finite"),
    (lambda X, y: (X, list(y[:5]) + [9] + list(y[6:])), "y must hold labels"),
    (lambda X, y: (X, y[:6]), "same number of points"),
    (lambda X, y: (X[:, :1], y), "shape"),
])
def test_extend_checks_every_point_before_it_takes_any(bad, match):
    # A push per point would have taken the points before the bad one (a block, maybe noise).
    X, y = data(7, seed=9)
    stream = ContinualERMMechanism(1.0, 2, 2, lam=0.5, rng=1, **UNIT)
    before = json.dumps(stream.to_state())
    with pytest.raises(ValueError, match=match):
        stream.extend(*bad(X, y))
    assert json.dumps(stream.to_state()) == before and stream.t == 0


def test_other_configuration_and_input_errors():
    with pytest.raises(ValueError, match="base_size"):
        ContinualERMMechanism(1.0, 1024, 1000, lam=1, **UNIT)
    with pytest.raises(ValueError, match="max_scale"):
        MultiResolutionERMMechanism(1.0, 8, lam=1, max_scale=-1, **UNIT)
    stream = ContinualERMMechanism(1.0, 2, 2, lam=1, **UNIT)
    with pytest.raises(ValueError, match="y"):
        stream.step(np.zeros((2, 2)), [0, 5])
    with pytest.raises(ValueError, match="X"):
        stream.step(np.zeros((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="X"):
        stream.step(np.array([[np.nan, 0], [0, 0]]), [0, 1])
    with pytest.raises(ValueError, match="block_size"):
        stream.step(np.zeros((3, 2)), [0, 1, 0])
    with pytest.raises(ValueError, match="state"):
        SlidingWindowERMMechanism.from_state(stream.to_state())


def test_privacy_cost_totals():
    assert MultiResolutionERMMechanism(0.7, 8, lam=1, **UNIT).privacy_cost() == {
        "epsilon": 0.7, "delta": 0.0, "rho": pytest.approx(0.245)}
    assert ContinualERMMechanism(2.0, 8, 8, lam=1, **UNIT).privacy_cost()["epsilon"] == 2.0
    assert SlidingWindowERMMechanism(1.0, 8, 56, lam=1, **UNIT).privacy_cost()["epsilon"] == 1.0


ERM = dict(n_features=2, classes=[0, 1], feature_bound=1.0, lam=0.5)


@pytest.mark.parametrize("make", [
    lambda **kw: ContinualERMMechanism(epsilon=0.7, block_size=2, base_size=4, **ERM, **kw),
    lambda **kw: SlidingWindowERMMechanism(epsilon=0.7, block_size=2, window=6, **ERM, **kw),
    lambda **kw: MultiResolutionERMMechanism(epsilon=0.7, block_size=2, **ERM, **kw),
])
def test_erm_costs(make):
    pure = make().privacy_cost()
    assert isinstance(pure, Cost)
    assert pure == {"epsilon": 0.7, "delta": 0.0, "rho": 0.5 * 0.7 * 0.7}
    gauss = make(noise="gaussian", delta=1e-6).privacy_cost()
    assert gauss == {"epsilon": 0.7, "delta": 1e-6, "rho": rho_from_eps_delta(0.7, 1e-6)}


@pytest.mark.parametrize("make", [
    lambda rng, log=None: MultiResolutionERMMechanism(1.0, 3, lam=0.5, max_scale=2, rng=rng, log=log, **UNIT),
    lambda rng, log=None: ContinualERMMechanism(1.0, 2, 4, lam=0.5, rng=rng, log=log, **UNIT),
    lambda rng, log=None: SlidingWindowERMMechanism(1.0, 2, 6, lam=0.5, rng=rng, log=log, **UNIT),
    lambda rng, log=None: SlidingWindowERMMechanism(
        1.0, 2, 10, lam=0.5, rng=rng, log=log, window_policy="general", noise="gaussian",
        delta=1e-6, n_features=2, classes=["a", "b", "c"], feature_bound=1.0),
])
def test_set_noise_source_equals_the_state_round_trip_with_a_new_source(make):
    # A release DoFn gives every step its own source: in place, or through the state.
    from dp_beam.mechanisms.erm import MemoryBlockLog
    X, y = data(60, seed=4)
    classes = make(0).loss.classes
    labels = [classes[int(v) % len(classes)] for v in y]
    in_place = make(np.random.default_rng([1, 0]), MemoryBlockLog())
    log = MemoryBlockLog()
    round_trip = make(np.random.default_rng([1, 0]), log)
    got, want = [], []
    for step in range(12):
        in_place.set_noise_source(np.random.default_rng([1, step + 1]))
        round_trip = type(round_trip).from_state(round_trip.to_state(),
                                                 rng=np.random.default_rng([1, step + 1]), log=log)
        for i in range(5 * step, 5 * step + 5):
            got += in_place.push(X[i], labels[i])
            want += round_trip.push(X[i], labels[i])
    assert len(got) == len(want) > 5
    for a, b in zip(got, want):
        assert a.params.tobytes() == b.params.tobytes() and a == b
    assert in_place.to_state() == round_trip.to_state()


def test_push_per_point_equals_step_per_block_with_clipping_softmax_and_any_labels():
    # push clips one row and maps one label (clip_point, label_index); step does a block.
    kw = dict(n_features=3, classes=["x", 7, None], feature_bound=0.8, lam=0.3, rng=9)
    X, y = data(48, d=3, k=3, seed=8)
    X = X * np.random.default_rng(1).uniform(0.01, 3.0, size=(48, 1))      # some inside, most clipped
    labels = [kw["classes"][v] for v in y]
    a = ContinualERMMechanism(1.0, 4, 8, **kw)
    b = ContinualERMMechanism(1.0, 4, 8, **kw)
    via_push = [r for i in range(48) for r in a.push(list(X[i]), labels[i])]
    via_step = [r for c in range(12) for r in b.step(X[4 * c:4 * c + 4], labels[4 * c:4 * c + 4])]
    assert len(via_push) == len(via_step) == 11
    for r1, r2 in zip(via_push, via_step):
        assert r1.params.tobytes() == r2.params.tobytes()
    assert a.to_state() == b.to_state()
