"""Privacy by shape for the growing-database transforms (seed 000): replace-one neighbours.

GrowingSynthetic and GrowingQueries are private for neighbours that replace
the cell of one record, the record keeping its event time and key (the
database size is the paper's clock, A15). With production noise, neighbouring
inputs must release the same structure (which runs happen, at which sizes and
steps; which queries are answered, at which sizes) and the same ledger. Adding
a record is *not* a neighbour for these transforms, and the test shows why:
it moves the run times, which is why the ledger states ``relation="replace"``.
"""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms.growing import LaplaceHistogram, MWEMHistogram
from tests.beam_util import batch_options, collect, streaming_options
from tests.privacy.neighbours import assert_same_structure, release_structure, replaced

N, STEP = 4, 10
KEYS = ["a", "b"]
SCHEDULE = dict(step=STEP, start=0, end=120, timestamp_fn=lambda r: r["ts"],
                key_fn=lambda r: r["k"], keys=KEYS, query_key_fn=lambda q: q["k"],
                query_fn=lambda q: q["f"], query_id_fn=lambda q: q["id"],
                query_timestamp_fn=lambda q: q["ts"])


def _record(ts, cell, key="a"):
    return {"ts": float(ts), "cell": cell, "k": key}


RNG = np.random.default_rng(2013)
BASE = [_record(RNG.uniform(0, 120), int(RNG.integers(0, N)), "a" if RNG.uniform() < 0.8 else "b")
        for _ in range(400)]
QUERIES = [{"ts": float(ts), "f": list(np.eye(N)[i % N]), "id": i, "k": KEYS[i % 2]}
           for i, ts in enumerate(np.linspace(2, 118, 40))]


def _replaced(index, cell):
    r = BASE[index]
    return replaced(BASE, index, _record(r["ts"], cell, r["k"]))   # same time and key, another cell


REPLACE = {
    "base": BASE,
    "replaced early": _replaced(int(np.argmin([r["ts"] for r in BASE])), 3),
    "replaced late": _replaced(int(np.argmax([r["ts"] for r in BASE])), 0),
    "replaced middle": _replaced(17, (BASE[17]["cell"] + 1) % N),
    "bad record added": BASE + [_record(50, 99)],         # rejected to .invalid: not in the database
    "undeclared key": BASE + [_record(50, 1, "z")],
}

TRANSFORMS = {
    "synthetic/epochs": lambda: dpb.GrowingSynthetic(
        lambda r: r["cell"], N, black_box=LaplaceHistogram(N), epsilon=1.0, n=40, gamma=0.5,
        **SCHEDULE),
    "synthetic/every_step": lambda: dpb.GrowingSynthetic(
        lambda r: r["cell"], N, black_box=MWEMHistogram(np.eye(N), N, rounds=3),
        scheduler="every_step", epsilon=1.0, delta=1e-6, n=40, **SCHEDULE),
    "queries/pure": lambda: dpb.GrowingQueries(lambda r: r["cell"], N, alpha=0.3, epsilon=1.0,
                                               n=40, **SCHEDULE),
    "queries/approx": lambda: dpb.GrowingQueries(lambda r: r["cell"], N, alpha=0.3, epsilon=1.0,
                                                 delta=1e-6, n=40, K=10, **SCHEDULE),
}


def _shape(release):
    if isinstance(release, dpb.SyntheticRelease):
        return ("run", release.key, release.step, release.t, release.run, release.epoch,
                release.epsilon, release.beta, release.pooled)
    if isinstance(release, dpb.QueryAnswer):
        # The answer's kind and value are its noisy content; "refused" depends on public t only.
        return ("answer", release.key, release.step, release.t, release.query_id,
                release.kind == "refused")
    return ("histogram", release.key, release.step, release.t, release.query_id)


def _structure(make, records, options=None, stream=None):
    def source(p):
        if stream is not None:
            both = p | stream
            recs = both | "records" >> beam.Filter(lambda e: "cell" in e)
            qs = both | "queries" >> beam.Filter(lambda e: "f" in e)
        else:
            recs = p | "records" >> beam.Create(records)
            qs = p | "queries" >> beam.Create(QUERIES)
        return recs, qs
    shapes, ledger = release_structure(make, source, _shape, options)
    return sorted(shapes, key=repr), ledger


@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_replace_one_neighbours_release_the_same_structure(name):
    make = TRANSFORMS[name]
    shape, ledger = _structure(make, BASE)
    assert any(s[0] == "run" for s in shape) or name.startswith("queries")
    assert sorted(e.key for e in ledger) == KEYS
    assert all(e.relation == "replace" for e in ledger)
    assert_same_structure(lambda records: _structure(make, records), REPLACE, (shape, ledger))


def test_adding_a_record_is_visible_which_is_why_the_relation_is_replace():
    make = TRANSFORMS["synthetic/epochs"]
    shape, _ = _structure(make, BASE)
    added, _ = _structure(make, BASE + [_record(0.5, 0)])
    assert added != shape          # every run's size moves by one


def test_streaming_structure_is_the_same_for_neighbours():
    def stream(records):
        ev = lambda e: TimestampedValue(e, e["ts"])
        s = test_stream.TestStream()
        for step in range(12):
            s = s.add_elements([ev(e) for e in records + QUERIES
                                if step * STEP <= e["ts"] < (step + 1) * STEP])
            s = s.advance_watermark_to((step + 1) * STEP)
        return s.advance_watermark_to_infinity()
    make = TRANSFORMS["queries/pure"]
    base, ledger = _structure(make, None, streaming_options(), stream(BASE))
    other, other_ledger = _structure(make, None, streaming_options(), stream(REPLACE["replaced middle"]))
    assert base == other and ledger == other_ledger
    assert base == _structure(make, BASE)[0]


@pytest.mark.parametrize("name", ["synthetic/epochs", "queries/pure"])
def test_the_same_noise_key_replays_the_same_values(name):
    key = dpb.NoiseKey.from_bytes(bytes(range(32)))

    def run():
        def build(p):
            res = (p | "r" >> beam.Create(BASE), p | "q" >> beam.Create(QUERIES)) | (
                TRANSFORMS[name]().__class__)(**_kwargs(name), noise_key=key)
            return {"releases": res.releases}
        return sorted(collect(batch_options(), build)["releases"], key=repr)
    assert run() == run()


def _kwargs(name):
    common = dict(universe_fn=lambda r: r["cell"], universe_size=N, epsilon=1.0, n=40, **SCHEDULE)
    if name == "synthetic/epochs":
        return dict(black_box=LaplaceHistogram(N), gamma=0.5, **common)
    return dict(alpha=0.3, **common)
