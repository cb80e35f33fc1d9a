"""The release spec interface (release_spec.py): its defaults and the stream key labels of noise
identities."""

import pytest

import dp_beam.transforms.release_spec as release_spec
from dp_beam.transforms.release_spec import ContinualResult, ReleaseSpec, key_label


class Total:
    def __init__(self, state, rng):
        self.state, self.rng = state, rng

    def to_state(self):
        return self.state


class TotalSpec(ReleaseSpec):
    def restore(self, state, rng, **with_log):
        return Total(state, (rng, with_log))


def test_default_aggregates_are_value_and_event_pairs():
    spec = ReleaseSpec()
    assert spec.zero() == (0.0, 0)
    assert spec.merge((1.5, 2), (2.0, 3)) == (3.5, 5)
    assert spec.events((9.0, 4.0)) == 4 and isinstance(spec.events((9.0, 4.0)), int)
    assert spec.done(object()) is False
    assert spec.uses_log is False and spec.horizon is None


def test_a_step_ends_where_the_next_one_starts():
    spec = ReleaseSpec()
    spec.step_seconds = 2.5
    assert [spec.window_end(k) for k in (0, 1, 3)] == [2.5, 5.0, 10.0]


def test_reseed_restores_the_mechanism_state_with_the_new_source_by_default():
    spec = TotalSpec()
    again = spec.reseed(Total(7, "old"), "new")
    assert (again.state, again.rng) == (7, ("new", {}))
    logged = spec.reseed(Total(7, "old"), "new", log="the log")
    assert logged.rng == ("new", {"log": "the log"})


@pytest.mark.parametrize("call", [lambda s: s.new_mechanism(None), lambda s: s.restore(None, None),
                                  lambda s: list(s.release(None, "k", 0, (0.0, 0))),
                                  lambda s: s.ledger("k")])
def test_what_a_mechanism_must_say_is_not_guessed(call):
    with pytest.raises(NotImplementedError):
        call(ReleaseSpec())


def test_a_continual_result_names_its_three_outputs():
    result = ContinualResult("r", "a", "i")
    assert (result.releases, result.accounting, result.invalid) == ("r", "a", "i")


def test_a_closed_stream_is_beyond_any_step():
    assert release_spec.CLOSED > 2 ** 61


@pytest.mark.parametrize("key", ["a", 3, 2.5, b"x", None, ("a", 1), ("a", (None, b"y"))])
def test_key_label_keeps_keys_with_a_canonical_encoding(key):
    assert key_label(key) == key


def test_key_label_names_other_keys_by_type_and_repr():
    class Opaque:
        def __repr__(self):
            return "Opaque()"

    label = key_label(Opaque())
    assert label == ("repr", __name__, "test_key_label_names_other_keys_by_type_and_repr"
                     ".<locals>.Opaque", "Opaque()")
    assert key_label(frozenset([1])) == ("repr", "builtins", "frozenset", "frozenset({1})")
