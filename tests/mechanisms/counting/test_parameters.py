"""CounterConfig: the counters' shared parameters, validated once and taken by every counter."""

import dataclasses
import inspect

import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.counting import MECHANISMS, CounterConfig


def test_fields_are_checked_and_normalised():
    c = CounterConfig(epsilon=2, sensitivity=3, horizon=16, noise="laplace", delta=0, dim=2)
    assert (c.epsilon, c.sensitivity, c.horizon, c.delta, c.dim) == (2.0, 3.0, 16, None, 2)
    assert type(c.epsilon) is float and type(c.sensitivity) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.epsilon = 1.0


@pytest.mark.parametrize("bad, name", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=1.0, sensitivity=-1.0), "sensitivity"),
    (dict(epsilon=1.0, horizon=0), "horizon"), (dict(epsilon=1.0, noise="cauchy"), "noise"),
    (dict(epsilon=1.0, delta=1e-6), "delta"), (dict(epsilon=1.0, dim=0), "dim"),
    (dict(epsilon=1.0, noise="gaussian", delta=1e-6, calibration="rdp"), "calibration"),
])
def test_a_bad_field_raises_value_error_naming_it(bad, name):
    with pytest.raises(ValueError, match=f"^{name} must"):
        CounterConfig(**bad)


def test_the_fields_are_every_counters_constructor_parameters():
    fields = [f.name for f in dataclasses.fields(CounterConfig)]
    for cls in MECHANISMS.values():
        params = inspect.signature(cls).parameters
        assert [p for p in params if p != "rng"] == fields, cls.__name__
        for f in dataclasses.fields(CounterConfig):
            assert params[f.name].default == f.default or f.name == "epsilon", (cls, f.name)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_from_config_builds_what_the_keywords_build(name):
    cls = MECHANISMS[name]
    config = CounterConfig(epsilon=0.5, sensitivity=2.0, horizon=32, noise="gaussian",
                           delta=1e-6)
    a, b = cls.from_config(config, rng=ZeroNoise()), cls(rng=ZeroNoise(), **config.to_dict())
    assert a.config == b.config == config
    assert a.to_state() == b.to_state()
    assert dict(a.privacy_cost()) == dict(config.cost())
    state = a.to_state()
    assert {k: state[k] for k in config.to_dict()} == config.to_dict()
    with pytest.raises(ValueError, match="config must be a CounterConfig"):
        cls.from_config(config.to_dict())


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@pytest.mark.parametrize("horizon", [None, 16])
def test_from_config_releases_what_the_keywords_release(name, horizon):
    # from_config skips the keyword constructor (the config is checked already): the
    # mechanisms must still step alike, noise included, on a fixed and an open horizon.
    cls = MECHANISMS[name]
    noise = "laplace" if getattr(cls, "LAPLACE", True) else "gaussian"
    config = CounterConfig(epsilon=1.0, horizon=horizon, noise=noise,
                           delta=1e-6 if noise == "gaussian" else None)
    a, b = cls.from_config(config, rng=7), cls(rng=7, **config.to_dict())
    assert a.config.rho == b.config.rho == config.rho
    xs = [float(t % 3) for t in range(20 if horizon is None else horizon)]
    assert [a.step(x) for x in xs] == [b.step(x) for x in xs]
    assert a.to_state() == b.to_state()


def test_a_mechanism_adds_its_own_checks_to_the_config():
    with pytest.raises(ValueError, match="noise must be 'gaussian' for blt"):
        MECHANISMS["blt"].from_config(CounterConfig(epsilon=1.0, horizon=8))
