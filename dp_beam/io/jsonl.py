"""JSON-lines sinks for releases, ledger entries, reports and dead letters.

Every line is ``dp_beam.records.to_json(record)``: the record's fields plus
``record`` (its type) and, for ledger entries and reports, ``version``.
Paths may be local or any filesystem Beam knows (``gs://`` included).

Bounded input is written to one file at exactly ``path``. Unbounded input is
written bundle by bundle: each bundle's records go to a new file named
``<path stem>-<unique id>.jsonl`` beside ``path``, written when the bundle
finishes. No windowing or grouping stands between a record and its file, so a
record is never dropped for arriving late — which a windowed file sink does to
the releases a stream emits after its watermark reached the end of time (a
drained job, the end of a test stream). A bundle that fails after writing and
is retried writes its records again under another name: delivery is at least
once, and ``(transform, key, step)`` identifies a release for de-duplication,
``id`` a dead letter (:class:`~dp_beam.records.InvalidElement`: a stable hash of
the transform, reason, element and event time, written in every line).
"""

import json
import os
import uuid
from typing import Any, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dp_beam.records import to_json

__all__ = ["dumps", "WriteInvalid", "WriteJsonLines", "WriteLedger", "WriteReleases"]


def dumps(record: Any) -> str:
    return json.dumps(to_json(record), sort_keys=False, allow_nan=False)


class _WriteBundles(beam.DoFn):
    """Writes the lines of each bundle to a file of its own."""

    def __init__(self, directory, stem):
        self._directory = directory
        self._stem = stem
        self._lines = None

    def start_bundle(self):
        self._lines = []

    def process(self, line):
        self._lines.append(line)

    def finish_bundle(self):
        if not self._lines:
            return
        path = FileSystems.join(self._directory, f"{self._stem}-{uuid.uuid4().hex}.jsonl")
        with FileSystems.create(path) as fh:
            fh.write(("\n".join(self._lines) + "\n").encode("utf-8"))
        self._lines = []


class WriteJsonLines(beam.PTransform):
    """Writes records as JSON lines (one file in batch, one file per bundle in streaming)."""

    def __init__(self, path: str, label: Optional[str] = None) -> None:
        super().__init__(label)
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a non-empty string, got {path!r}")
        self._path = path

    def expand(self, records):
        lines = records | "ToJson" >> beam.Map(dumps)
        if records.is_bounded:
            return lines | "Write" >> beam.io.WriteToText(
                self._path, shard_name_template="", num_shards=1)
        directory, name = os.path.split(self._path.rstrip("/"))
        stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
        return lines | "Write" >> beam.ParDo(_WriteBundles(directory or ".", stem))


class WriteReleases(WriteJsonLines):
    """Writes :class:`~dp_beam.records.Release` records as JSON lines."""


class WriteLedger(WriteJsonLines):
    """Writes :class:`~dp_beam.records.LedgerEntry` or report records as JSON lines."""


class WriteInvalid(WriteJsonLines):
    """Writes :class:`~dp_beam.records.InvalidElement` dead letters as JSON lines."""
