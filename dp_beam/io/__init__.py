"""Sinks for dp_beam records."""

from dp_beam.io.jsonl import WriteInvalid, WriteJsonLines, WriteLedger, WriteReleases, dumps

__all__ = ["WriteInvalid", "WriteJsonLines", "WriteLedger", "WriteReleases", "dumps"]
