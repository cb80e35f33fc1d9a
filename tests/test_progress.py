"""Run feedback (progress.py): progress lines, the per-transform summary of a run's counters and
the check of the share of rejected input."""

import logging
from types import SimpleNamespace

import pytest

from dp_beam import progress
from dp_beam.progress import (INTERVAL_ENV, ReleaseProgress, TooManyInvalid, check_invalid,
                              format_summary, interval_seconds, invalid_share, rejected, summarise)


def test_interval_seconds_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_seconds() == 30.0
    assert interval_seconds(0) == 0.0
    monkeypatch.setenv(INTERVAL_ENV, " 2.5 ")
    assert interval_seconds() == 2.5
    assert interval_seconds(7) == 7.0  # the argument wins
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=f"^{INTERVAL_ENV} must be a number of seconds, got 'soon'"):
        interval_seconds()
    monkeypatch.setenv(INTERVAL_ENV, "-1")
    with pytest.raises(ValueError, match=f"^{INTERVAL_ENV} must be a number of seconds >= 0"):
        interval_seconds()
    for bad in (True, -0.5, float("nan"), "3"):
        with pytest.raises(ValueError, match="^interval must be a number of seconds >= 0"):
            interval_seconds(bad)


def test_release_progress_logs_the_first_release_then_at_most_every_interval(caplog):
    caplog.set_level(logging.INFO, logger=progress.LOGGER)
    p = ReleaseProgress("hourly", interval=3600)
    p.released("AA", 10, 36000.0, events=3)
    p.released("AA", 11, 39600.0, events=2)
    assert (p.steps, p.events) == (2, 5)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("hourly: 1 step(s) released so far on this worker, last: key 'AA', step 10 "
                    "(window ending 1970-01-01 10:00 UTC); 3 event(s) used")
    caplog.clear()
    every = ReleaseProgress("daily", interval=0)
    for step in range(3):
        every.released(None, step, 86400.0 * (step + 1))
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "daily: 1 step(s) released so far on this worker", "daily: 2 step(s) released so far on "
        "this worker", "daily: 3 step(s) released so far on this worker"]
    with pytest.raises(ValueError, match="interval must be"):
        ReleaseProgress("x", interval=-1)


def _counter(name, committed, attempted=None):
    return SimpleNamespace(key=SimpleNamespace(metric=SimpleNamespace(name=name)),
                           committed=committed, attempted=attempted)


class _Result:
    def __init__(self, counters=None, fail=False):
        self._counters, self._fail = counters, fail

    def metrics(self):
        if self._fail:
            raise NotImplementedError("no metrics")
        counters = self._counters
        return SimpleNamespace(query=lambda _filter: {"counters": counters})


def test_summarise_totals_per_transform_in_a_fixed_counter_order():
    result = _Result([
        _counter("sum.invalid", 2), _counter("count.zeta", 1), _counter("count.events_used", 5),
        _counter("count.released_steps", 3), _counter("count.events_used", 4),
        _counter("count.invalid", None, 7), _counter("nolabel", 9), _counter("sum.x", None)])
    summary = summarise(result)
    assert list(summary) == ["count", "sum"]
    assert list(summary["count"].items()) == [("released_steps", 3), ("events_used", 9),
                                              ("invalid", 7), ("zeta", 1)]
    assert summary["sum"] == {"invalid": 2}
    assert format_summary(summary) == [
        "'count': released_steps=3, events_used=9, invalid=7, zeta=1", "'sum': invalid=2"]
    assert summarise(_Result([])) is None
    assert summarise(_Result(fail=True)) is None
    assert format_summary(None) == ["no dp_beam metrics reported by this runner"]


def test_rejected_and_invalid_share():
    counts = {"events_used": 30, "invalid": 60, "over_contribution": 5, "over_keys": 1,
              "late_dropped_events": 2, "beyond_lateness_events": 2, "clamped": 100}
    assert rejected(counts) == 70
    assert invalid_share(counts) == 0.7
    assert invalid_share({"invalid": 3}) is None  # no events_used reported
    assert invalid_share({"events_used": 0}) is None


def test_check_invalid_warns_above_ten_percent_and_raises_past_the_limit(caplog):
    caplog.set_level(logging.WARNING, logger=progress.LOGGER)
    summary = {"a": {"events_used": 95, "invalid": 5}, "b": {"events_used": 80, "invalid": 20},
               "c": {"invalid": 4}}
    check_invalid(summary, max_fraction=0.5)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "'b' rejected 20 of 100 input events (20 %); see the invalid output for the reasons",
        "'c' rejected 4 input events, and the runner reported no events_used for it: its share "
        "of invalid input was not checked"]
    with pytest.raises(TooManyInvalid, match=r"^'b' rejected 20 of 100 input events \(20 %\), "
                                             r"more than max_invalid_fraction=0\.15"):
        check_invalid(summary, max_fraction=0.15)
    check_invalid(summary, max_fraction=None)  # never raises
    caplog.clear()
    check_invalid(None)
    assert "share of invalid input was not checked" in caplog.records[0].getMessage()
    for bad in (1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="max_fraction must be a number in"):
            check_invalid(summary, bad)
