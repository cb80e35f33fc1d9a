"""Reading a run's outputs back (report_reading.py), as ``dp-beam report`` and the jobs do."""

import json
import os
from datetime import datetime, timezone

import pytest

from dp_beam import report_reading as reading


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _release(step, transform="count", key=None, value=1.0, **kw):
    return dict(record="Release", transform=transform, key=key, step=step, value=value,
                ci95=0.5, window_start=3600.0 * step, window_end=3600.0 * (step + 1),
                mechanism="tree", **kw)


def test_join_local_and_remote_folders():
    assert reading.join("out", "releases.jsonl") == os.path.join("out", "releases.jsonl")
    assert reading.join("gs://bucket/run", "releases.jsonl") == "gs://bucket/run/releases.jsonl"


def test_read_jsonl_reads_every_matching_file_in_path_order_and_skips_blank_lines(tmp_path):
    _write(tmp_path / "releases-1.jsonl", [json.dumps({"n": 3}), "", json.dumps({"n": 4})])
    _write(tmp_path / "releases-0.jsonl", [json.dumps({"n": 1}), "  ", json.dumps({"n": 2})])
    _write(tmp_path / "ledger.jsonl", [json.dumps({"n": 9})])
    records = reading.read_jsonl(str(tmp_path / "releases*.jsonl"))
    assert [r["n"] for r in records] == [1, 2, 3, 4]
    # A plain path is a pattern matching itself.
    assert reading.read_jsonl(str(tmp_path / "ledger.jsonl")) == [{"n": 9}]
    assert reading.read_jsonl(str(tmp_path / "missing.jsonl")) == []


def test_read_jsonl_names_the_file_and_line_of_a_bad_record(tmp_path):
    path = tmp_path / "releases.jsonl"
    _write(path, [json.dumps({"n": 1}), "{not json"])
    with pytest.raises(reading.ReportError, match=r"releases\.jsonl:2: not a JSON line"):
        reading.read_jsonl(str(path))


def test_write_bytes_creates_the_folder(tmp_path):
    path = tmp_path / "a" / "b" / "report.png"
    reading.write_bytes(str(path), b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"


def test_series_of_groups_releases_by_transform_and_key_in_step_order():
    records = [
        {"record": "Release", "transform": "count", "key": "b", "step": 1, "value": 2.0},
        {"record": "Release", "transform": "count", "key": "a", "step": 1, "value": 5.0},
        {"record": "Release", "transform": "count", "key": "a", "step": 0, "value": 4.0},
        {"record": "LedgerEntry", "transform": "count"},
    ]
    series = reading.series_of(records)
    assert {k: [r["step"] for r in v] for k, v in series.items()} == {
        ("count", '"a"'): [0, 1], ("count", '"b"'): [1]}


def test_series_of_splits_a_vector_mean_into_coordinates_and_counts_a_repeat_once():
    mean = dict(record="MeanRelease", transform="mean", key=None, step=0, value=[1.0, 2.0],
                ci95=[0.1, 0.2])
    series = reading.series_of([mean, dict(mean, value=[3.0, 4.0])])
    assert list(series) == [("mean[0]", "null"), ("mean[1]", "null")]
    # The last of a retried bundle's repeats is the one kept.
    assert [(r["value"], r["ci95"]) for r in series[("mean[1]", "null")]] == [(4.0, 0.2)]


def test_models_of_orders_by_release_and_counts_repeats_once():
    model = dict(record="ModelRecord", transform="erm", key=None, kind="private",
                 data_window=[0, 4], weights=[0.5])
    later = dict(model, t=20, window_end=7200.0, data_window=[4, 8])
    first = dict(model, t=10, window_end=3600.0)
    models = reading.models_of([later, first, dict(first), _release(0)])
    assert list(models) == [("erm", "null")]
    assert [m["t"] for m in models[("erm", "null")]] == [10, 20]


def test_load_outputs_refuses_a_missing_folder_and_one_without_releases(tmp_path):
    with pytest.raises(reading.ReportError, match="no such folder"):
        reading.load_outputs(str(tmp_path / "missing"))
    _write(tmp_path / "ledger.jsonl", [json.dumps({"transform": "count"})])
    with pytest.raises(reading.ReportError, match="no releases\\*.jsonl or models\\*.jsonl"):
        reading.load_outputs(str(tmp_path))


def test_load_outputs_sorts_records_into_streams_ledger_reports_and_others(tmp_path):
    _write(tmp_path / "releases.jsonl", [json.dumps(_release(0)), json.dumps(_release(1)),
                                         json.dumps({"record": "KeyAdmission", "key": "a"})])
    _write(tmp_path / "ledger.jsonl", [json.dumps({"transform": "count"}),
                                       json.dumps({"record": "Other", "transform": "x"})])
    _write(tmp_path / "report.jsonl", [json.dumps({"record": "AccountingReport", "unit": "event"}),
                                       json.dumps({"record": "Other"})])
    out = reading.load_outputs(str(tmp_path))
    assert [len(v) for v in out.streams.values()] == [2]
    assert out.models == {}
    assert out.ledger == [{"transform": "count"}]
    assert out.reports == [{"record": "AccountingReport", "unit": "event"}]
    assert out.other == {"KeyAdmission": 1}


def test_count_like_transforms_reads_the_per_event_bound_and_skips_means():
    ledger = [{"transform": "count", "sensitivity": 3.0, "max_contributions": 3},
              {"transform": "sum", "sensitivity": 2.5, "max_contributions": None},
              {"transform": "mean", "sensitivity": 1.0,
               "mechanism": reading.MEAN_PREFIX + "_gaussian"}]
    assert reading.count_like_transforms(ledger) == {"count"}


def test_value_label_names_means_counts_and_totals():
    mean = [dict(_release(0), record="MeanRelease")]
    assert reading.is_mean(mean) and not reading.is_mean([_release(0)]) and not reading.is_mean([])
    assert reading.value_label("m[0]", mean) == "running mean (value units)"
    assert reading.value_label("count", [_release(0)], {"count"}) == "running count (events)"
    assert reading.value_label("sum", [_release(0)], {"count"}) == "running total (value units)"


def test_utc_is_an_aware_time():
    assert reading.utc(3600.0) == datetime(1970, 1, 1, 1, tzinfo=timezone.utc)
