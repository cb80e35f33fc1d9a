"""The parameters of the private-ERM streams (dp_beam.mechanisms.erm.config): validation naming
the parameter, normalised values, and one parameter list shared with the engine-free streams."""

import dataclasses
import inspect

import numpy as np
import pytest

from dp_beam.mechanisms.erm import (
    ContinualERMConfig,
    ContinualERMMechanism,
    ERMConfig,
    MultiResolutionERMConfig,
    MultiResolutionERMMechanism,
    SlidingWindowERMConfig,
    SlidingWindowERMMechanism,
)
from dp_beam.mechanisms.erm.config import WINDOW_POLICIES, field_names

from .helpers import data

MODEL = dict(epsilon=1.0, block_size=4, n_features=2, classes=[0, 1], feature_bound=1.0, lam=0.5)
FAMILIES = [
    (ContinualERMMechanism, ContinualERMConfig, dict(base_size=8)),
    (SlidingWindowERMMechanism, SlidingWindowERMConfig, dict(window=12)),
    (MultiResolutionERMMechanism, MultiResolutionERMConfig, dict(max_scale=2)),
]


@pytest.mark.parametrize("kwargs,name", [
    (dict(classes="ab"), "classes"),
    (dict(classes=[0]), "classes"),
    (dict(classes=[0, 0]), "classes"),
    (dict(block_size=0), "block_size"),
    (dict(block_size=2.0), "block_size"),
    (dict(n_features=0), "n_features"),
    (dict(feature_bound=0.0), "feature_bound"),
    (dict(fit_intercept=1), "fit_intercept"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=float("inf")), "epsilon"),
    (dict(lam=-1.0), "lam"),
    (dict(noise="laplace"), "noise"),
    (dict(noise="gaussian"), "delta"),
    (dict(noise="gaussian", delta=1.0), "delta"),
    (dict(delta=1e-6), "delta"),
    (dict(tol_fraction=0.0), "tol_fraction"),
    (dict(tol_fraction=1.5), "tol_fraction"),
])
def test_shared_errors_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ERMConfig(**{**MODEL, **kwargs})


@pytest.mark.parametrize("cls,kwargs,message", [
    (ContinualERMConfig, dict(base_size=0), "base_size must be an int >= 1"),
    (ContinualERMConfig, dict(base_size=6), "base_size must be a multiple of block_size=4, got 6"),
    (SlidingWindowERMConfig, dict(window=12, window_policy="x"), "window_policy must be one of"),
    (SlidingWindowERMConfig, dict(window=2), "window must be an int >= 4"),
    (SlidingWindowERMConfig, dict(window=13), "window must be a multiple of block_size=4 in exact"),
    (SlidingWindowERMConfig, dict(window=16), r"window must be \(2\^k - 1\)·block_size in exact mode, "
                                              r"got 4 blocks"),
    (MultiResolutionERMConfig, dict(max_scale=-1), "max_scale must be an int >= 0"),
    (MultiResolutionERMConfig, dict(max_scale=True), "max_scale"),
])
def test_family_errors_name_the_parameter(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**MODEL, **kwargs)


def test_values_are_normalised_and_frozen():
    config = ContinualERMConfig(epsilon=1, block_size=4, base_size=8, n_features=2,
                                classes=np.array([3, 5]), feature_bound=2, lam=1, delta=0)
    assert (config.epsilon, config.lam, config.feature_bound) == (1.0, 1.0, 2.0)
    assert all(type(v) is float for v in (config.epsilon, config.lam, config.feature_bound))
    assert config.classes == (3, 5) and isinstance(config.classes, tuple)
    assert config.delta is None          # pure ε: a δ of 0 is no δ
    gaussian = ERMConfig(**MODEL, noise="gaussian", delta=1e-6)
    assert gaussian.delta == 1e-6
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epsilon = 2.0
    assert dataclasses.replace(config, base_size=16).base_size == 16
    with pytest.raises(ValueError, match="base_size"):
        dataclasses.replace(config, base_size=6)     # replace re-validates


def test_window_blocks_follow_the_policy():
    make = lambda w, p: SlidingWindowERMConfig(**MODEL, window=w, window_policy=p)  # noqa: E731
    assert make(28, "exact").window_blocks == 7
    assert make(40, "round_down").window_blocks == 7
    assert make(42, "general").window_blocks == 10
    assert WINDOW_POLICIES == ("exact", "round_down", "general")


@pytest.mark.parametrize("stream_cls,config_cls,extra", FAMILIES)
def test_the_stream_takes_the_config_fields_with_the_config_defaults(stream_cls, config_cls, extra):
    # One parameter list: the stream's keywords are the config's fields plus rng and log.
    params = inspect.signature(stream_cls).parameters
    assert set(params) == set(field_names(config_cls)) | {"rng", "log"}
    for field in dataclasses.fields(config_cls):
        default = params[field.name].default
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert default == expected, field.name
    assert stream_cls.config_cls is config_cls


@pytest.mark.parametrize("stream_cls,config_cls,extra", FAMILIES)
def test_from_config_is_the_keyword_stream_bit_for_bit(stream_cls, config_cls, extra):
    X, y = data(64, seed=3)
    config = config_cls(**MODEL, **extra)
    a = stream_cls(rng=5, **MODEL, **extra)
    b = stream_cls.from_config(config, rng=5)
    assert a.config == config == b.config
    assert a.to_state()["config"] == config.to_dict()
    ra, rb = a.extend(X, y), b.extend(X, y)
    assert ra and [r.to_dict() for r in ra] == [r.to_dict() for r in rb]
    for r1, r2 in zip(ra, rb):
        np.testing.assert_array_equal(r1.params, r2.params)
    with pytest.raises(ValueError, match="config"):
        stream_cls.from_config(ERMConfig(**MODEL))


def test_streams_reject_a_string_of_classes():
    with pytest.raises(ValueError, match="classes"):
        MultiResolutionERMMechanism(**{**MODEL, "classes": "ab"})
