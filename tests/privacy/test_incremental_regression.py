"""Privacy by shape for IncrementalRegression: replace-one neighbours release the same structure.

Seed 002's neighbours replace one record (Def. 4); the transform states that
relation (one event replaced by another in the same step and key). With
production noise, neighbouring inputs must release exactly the same
(key, step) pairs, the same public noise figures and the same ledger: a
release whose presence or shape depends on one event leaks it whatever the
noise. Events of undeclared keys or outside the schedule are rejected by
public rules and change nothing either.
"""

import pytest

import dp_beam as dpb
from dp_beam.mechanisms.regression import L1Ball
from tests.beam_util import streaming_options
from tests.privacy.neighbours import (assert_same_structure, created, event_stream, release_structure,
                                      replaced)

KEYS = ["A", "B"]
SCHEDULE = dict(step=10, start=10, end=120, timestamp_fn=lambda e: e["ts"])


def _event(ts, x, y, key="A"):
    return {"ts": float(ts), "k": key, "x": [x, 1.0 - x, 0.5 * x], "y": y}


BASE = [_event(12 + 2.5 * i, (i * 7 % 10) / 10, ((i * 3) % 7 - 3) / 4) for i in range(40)]
NEIGHBOURS = {
    "base": BASE,
    # Replacing one event keeps its timestamp and key (same step): the relation stated.
    "replaced first": replaced(BASE, 0, _event(12, 0.95, -1.0)),
    "replaced middle": replaced(BASE, 17, _event(BASE[17]["ts"], 0.0, 1.0)),
    "replaced by an outlier (clipped)": replaced(BASE, 30, {**BASE[30], "x": [50.0, -80.0, 3.0],
                                                            "y": 9.0}),
    "undeclared key": BASE + [_event(60, 0.5, 0.1, key="Z")],
    "before start": BASE + [_event(5, 0.5, 0.1)],
    "after end": BASE + [_event(125, 0.5, 0.1)],
}
COMMON = dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], dim=3, epsilon=1.0,
              delta=1e-6, key_fn=lambda e: e["k"], keys=KEYS, **SCHEDULE)
METHODS = {
    "tree": lambda: dpb.IncrementalRegression(**COMMON),
    "tree/tree counter, NoisyProjGrad, L1": lambda: dpb.IncrementalRegression(
        **COMMON, counter="tree", solver="noisy_proj_grad", constraint=L1Ball(2.0)),
    # Φ is drawn from the noise key at construction; one key makes α (which depends on ‖Φ‖)
    # comparable across the runs. (Test only: a key is never reused on different data.)
    "projection": lambda: dpb.IncrementalRegression(
        **COMMON, method="projection", projection_dim=2,
        noise_key=dpb.NoiseKey.from_bytes(bytes(range(32)))),
    "batch": lambda: dpb.IncrementalRegression(**COMMON, method="batch", tau=3),
}


def _shape(r):
    return (r.key, r.step, r.t, r.n, r.covers, r.noise_std_gram, r.noise_std_xy,
            r.noise_std_model, r.alpha, r.constraint, r.method)


def _structure(make, events, options=None, stream=None):
    shapes, ledger = release_structure(make, created(events, stream), _shape, options)
    return set(shapes), ledger


@pytest.mark.parametrize("name", sorted(METHODS))
def test_replace_one_neighbours_release_the_same_structure(name):
    make = METHODS[name]
    shape, ledger = _structure(make, NEIGHBOURS["base"])
    assert {(k, s) for k, s, *_ in shape} == {(k, s) for k in KEYS for s in range(1, 12)}
    assert sorted(e.key for e in ledger) == KEYS
    assert all(e.relation == "replace" for e in ledger)
    assert_same_structure(lambda events: _structure(make, events), NEIGHBOURS, (shape, ledger))


def _stream(times):
    return event_stream(times, lambda ts: _event(ts, 0.3, 0.2))


def test_streaming_idle_gaps_do_not_change_the_structure():
    runs = {label: _structure(METHODS["tree"], None, streaming_options(), _stream(times))
            for label, times in {"one event": [25], "after an idle gap": [25, 101]}.items()}
    shapes = [{(k, s) for k, s, *_ in shape} for shape, _ in runs.values()]
    assert shapes[0] == shapes[1] == {(k, s) for k in KEYS for s in range(1, 12)}
    assert len({tuple(map(repr, ledger)) for _, ledger in runs.values()}) == 1
