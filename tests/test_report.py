"""Reading a run's outputs back (report.py), as ``dp-beam report`` and the example jobs do.

Rendering is tested through the command in test_cli.py."""

import json
import os

import pytest

from dp_beam import report


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_join_local_and_remote_folders():
    assert report.join("out", "releases.jsonl") == os.path.join("out", "releases.jsonl")
    assert report.join("gs://bucket/run", "releases.jsonl") == "gs://bucket/run/releases.jsonl"


def test_read_jsonl_reads_every_matching_file_in_path_order_and_skips_blank_lines(tmp_path):
    _write(tmp_path / "releases-1.jsonl", [json.dumps({"n": 3}), "", json.dumps({"n": 4})])
    _write(tmp_path / "releases-0.jsonl", [json.dumps({"n": 1}), "  ", json.dumps({"n": 2})])
    _write(tmp_path / "ledger.jsonl", [json.dumps({"n": 9})])
    records = report.read_jsonl(str(tmp_path / "releases*.jsonl"))
    assert [r["n"] for r in records] == [1, 2, 3, 4]
    # A plain path is a pattern matching itself.
    assert report.read_jsonl(str(tmp_path / "ledger.jsonl")) == [{"n": 9}]
    assert report.read_jsonl(str(tmp_path / "missing.jsonl")) == []


def test_read_jsonl_names_the_file_and_line_of_a_bad_record(tmp_path):
    path = tmp_path / "releases.jsonl"
    _write(path, [json.dumps({"n": 1}), "{not json"])
    with pytest.raises(report.ReportError, match=r"releases\.jsonl:2: not a JSON line"):
        report.read_jsonl(str(path))


def test_series_of_groups_releases_by_transform_and_key_in_step_order():
    records = [
        {"record": "Release", "transform": "count", "key": "b", "step": 1, "value": 2.0},
        {"record": "Release", "transform": "count", "key": "a", "step": 1, "value": 5.0},
        {"record": "Release", "transform": "count", "key": "a", "step": 0, "value": 4.0},
        {"record": "LedgerEntry", "transform": "count"},
    ]
    series = report.series_of(records)
    assert {k: [r["step"] for r in v] for k, v in series.items()} == {
        ("count", '"a"'): [0, 1], ("count", '"b"'): [1]}


def test_parse_bounds():
    assert report.parse_bounds(None) == {}
    assert report.parse_bounds(["count=0,10", "a=b=-1.5,2"]) == {"count": (0.0, 10.0),
                                                                  "a=b": (-1.5, 2.0)}
    for bad in ("count=0:10", "count=2,1", "=0,1", "count=0,1,2", "count=x,1"):
        with pytest.raises(report.ReportError, match="--bounds takes LABEL=LOWER,UPPER"):
            report.parse_bounds([bad])
