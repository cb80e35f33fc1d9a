"""Privacy by shape: neighbouring inputs give the same output structure, with secure noise.

A release whose *presence* depends on one event (a stream starting at a key's
first event, ending at the last event, pausing when idle, a key appearing
because someone used it) leaks that event with certainty, whatever the noise.
For every continual transform and each neighbour relation it is stated for,
these tests run neighbouring inputs with production (secure) noise and compare
what may not differ: the set of released (key, step) pairs (for ERM streams,
whose model times are count-triggered under replace-one neighbours, the
(key, step, kind, level, t) of every model) and the ledger entries.
"""

import pytest

import dp_beam as dpb
from tests.beam_util import streaming_options
from tests.privacy.neighbours import (assert_same_structure, created, event_stream, release_structure,
                                      replaced)

KEYS = ["A", "B"]
SCHEDULE = dict(step=10, start=10, end=200, timestamp_fn=lambda e: e["ts"])


def _event(ts, key="A", user="u1", value=0.5):
    return {"ts": float(ts), "k": key, "u": user, "v": value}


# Events of key A from three users in steps 2..4; B has none.
BASE = [_event(25, user="u1"), _event(31, user="u2", value=0.2), _event(44, user="u3", value=0.9),
        _event(47, user="u1", value=0.1)]

ADD_REMOVE = {
    "base": BASE,
    "new key": BASE + [_event(35, key="B", user="u9")],
    "earlier event": BASE + [_event(11, user="u9")],
    "later event": BASE + [_event(195, user="u9")],
    "removed event": BASE[1:],
    "new user, several events": BASE + [_event(t, user="u9") for t in (12, 58, 150)],
    "undeclared key": BASE + [_event(33, key="Z", user="u9")],
    "before start": BASE + [_event(3, user="u9")],
}

KEYED = dict(key_fn=lambda e: e["k"], keys=KEYS)
# name: (transform factory, the keys of its streams)
COUNTERS = {
    "count/event": (lambda: dpb.ContinualCount(epsilon=1.0, **KEYED, **SCHEDULE), KEYS),
    "count/user": (lambda: dpb.ContinualCount(
        epsilon=1.0, privacy_unit="user", user_fn=lambda e: e["u"], max_contributions=3,
        **KEYED, **SCHEDULE), KEYS),
    "sum/event": (lambda: dpb.ContinualSum(value_fn=lambda e: e["v"], lower=0, upper=1,
                                           epsilon=1.0, noise="gaussian", delta=1e-6, **SCHEDULE),
                  [None]),
    "mean/participation": (lambda: dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=4, epsilon=1.0, max_users=100, **KEYED, **SCHEDULE), KEYS),
    "mean/values": (lambda: dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=4, epsilon=1.0, neighbours="values", max_users=100, **SCHEDULE),
        [None]),
}


def _erm_event(ts, x, y, key="A"):
    return {"ts": float(ts), "k": key, "x": [x, 1.0 - x], "y": y}


ERM_BASE = [_erm_event(20 + 3 * i, (i * 7 % 10) / 10, i % 2) for i in range(40)]
REPLACE = {
    "base": ERM_BASE,
    # Replacing one event keeps its timestamp and key (the relation of seed 004).
    "replaced first": replaced(ERM_BASE, 0, _erm_event(20, 0.95, 1)),
    "replaced middle": replaced(ERM_BASE, 17, _erm_event(ERM_BASE[17]["ts"], 0.0, 0)),
    "undeclared key": ERM_BASE + [_erm_event(60, 0.5, 1, key="Z")],
    "before start": ERM_BASE + [_erm_event(5, 0.5, 1)],
}
ERM_COMMON = dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1),
                  n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=4,
                  key_fn=lambda e: e["k"], keys=KEYS, **SCHEDULE)
ERMS = {
    "continual_erm": lambda: dpb.ContinualERM(base_size=8, **ERM_COMMON),
    "sliding_erm": lambda: dpb.SlidingWindowERM(window=12, **ERM_COMMON),
    "multires_erm": lambda: dpb.MultiResolutionERM(max_scale=2, **ERM_COMMON),
}


def _shape(r):
    if hasattr(r, "kind"):
        return (r.key, r.step, r.kind, r.level, r.t)
    return (r.key, r.step)


def _structure(make, events, options=None, stream=None):
    shapes, ledger = release_structure(make, created(events, stream), _shape, options)
    return set(shapes), ledger


@pytest.mark.parametrize("name", sorted(COUNTERS))
def test_add_remove_neighbours_release_the_same_structure(name):
    make, keys = COUNTERS[name]
    shape, ledger = _structure(make, ADD_REMOVE["base"])
    # Every (declared) key, every step from start (step 1) to end (step 19).
    assert shape == {(k, s) for k in keys for s in range(1, 20)}
    assert sorted(e.key for e in ledger) == sorted(keys, key=repr)
    assert_same_structure(lambda events: _structure(make, events), ADD_REMOVE, (shape, ledger))


@pytest.mark.parametrize("name", sorted(ERMS))
def test_replace_one_neighbours_release_the_same_structure(name):
    make = ERMS[name]
    shape, ledger = _structure(make, REPLACE["base"])
    assert shape, "no model released"
    assert sorted(e.key for e in ledger) == KEYS
    assert_same_structure(lambda events: _structure(make, events), REPLACE, (shape, ledger))


@pytest.mark.parametrize("name", ["count/event", "mean/participation"])
def test_streaming_idle_gap_and_late_data_do_not_change_the_structure(name):
    """An idle gap used to pause a stream until the next event resumed it."""
    make, _ = COUNTERS[name]
    runs = {label: _structure(make, None, streaming_options(), event_stream(times, _event))
            for label, times in {"one event": [25], "after an idle gap": [25, 101],
                                 "three events": [25, 101, 150]}.items()}
    shapes = {label: shape for label, (shape, _) in runs.items()}
    ledgers = {label: ledger for label, (_, ledger) in runs.items()}
    assert shapes["one event"] == {(k, s) for k in KEYS for s in range(1, 20)}
    assert len(set(map(frozenset, shapes.values()))) == 1, shapes
    assert len({tuple(map(repr, ledger)) for ledger in ledgers.values()}) == 1
