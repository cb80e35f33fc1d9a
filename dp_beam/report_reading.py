"""A run's JSON-lines outputs read back: releases, models, ledger and accounting reports.

Local folders and any Beam filesystem alike (per-bundle files of a streaming
run included); Apache Beam is imported only for a ``scheme://`` path.
"""

import json
import math
import os
from collections import OrderedDict, defaultdict
from datetime import datetime, timezone
from typing import AbstractSet, Any, Dict, Iterable, List, NamedTuple, Sequence

__all__ = ["count_like_transforms", "is_mean", "join", "load_outputs", "MEAN_PREFIX",
           "MODEL_RECORDS", "models_of", "Outputs", "read_jsonl", "RELEASE_FILES", "ReportError",
           "series_of", "SERIES_RECORDS", "utc", "value_label", "write_bytes"]

#: Records that carry a running value with its noise (``value``, ``ci95``).
SERIES_RECORDS = ("Release", "MeanRelease")
#: Released models of the ERM transforms (weights, not a running value).
MODEL_RECORDS = ("ModelRecord",)
#: Files a job's output folder may hold releases in (``streaming_erm`` writes models.jsonl).
RELEASE_FILES = ("releases*.jsonl", "models*.jsonl")
MEAN_PREFIX = "withhold_release_mean"


class ReportError(ValueError):
    """An output folder that cannot be reported on; the message is the one line to show."""


# --------------------------------------------------------------------------- reading

def join(directory: str, name: str) -> str:
    """``directory``/``name`` for local folders and Beam filesystems (``gs://``) alike."""
    if "://" in directory:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(directory, name)
    return os.path.join(directory, name)


def read_jsonl(pattern: str) -> list:
    """Records of every file matching ``pattern``, files in path order, lines in file order."""
    if "://" not in pattern:
        import glob

        paths = sorted(glob.glob(pattern))
        opener = open
    else:
        from apache_beam.io.filesystems import FileSystems

        try:
            paths = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        except Exception:  # a pattern that matches nothing raises on some filesystems
            paths = []
        opener = FileSystems.open
    records = []
    for path in paths:
        fh = open(path, "rb") if opener is open else opener(path)
        with fh:
            text = fh.read().decode("utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ReportError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return records


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to a local path (creating its folder) or a Beam filesystem path."""
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(path) as fh:
            fh.write(data)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _coordinates(record):
    values, cis = record["value"], record.get("ci95")
    cis = cis if isinstance(cis, list) else [cis] * len(values)
    return [dict(record, value=v, ci95=c) for v, c in zip(values, cis)]


def series_of(records: Iterable[Dict[str, Any]]) -> "OrderedDict":
    """``{(transform, key as JSON): [records in step order]}`` of the running-value releases.

    A vector mean is one series per coordinate (``transform[j]``); a release
    repeated by a retried bundle counts once (the last one read). Other
    records (models, key admissions) are left out.
    """
    streams = defaultdict(dict)
    for r in records:
        if r.get("record", "Release") not in SERIES_RECORDS:
            continue
        transform, key = r.get("transform", ""), json.dumps(r.get("key"))
        if isinstance(r.get("value"), list):
            for j, part in enumerate(_coordinates(r)):
                streams[(f"{transform}[{j}]", key)][r["step"]] = part
        else:
            streams[(transform, key)][r["step"]] = r
    return OrderedDict((k, [v[s] for s in sorted(v)]) for k, v in sorted(streams.items()))


def models_of(records: Iterable[Dict[str, Any]]) -> "OrderedDict":
    """``{(transform, key as JSON): [model records in release order]}`` (repeats counted once).

    Release order is the step, then ``t`` (the points the stream had consumed).
    """
    streams = defaultdict(dict)
    for r in records:
        if r.get("record") in MODEL_RECORDS:
            ident = (r.get("t"), r.get("kind"), json.dumps(r.get("data_window")))
            streams[(r.get("transform", ""), json.dumps(r.get("key")))][ident] = r
    return OrderedDict(
        (k, sorted(v.values(), key=lambda m: (m.get("window_end", 0), m.get("t", 0))))
        for k, v in sorted(streams.items()))


class Outputs(NamedTuple):
    """What :func:`load_outputs` read from a run's output folder."""
    streams: "OrderedDict"   # (transform, key JSON) -> running-value releases
    models: "OrderedDict"    # (transform, key JSON) -> model records
    ledger: List[dict]
    reports: List[dict]
    other: Dict[str, int]    # record type -> count of records neither plotted nor listed


def load_outputs(out_dir: str) -> Outputs:
    """Releases (``releases*.jsonl``, ``models*.jsonl``), ledger and reports of a run's folder.

    Raises :class:`ReportError` when the folder does not exist or holds no
    release records.
    """
    if "://" not in out_dir and not os.path.isdir(out_dir):
        raise ReportError(f"no such folder: {out_dir}")
    records = []
    for pattern in RELEASE_FILES:
        records += read_jsonl(join(out_dir, pattern))
    if not records:
        raise ReportError(f"no releases*.jsonl or models*.jsonl with records in {out_dir}")
    ledger = [r for r in read_jsonl(join(out_dir, "ledger*.jsonl"))
              if r.get("record", "LedgerEntry") == "LedgerEntry"]
    reports = [r for r in read_jsonl(join(out_dir, "report*.jsonl"))
               if r.get("record") == "AccountingReport"]
    other = defaultdict(int)
    for r in records:
        kind = r.get("record", "Release")
        if kind not in SERIES_RECORDS + MODEL_RECORDS:
            other[kind] += 1
    return Outputs(series_of(records), models_of(records), ledger, reports, dict(other))


# --------------------------------------------------------------------------- what a series is

def count_like_transforms(ledger: Iterable[Dict[str, Any]]) -> set:
    """Transforms whose true running total cannot decrease, as far as the ledger tells.

    A count adds 1 per event, so its per-event bound (sensitivity divided by
    the contributions per user) is 1; the ledger does not record a sum's
    lower bound, so a sum with bounds inside [-1, 1] looks the same: name the
    series explicitly (``dp-beam report --counts``) when that matters.
    """
    out = set()
    for e in ledger:
        if str(e.get("mechanism", "")).startswith(MEAN_PREFIX):
            continue  # a mean, whatever its sensitivity
        per_event = e.get("sensitivity", 0.0) / (e.get("max_contributions") or 1)
        # A sum's per-event bound carries one grid step more than max(|lower|, |upper|).
        if math.isclose(per_event, 1.0, rel_tol=0, abs_tol=1e-12):
            out.add(e["transform"])
    return out


def is_mean(records: Sequence[Dict[str, Any]]) -> bool:
    return bool(records) and (records[-1].get("record") == "MeanRelease"
                              or str(records[-1].get("mechanism", "")).startswith(MEAN_PREFIX))


def value_label(transform: str, records: Sequence[Dict[str, Any]],
                counts: AbstractSet[str] = frozenset()) -> str:
    """The y-axis label of a released series."""
    base = transform.split("[", 1)[0]
    if is_mean(records):
        return "running mean (value units)"
    if base in counts:
        return "running count (events)"
    return "running total (value units)"


def utc(seconds: float) -> datetime:
    """A record's ``window_start``/``window_end`` (seconds since the epoch) as a UTC time."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc)
