"""The front of the report (report.py): its re-exported names, ``--bounds`` and the files written.

Reading is tested in test_report_reading.py, the budget rows in
test_report_budget.py, the figure in test_report_figures.py, the page in
test_report_page.py, and the command in test_cli.py."""

import json

import pytest

from dp_beam import report, report_budget, report_figures, report_page, report_reading


def test_the_names_of_the_split_modules_stay_importable_from_report():
    for module in (report_reading, report_budget, report_figures, report_page):
        for name in set(module.__all__) & set(report.__all__):
            assert getattr(report, name) is getattr(module, name), name
    assert "utc" not in report.__all__  # a helper of the split, not a name of the report


def test_parse_bounds():
    assert report.parse_bounds(None) == {}
    assert report.parse_bounds(["count=0,10", "a=b=-1.5,2"]) == {"count": (0.0, 10.0),
                                                                  "a=b": (-1.5, 2.0)}
    for bad in ("count=0:10", "count=2,1", "=0,1", "count=0,1,2", "count=x,1"):
        with pytest.raises(report.ReportError, match="--bounds takes LABEL=LOWER,UPPER"):
            report.parse_bounds([bad])


def _folder(tmp_path, records):
    (tmp_path / "releases.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(tmp_path)


def _release(step):
    return dict(record="Release", transform="count", key=None, step=step, value=float(step),
                ci95=0.5, window_start=3600.0 * step, window_end=3600.0 * (step + 1),
                mechanism="tree")


def test_write_report_refuses_names_of_no_released_transform(tmp_path):
    out = _folder(tmp_path, [_release(0)])
    with pytest.raises(report.ReportError, match="--counts names no released transform: sum"):
        report.write_report(out, counts={"sum"})
    with pytest.raises(report.ReportError, match="--bounds names no released transform: sum"):
        report.write_report(out, bounds={"sum": (0.0, 1.0)})


def test_write_report_refuses_a_folder_of_unplottable_records(tmp_path):
    out = _folder(tmp_path, [{"record": "KeyAdmission"}, {"record": "KeyAdmission"}])
    with pytest.raises(report.ReportError,
                       match=r"no plottable releases .* \(found 2 KeyAdmission\)"):
        report.write_report(out)


def test_write_report_writes_both_files_to_dest_and_warns_of_what_it_left_out(tmp_path):
    (tmp_path / "run").mkdir()
    out = _folder(tmp_path / "run",
                  [_release(0), dict(_release(0), transform="sum"), {"record": "KeyAdmission"}])
    html_path, png_path, warnings = report.write_report(out, dest=str(tmp_path / "dest"),
                                                        max_streams=1)
    assert html_path == str(tmp_path / "dest" / "report.html")
    assert open(png_path, "rb").read()[:4] == b"\x89PNG"
    assert warnings == ["plotted 1 of 2 streams (--max-streams); the HTML table lists all",
                        "not plotted: 1 KeyAdmission records (no running value)"]
