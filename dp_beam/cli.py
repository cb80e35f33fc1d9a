"""The ``dp-beam`` command: run jobs, print their privacy plan, render their outputs.

::

    dp-beam jobs                          # the jobs in pipelines/
    dp-beam run JOB [job and Beam options]
    dp-beam plan JOB [job options]        # privacy plan table; nothing runs
    dp-beam report OUT_DIR [--consistent] # PNG + self-contained HTML of a run's outputs

A job is a module of the ``pipelines`` package with ``main(argv)`` (runs it)
and ``build_pipeline(argv) -> (pipeline, {label: accounting}, budget)``
(constructs it without running). Errors are one line on stderr and a non-zero
exit status; ``--verbose`` adds the traceback and Beam's own INFO logs.
"""

import argparse
import base64
import html
import importlib
import io
import json
import logging
import math
import os
import pkgutil
import re
import sys
import traceback
from collections import defaultdict
from datetime import datetime, timezone

PROG = "dp-beam"
_LOG = logging.getLogger("dp_beam.cli")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# --------------------------------------------------------------------------- logging

def configure_logging(verbosity=0):
    """dp_beam at INFO and Beam at WARNING by default; each ``-v`` opens both up one level."""
    root = logging.getLogger()
    for h in list(root.handlers):
        # Importing Beam logs through the root logger, which installs a bare
        # stderr handler; ours replaces it so that no line is printed twice.
        if type(h) is logging.StreamHandler and not getattr(h, "_dp_beam", False):
            root.removeHandler(h)
    if not any(getattr(h, "_dp_beam", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
        handler._dp_beam = True
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    logging.getLogger("dp_beam").setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
    beam_level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.getLogger("apache_beam").setLevel(beam_level)


# --------------------------------------------------------------------------- errors

class CliError(Exception):
    """An error whose message is already the one line to show."""


_EXC_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt))(: .*)?$")


def one_line(exc) -> str:
    """One readable line for an exception.

    Errors raised inside Beam workers arrive wrapped, with the worker's whole
    traceback in the message: the last ``SomeError: ...`` line is the cause.
    """
    if isinstance(exc, CliError):
        return str(exc)
    text = str(exc).strip()
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    if len(lines) > 1:
        causes = [l for l in lines if _EXC_LINE.match(l)]
        line = causes[-1] if causes else lines[0]
    else:
        line = lines[0] if lines else ""
    if not _EXC_LINE.match(line):
        line = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return line if len(line) <= 400 else line[:397] + "..."


# --------------------------------------------------------------------------- jobs

def available_jobs() -> dict:
    """``{name: module}`` of the modules in ``pipelines`` that are jobs."""
    import pipelines

    jobs = {}
    for info in pkgutil.iter_modules(pipelines.__path__):
        module = importlib.import_module(f"pipelines.{info.name}")
        if callable(getattr(module, "main", None)) and callable(
                getattr(module, "build_pipeline", None)):
            jobs[info.name] = module
    return jobs


def load_job(name):
    jobs = available_jobs()
    key = name.replace("-", "_")
    if key.endswith(".py"):
        key = os.path.basename(key)[:-3]
    if key not in jobs:
        raise CliError(f"unknown job {name!r}; available: {', '.join(sorted(jobs)) or 'none'}")
    return jobs[key]


def _summary(module) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def cmd_jobs(args):
    for name, module in sorted(available_jobs().items()):
        print(f"{name:24s} {_summary(module)}")
    return 0


def cmd_run(args):
    job = load_job(args.job)
    job.main(list(args.job_args))
    return 0


# --------------------------------------------------------------------------- plan

def _num(x, digits=4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def format_table(header, rows) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def plan_tables(accountings, budget) -> str:
    """The per-transform charges and the per-unit totals against ``budget``."""
    import dp_beam as dpb
    from dp_beam.transforms.accounting import plan_entries

    pcolls = list(accountings.values()) if isinstance(accountings, dict) else list(accountings)
    entries = plan_entries(pcolls)
    rows = [(e.transform, e.unit, e.relation, e.scope, e.mechanism, e.noise or "-",
             _num(e.sensitivity), _num(e.epsilon), _num(e.delta), _num(e.rho)) for e in entries]
    parts = ["Transforms (planned charge of each stream; streams of one transform's keys "
             "compose in parallel; relation: the neighbour relation the charge is stated for)",
             format_table(("transform", "unit", "relation", "scope", "mechanism", "noise",
                           "sensitivity", "ε", "δ", "ρ"), rows)]
    reports = dpb.plan(pcolls, budget)
    rows = []
    for r in reports:
        budgeted = r.budget_epsilon is not None or r.budget_rho is not None
        status = ("within" if r.within_budget else "OVER") if budgeted else "not budgeted"
        rows.append((r.unit, r.relation,
                     _num(r.epsilon) if r.epsilon is not None else "unbounded",
                     _num(r.delta), _num(r.rho),
                     _num(r.budget_epsilon), _num(r.budget_delta), _num(r.budget_rho),
                     _num(r.remaining_epsilon), _num(r.remaining_delta),
                     _num(r.remaining_rho), status))
    limits = ", ".join(f"{name} = {_num(getattr(budget, attr))}" for name, attr in (
        ("ε", "epsilon"), ("δ", "delta"), ("ρ", "rho")) if getattr(budget, attr, None) is not None)
    stated = sorted({r.relation for r in reports if r.budget_epsilon is not None
                     or r.budget_rho is not None})
    if stated:
        limits += f"; stated for {', '.join(stated)} neighbours"
    parts += ["", f"Per privacy unit and neighbour relation, against the budget ({limits})",
              format_table(("unit", "relation", "ε", "δ", "ρ", "budget ε", "budget δ",
                            "budget ρ", "remaining ε", "remaining δ", "remaining ρ", "status"),
                           rows)]
    notes = [f"{r.unit} ({r.relation}): {r.note}" for r in reports if getattr(r, "note", "")]
    notes += [f"{r.unit} ({r.relation}): tightest ε at δ={_num(r.at_delta)} is "
              f"{_num(r.epsilon_at_delta)} ({r.method})" for r in reports
              if getattr(r, "epsilon_at_delta", None) is not None
              and r.epsilon_at_delta != r.epsilon]
    if notes:
        parts += ["", *notes]
    return "\n".join(parts)


def cmd_plan(args):
    job = load_job(args.job)
    _pipeline, accountings, budget = job.build_pipeline(list(args.job_args))
    print(plan_tables(accountings, budget))
    return 0


# --------------------------------------------------------------------------- report

def _read_jsonl(pattern):
    """Records of every file matching ``pattern`` (local or any Beam filesystem)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # a pattern that matches nothing raises on some filesystems
        matched = []
    records = []
    for meta in sorted(matched, key=lambda m: m.path):
        with FileSystems.open(meta.path) as fh:
            for n, line in enumerate(fh.read().decode("utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise CliError(f"{meta.path}:{n}: not a JSON line ({e.msg})") from None
    return records


def _join(directory, name):
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.join(directory, name) if "://" in directory else os.path.join(
        directory, name)


def load_outputs(out_dir):
    """``(streams, ledger, reports)`` of a run's output folder.

    ``streams`` maps ``(transform, key as JSON)`` to that stream's releases in
    step order; streaming runs write one file per bundle (``releases-<id>.jsonl``),
    which are read together (a release repeated by a retried bundle counts once).
    """
    if "://" not in out_dir and not os.path.isdir(out_dir):
        raise CliError(f"no such folder: {out_dir}")
    releases = _read_jsonl(_join(out_dir, "releases*.jsonl"))
    if not releases:
        raise CliError(f"no releases*.jsonl with records in {out_dir}")
    ledger = [r for r in _read_jsonl(_join(out_dir, "ledger*.jsonl"))
              if r.get("record", "LedgerEntry") == "LedgerEntry"]
    reports = [r for r in _read_jsonl(_join(out_dir, "report*.jsonl"))
               if r.get("record") == "AccountingReport"]
    streams = defaultdict(dict)
    for r in releases:
        if r.get("record", "Release") not in SERIES_RECORDS:
            continue
        transform, key = r.get("transform", ""), json.dumps(r.get("key"))
        if isinstance(r.get("value"), list):
            # A vector mean is plotted as one series per coordinate.
            for j, part in enumerate(_coordinates(r)):
                streams[(f"{transform}[{j}]", key)][r["step"]] = part
        else:
            streams[(transform, key)][r["step"]] = r
    streams = {k: [v[s] for s in sorted(v)] for k, v in sorted(streams.items())}
    return streams, ledger, reports


# Records that carry a running value with its noise (``value``, ``ci95``); model
# records (``ModelRecord``) carry weights and are listed, not plotted.
SERIES_RECORDS = ("Release", "MeanRelease")


def _coordinates(record):
    values, cis = record["value"], record.get("ci95")
    cis = cis if isinstance(cis, list) else [cis] * len(values)
    return [dict(record, value=v, ci95=c) for v, c in zip(values, cis)]


def other_records(out_dir) -> dict:
    """``{record type: count}`` of the releases the report does not plot (e.g. models)."""
    counts = defaultdict(int)
    for r in _read_jsonl(_join(out_dir, "releases*.jsonl")):
        kind = r.get("record", "Release")
        if kind not in SERIES_RECORDS:
            counts[kind] += 1
    return dict(counts)


def count_like_transforms(ledger) -> set:
    """Transforms whose true running total cannot decrease, as far as the ledger tells.

    A count adds 1 per event, so its per-event bound (sensitivity divided by
    the contributions per user) is 1; the ledger does not record a sum's
    lower bound, so a sum with bounds inside [-1, 1] looks the same: name the
    series explicitly with ``--counts`` when that matters.
    """
    out = set()
    for e in ledger:
        if str(e.get("mechanism", "")).startswith("withhold_release_mean"):
            continue  # a mean, whatever its sensitivity
        per_event = e.get("sensitivity", 0.0) / (e.get("max_contributions") or 1)
        if math.isclose(per_event, 1.0):
            out.add(e["transform"])
    return out


def spent_per_unit(ledger, reports):
    """``{(unit, relation): (spent ε or None, budget ε or None, {transform: ε})}``.

    One item per total of the run's final reports (per privacy unit and
    neighbour relation; reports written before relations were recorded are
    add/remove ones), or, without reports, per unit and relation of the
    ledger. ``spent`` is the report's ε, ``None`` where it states no bound
    (its note says why). The bars are the ledger's charges of that unit in
    the total's relation: an add/remove charge counts twice under
    ``replace`` and ``values``; a charge with no conversion is left out.
    """
    from dp_beam.accounting.relations import factor

    charged = defaultdict(dict)  # unit -> transform -> (ε, relation)
    for e in ledger:
        if e.get("epsilon") is not None:
            t = charged[e["unit"]]
            relation = e.get("relation") or "add/remove"
            # keys of one transform compose in parallel: the maximum, not the sum
            eps = max(t.get(e["transform"], (0.0, relation))[0], float(e["epsilon"]))
            t[e["transform"]] = (eps, relation)
    final = {}
    for r in reports:  # accumulating reports: the last one per total is the final one
        final[(r["unit"], r.get("relation") or "add/remove")] = r
    totals = set(final) or {(unit, rel) for unit, t in charged.items() for _, rel in t.values()}

    def bars(unit, relation):
        out = {}
        for name, (eps, rel) in charged.get(unit, {}).items():
            k = factor(rel, relation)
            if k is not None:
                out[name] = k * eps
        return out

    order = {"add/remove": 0, "replace": 1, "values": 2}
    out = {}
    for unit, relation in sorted(totals, key=lambda ur: (ur[0], order.get(ur[1], 3), ur[1])):
        r = final.get((unit, relation))
        by_transform = bars(unit, relation)
        if r is not None:
            spent = r.get("epsilon")
        else:
            mixed = any(factor(rel, relation) is None for _, rel in charged[unit].values())
            spent = None if mixed else sum(by_transform.values())
        out[(unit, relation)] = (spent, r.get("budget_epsilon") if r else None, by_transform)
    return out


def _utc(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def render_png(streams, spent, consistent=frozenset(), zoom=72, max_streams=12):
    """PNG bytes: per stream the whole series and its last ``zoom`` steps, then the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import numpy as np

    from dp_beam.mechanisms.postprocess import isotonic_increasing

    shown = list(streams.items())[:max_streams]
    rows = len(shown) + 1
    budget_height = 0.5 + 0.35 * max(1, len(spent))
    heights = [3.2] * len(shown) + [budget_height]
    fig, axes = plt.subplots(rows, 2, figsize=(13, sum(heights)), squeeze=False,
                             gridspec_kw={"width_ratios": [2.2, 1], "height_ratios": heights})
    for (transform, key_json), recs in shown:
        row = axes[shown.index(((transform, key_json), recs))]
        x = np.array([_utc(r["window_end"]) for r in recs])
        v = np.array([float(r["value"]) for r in recs])
        ci = np.array([float(r["ci95"]) for r in recs])
        iso = isotonic_increasing(v) if transform in consistent else None
        title = transform or "release"
        if key_json != "null":
            title += f" — key {json.loads(key_json)}"
        for ax, sl, sub in ((row[0], slice(None), f"{len(recs)} steps"),
                            (row[1], slice(-zoom, None), f"last {min(zoom, len(recs))} steps")):
            ax.fill_between(x[sl], (v - ci)[sl], (v + ci)[sl], step="post", color="tab:blue",
                            alpha=0.25, linewidth=0, label="95 % band")
            ax.step(x[sl], v[sl], where="post", color="tab:blue", linewidth=1.0,
                    label=f"private release ({recs[-1]['mechanism']})")
            if iso is not None:
                ax.step(x[sl], iso[sl], where="post", color="tab:red", linewidth=1.0,
                        linestyle="--", label="consistent (isotonic) version")
            locator = mdates.AutoDateLocator(minticks=3, maxticks=6)
            ax.xaxis.set_major_locator(locator)
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{title} ({sub})", fontsize=9)
        row[0].legend(loc="upper left", fontsize=7)
    budget_ax = axes[-1, 0]
    axes[-1, 1].axis("off")
    units = list(spent)
    for i, unit in enumerate(units):
        total, budget, by_transform = spent[unit]
        left = 0.0
        for j, (name, eps) in enumerate(sorted(by_transform.items())):
            budget_ax.barh(i, eps, left=left, color=plt.cm.Set2(j % 8), edgecolor="white",
                           label=name if i == 0 else None)
            left += eps
        if budget is not None:
            budget_ax.plot([budget, budget], [i - 0.4, i + 0.4], color="black", linewidth=2,
                           label="budget" if i == 0 else None)
        budget_ax.text(max(left, budget or 0) * 1.01, i,
                       (f" ε spent {_num(total)}" if total is not None else " ε unbounded")
                       + (f" of {_num(budget)}" if budget else ""),
                       va="center", fontsize=8)
    budget_ax.set_yticks(range(len(units)), [f"{u}-level, {rel}" for u, rel in units])
    budget_ax.set_xlabel("ε")
    budget_ax.set_title("privacy budget spent per unit and neighbour relation "
                        "(bars: ε per transform in that relation)", fontsize=9)
    if units:
        budget_ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7)
        budget_ax.set_xlim(0, max(max(t if t is not None else sum(by.values()), b or 0)
                                  for t, b, by in spent.values()) * 1.3 or 1)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def render_html(out_dir, png, streams, ledger, spent, consistent) -> str:
    esc = html.escape
    stream_rows = []
    for (transform, key_json), recs in streams.items():
        last = recs[-1]
        stream_rows.append(
            "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
                transform, json.loads(key_json), len(recs),
                f"{_utc(recs[0]['window_start']):%Y-%m-%d %H:%M}",
                f"{_utc(last['window_end']):%Y-%m-%d %H:%M}",
                f"{last['value']:.6g} ± {last['ci95']:.3g}", last["mechanism"],
                "yes" if transform in consistent else "")) + "</tr>")
    ledger_rows = []
    for e in ledger:
        ledger_rows.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
            e.get("transform"), e.get("unit"), e.get("key"), e.get("relation") or "add/remove",
            e.get("neighbours"), _num(e.get("epsilon")), _num(e.get("delta")), _num(e.get("rho")),
            e.get("mechanism"), e.get("noise"))) + "</tr>")
    budget_rows = ["<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in (
        unit, relation, _num(total) if total is not None else "unbounded", _num(budget),
        _num(budget - total) if budget is not None and total is not None else "-")) + "</tr>"
        for (unit, relation), (total, budget, _) in spent.items()]
    img = base64.b64encode(png).decode("ascii")

    def table(header, rows):
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        return f"<table><tr>{head}</tr>{''.join(rows)}</table>"

    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dp_beam report: {esc(out_dir)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>dp_beam report</h1>
<p>Outputs in <code>{esc(out_dir)}</code>. Each released value is a differentially private
running total; the band is its exact 95 % interval, which depends only on public parameters.
Consistent (isotonic) versions are free post-processing of the releases.</p>
<h2>Released series</h2>
{table(("transform", "key", "steps", "first window start (UTC)", "last window end (UTC)",
        "last value ± 95 %", "mechanism", "consistent"), stream_rows)}
<img alt="released series and privacy budget" src="data:image/png;base64,{img}">
<h2>Privacy budget per unit and neighbour relation</h2>
{table(("unit", "relation", "ε spent", "budget ε", "remaining ε"), budget_rows)}
<h2>Ledger</h2>
{table(("transform", "unit", "key", "relation", "neighbours", "ε", "δ", "ρ", "mechanism",
        "noise"), ledger_rows)}
</body></html>
"""


def _write(path, data: bytes):
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(path) as fh:
            fh.write(data)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)


def cmd_report(args):
    out_dir = args.out_dir.rstrip("/") if "://" in args.out_dir else args.out_dir
    streams, ledger, reports = load_outputs(out_dir)
    skipped = other_records(out_dir)
    if not streams:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(skipped.items()))
        raise CliError(f"no plottable releases in {out_dir} (found {kinds}); "
                       "model records are read with dp_beam.records_erm")
    if args.counts is not None:
        counts = {c.strip() for c in args.counts.split(",") if c.strip()}
        unknown = counts - {t for t, _ in streams}
        if unknown:
            raise CliError(f"--counts names no released transform: {', '.join(sorted(unknown))}")
    else:
        counts = count_like_transforms(ledger)
    consistent = counts if args.consistent else set()
    spent = spent_per_unit(ledger, reports)
    png = render_png(streams, spent, consistent, max_streams=args.max_streams)
    dest = args.dest or out_dir
    png_path, html_path = _join(dest, "report.png"), _join(dest, "report.html")
    _write(png_path, png)
    _write(html_path, render_html(out_dir, png, streams, ledger, spent, consistent).encode())
    if len(streams) > args.max_streams:
        _LOG.warning("plotted %d of %d streams (--max-streams); the HTML table lists all",
                     args.max_streams, len(streams))
    for kind, n in sorted(skipped.items()):
        _LOG.warning("not plotted: %d %s records (no scalar running value)", n, kind)
    print(f"report: {html_path}\nplot: {png_path}")
    return 0


# --------------------------------------------------------------------------- main

def make_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="more logging (-vv: everything) and tracebacks on errors")
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common],
        description="Run dp_beam jobs, show their privacy plan, and render their outputs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("jobs", parents=[common], help="list the jobs in pipelines/")
    p.set_defaults(func=cmd_jobs)

    job_help = ("a job of the pipelines package (see `dp-beam jobs`); everything after it "
                "goes to the job: its own options and Beam pipeline options "
                "(`dp-beam run JOB --help` lists the job's)")
    p = sub.add_parser("run", parents=[common], help="run a job",
                       description="Run a job. Beam options pass through, e.g. --runner "
                                   "PortableRunner --job_endpoint HOST:PORT.")
    p.add_argument("job", metavar="JOB", help=job_help)
    p.add_argument("job_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("plan", parents=[common], help="print a job's privacy plan; runs nothing",
                       description="Construct a job without running it and print each "
                                   "transform's charge and the total per privacy unit against "
                                   "the budget.")
    p.add_argument("job", metavar="JOB", help=job_help)
    p.add_argument("job_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("report", parents=[common], help="render a run's outputs as PNG and HTML",
                       description="Read releases*.jsonl, ledger*.jsonl and report*.jsonl of "
                                   "OUT_DIR and write report.png and a self-contained "
                                   "report.html (the PNG embedded).")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the job's --output (local or gs://)")
    p.add_argument("--consistent", action="store_true",
                   help="also draw the isotonic (non-decreasing) fit of count series "
                        "(free post-processing)")
    p.add_argument("--counts", default=None, metavar="LABEL[,LABEL]",
                   help="which transforms are counts for --consistent (default: those whose "
                        "ledger shows a per-event bound of 1)")
    p.add_argument("--dest", default=None, help="folder for report.png/.html (default: OUT_DIR)")
    p.add_argument("--max-streams", type=int, default=12,
                   help="plot at most this many streams (default 12)")
    p.set_defaults(func=cmd_report)
    return parser


def _pop_verbose(job_args):
    """``--verbose``/``-v`` after JOB are meant for dp-beam, not the job or Beam."""
    kept, n = [], 0
    for a in job_args:
        if a in ("-v", "--verbose"):
            n += 1
        elif re.fullmatch(r"-v+", a):
            n += len(a) - 1
        else:
            kept.append(a)
    return kept, n


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    verbosity = getattr(args, "verbose", 0) or 0
    if hasattr(args, "job_args"):
        args.job_args, extra = _pop_verbose(args.job_args)
        verbosity += extra
    configure_logging(verbosity)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # the one-line report is the point of a CLI
        if verbosity:
            traceback.print_exc()
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
