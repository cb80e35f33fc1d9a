"""JSON-lines sinks for releases, ledger entries, reports and dead letters.

Every line is ``dp_beam.records.to_json(record)``: the record's fields plus
``record`` (its type) and, for ledger entries and reports, ``version``.
Bounded input is written to one file at exactly ``path``; unbounded input is
cut into event-time windows of ``window`` seconds and each window's pane is
written to its own file named from ``path`` (``<path stem>-<window>-<pane>…``),
so a streaming job's records become visible as their windows close.
"""

import json
import os

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.transforms.window import FixedWindows

from dp_beam.records import to_json


def dumps(record) -> str:
    return json.dumps(to_json(record), sort_keys=False, allow_nan=False)


class WriteJsonLines(beam.PTransform):
    """Writes records as JSON lines (one file in batch, windowed files in streaming)."""

    def __init__(self, path, window=3600, label=None):
        super().__init__(label)
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        self._path = path
        self._window = window

    def expand(self, records):
        lines = records | "ToJson" >> beam.Map(dumps)
        if records.is_bounded:
            return lines | "Write" >> beam.io.WriteToText(
                self._path, shard_name_template="", num_shards=1)
        directory, name = os.path.split(self._path.rstrip("/"))
        stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
        return (lines
                | "Window" >> beam.WindowInto(FixedWindows(self._window))
                | "Write" >> fileio.WriteToFiles(
                    path=directory or ".",
                    file_naming=fileio.default_file_naming(prefix=stem, suffix=".jsonl"),
                    shards=1))


class WriteReleases(WriteJsonLines):
    """Writes :class:`~dp_beam.records.Release` records as JSON lines."""


class WriteLedger(WriteJsonLines):
    """Writes :class:`~dp_beam.records.LedgerEntry` or report records as JSON lines."""


class WriteInvalid(WriteJsonLines):
    """Writes :class:`~dp_beam.records.InvalidElement` dead letters as JSON lines."""
