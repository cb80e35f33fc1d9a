"""The release options every continual transform shares (streams.py), validated eagerly."""

import datetime
import types

import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.transforms.keys import PrivateKeys
from dp_beam.transforms.schedule import DeclaredKeys
from dp_beam.transforms.streams import (check_horizon, private_keys, seconds, set_release_options,
                                        validation)

KEY = NoiseKey.from_bytes(bytes(range(32)))


def test_seconds_takes_numbers_and_timedeltas():
    assert seconds("step", 3600) == 3600.0
    assert seconds("step", datetime.timedelta(minutes=1, microseconds=500)) == 60.0005
    assert seconds("allowed_lateness", 0, allow_zero=True) == 0.0


@pytest.mark.parametrize("value, allow_zero, message", [
    (0, False, "step must be positive, got 0"),
    (-1.0, True, "step must be >= 0, got -1.0"),
    (float("inf"), False, "step must be a number of seconds or a timedelta, got inf"),
    (True, False, "step must be a number of seconds or a timedelta, got True"),
    ("60", False, "step must be a number of seconds or a timedelta, got '60'"),
])
def test_seconds_refuses(value, allow_zero, message):
    with pytest.raises(ValueError, match="^" + message + "$"):
        seconds("step", value, allow_zero)


def test_check_horizon():
    assert check_horizon(None) is None and check_horizon(5) == 5
    for bad in (0, True, 2.0, "3"):
        with pytest.raises(ValueError, match="horizon must be an int >= 1 or None"):
            check_horizon(bad)


def _options(**kw):
    args = dict(step=60, allowed_lateness=datetime.timedelta(days=1), late="defer", rng=None, start=0, end=600,
                noise_key=KEY)
    args.update(kw)
    t = types.SimpleNamespace()
    set_release_options(t, args.pop("step"), args.pop("allowed_lateness"),
                        args.pop("late"), args.pop("rng"), **args)
    return t


def test_set_release_options_sets_the_schedule_and_options():
    t = _options(step=datetime.timedelta(minutes=1), allowed_lateness=30, rng=7, keys=["a", "b"],
                 key_fn=lambda e: e["k"])
    assert (t._step, t._step_micros) == (60.0, 60_000_000)
    assert (t._schedule.start_step, t._schedule.end_step) == (0, 10)
    assert t._allowed_lateness == 30.0 and t._late == "defer" and t._seed == 7
    assert t._noise_key is KEY
    assert isinstance(t._keys, DeclaredKeys) and t._keys.keys == frozenset({"a", "b"})
    schedule, declared, side = validation(t)
    assert schedule is t._schedule and declared == frozenset({"a", "b"}) and side == {}
    assert private_keys(t) is None
    assert t._shards is None  # chosen when the input is known (release_shards)


def test_set_release_options_without_a_noise_key_draws_a_fresh_one():
    a, b = _options(noise_key=None), _options(noise_key=None)
    assert isinstance(a._noise_key, NoiseKey) and a._noise_key != b._noise_key
    assert a._allowed_lateness == 86400.0
    assert validation(a)[1:] == (None, {})


def test_private_keys_are_returned_as_such():
    t = _options(key_fn=lambda e: e["k"], keys=PrivateKeys(epsilon=0.5, delta=1e-6))
    assert isinstance(private_keys(t), PrivateKeys)


@pytest.mark.parametrize("kw, message", [
    ({"step": 0}, "step must be positive"),
    ({"step": 1e-7}, "step must be at least one microsecond"),
    ({"horizon": 0}, "horizon must be an int >= 1 or None"),
    ({"key_fn": "k"}, "key_fn must be callable, got 'k'"),
    ({"allowed_lateness": -1}, "allowed_lateness must be >= 0"),
    ({"allowed_lateness": None}, "allowed_lateness must be a number of seconds or a timedelta"),
    ({"late": "keep"}, "late must be 'defer' or 'drop', got 'keep'"),
    ({"rng": 1.5}, "rng must be None (secure noise), or for tests an int seed"),
    ({"rng": True}, "rng must be None (secure noise)"),
    ({"noise_key": b"x" * 32}, "noise_key must be None (a fresh key per construction)"),
    ({"shards": -1}, "shards must be None (chosen from the declared keys), 0"),
    ({"shards": True}, "shards must be None"),
])
def test_set_release_options_names_the_bad_parameter(kw, message):
    with pytest.raises(ValueError) as exc:
        _options(**kw)
    assert str(exc.value).startswith(message)


def test_a_noise_source_is_kept_as_the_test_seed():
    noise = ZeroNoise()
    assert _options(rng=noise)._seed is noise
