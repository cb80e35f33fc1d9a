"""A run's JSON-lines outputs read back and drawn: ``dp-beam report`` and the jobs' plots.

One implementation for both: :func:`load_outputs` reads releases, models,
ledger and accounting reports of an output folder (local or any Beam
filesystem, per-bundle files of a streaming run included),
:func:`series_of` groups releases into streams, :func:`budget_rows` states
each privacy total exactly as the accounting report does, and
:func:`plot_series` / :func:`series_figure` / :func:`render_html` draw them.

The budget panel shows only what ``report*.jsonl`` says: a total the
accounting could not bound is shown as "no bound" with the report's reason,
never as a number, and the bars of a bounded total are the summands of the
report's ε (each transform as it enters that total: keys in parallel, group
privacy, relation conversions; :func:`dp_beam.accounting.compose.charges_by_transform`),
so they add up to the "ε spent" printed beside them. Numbers are rounded for
display only (:mod:`dp_beam.accounting.display`).

matplotlib is imported only when drawing, so reading needs neither the
``plot`` extra nor a display.
"""

import base64
import html
import io
import json
import math
import os
import re
from collections import OrderedDict, defaultdict
from datetime import datetime, timezone
from typing import AbstractSet, Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from dp_beam.accounting.display import fmt

__all__ = ["budget_rows", "BudgetRow", "count_like_transforms", "display_range", "final_reports",
           "is_mean", "join", "load_outputs", "MEAN_PREFIX", "MODEL_RECORDS", "models_of",
           "Outputs", "parse_bounds", "plot_series", "read_jsonl", "RELEASE_FILES", "render_html",
           "ReportError", "series_figure", "series_of", "SERIES_RECORDS", "spent_text",
           "status_text", "value_label", "write_bytes", "write_report", "ZOOM_STEPS"]

#: Records that carry a running value with its noise (``value``, ``ci95``).
SERIES_RECORDS = ("Release", "MeanRelease")
#: Released models of the ERM transforms (weights, not a running value).
MODEL_RECORDS = ("ModelRecord",)
#: Files a job's output folder may hold releases in (``streaming_erm`` writes models.jsonl).
RELEASE_FILES = ("releases*.jsonl", "models*.jsonl")
#: Steps enlarged beside each whole series: over a long stream the band is thinner than the line.
ZOOM_STEPS = 72
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


def _utc(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


# --------------------------------------------------------------------------- budget

class BudgetRow(NamedTuple):
    """One privacy total of a run (per unit and neighbour relation), as its report states it.

    ``spent`` is the report's ε (basic composition; ``None``: no bound, see
    ``note``), ``bars`` its summands per transform (``None`` when the total
    has no bound or the split cannot be recovered), ``tight`` the tightest ε
    at the budget's δ and ``method`` its route, ``remaining`` the report's
    remaining ε (budget minus ``tight``).
    """
    unit: str
    relation: str
    spent: Optional[float]
    tight: Optional[float]
    at_delta: Optional[float]
    method: str
    budget: Optional[float]
    remaining: Optional[float]
    within: Optional[bool]
    bars: Optional["OrderedDict"]
    transforms: tuple
    note: str


_DECLARED = re.compile(r"over at most (\d+) events per user \(declared events_per_user\)")
_RELATION_ORDER = {"add/remove": 0, "replace": 1, "values": 2}


def _entry(d):
    """A :class:`~dp_beam.records.LedgerEntry` from its JSON form (hashable: lists → tuples).

    A ledger line is an object; a report's ``lines`` hold the same entries as
    arrays in field order.
    """
    from dp_beam.records import LedgerEntry

    def frozen(v):
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    if isinstance(d, list):
        return LedgerEntry(*(frozen(v) for v in d[:len(LedgerEntry._fields)]))
    fields = LedgerEntry._fields
    return LedgerEntry(**{k: frozen(v) for k, v in d.items() if k in fields})


def final_reports(reports: Iterable[Dict[str, Any]]) -> "OrderedDict":
    """The final report per ``(unit, relation)``: the one composed from the most ledger lines.

    ``CombineAccounting`` re-emits accumulating reports as streams open; a
    batch run's last is its final one, and a streaming run's per-bundle files
    are read in path order, so the most complete report is taken (ties: the
    last read). Reports without ``relation`` (schema 1) are add/remove ones.
    """
    final = {}
    for r in reports:
        k = (r["unit"], r.get("relation") or "add/remove")
        if k not in final or len(r.get("lines") or ()) >= len(final[k].get("lines") or ()):
            final[k] = r
    order = sorted(final, key=lambda ur: (ur[0] != "event", _RELATION_ORDER.get(ur[1], 3), ur[1]))
    return OrderedDict((k, final[k]) for k in order)


def budget_rows(ledger: Iterable[Dict[str, Any]],
                reports: Iterable[Dict[str, Any]]) -> List[BudgetRow]:
    """One :class:`BudgetRow` per final accounting report; from the ledger alone without reports.

    Without ``report*.jsonl`` the ledger is composed here
    (:func:`dp_beam.accounting.compose`, no budget), which is what the
    report would have said.
    """
    from dp_beam.accounting import compose
    from dp_beam.accounting.compose import charges_by_transform
    from dp_beam.records import to_json

    if not reports:
        if not ledger:
            return []
        reports = [to_json(r) for r in compose([_entry(e) for e in ledger])]
    rows = []
    for (unit, relation), r in final_reports(reports).items():
        spent, bars = r.get("epsilon"), None
        note = r.get("note") or ""
        if spent is not None:
            m = _DECLARED.search(note)
            lines = [_entry(e) for e in r.get("lines") or ()]
            split = charges_by_transform(lines, unit, relation,
                                         int(m.group(1)) if m else None) if lines else None
            if split is not None and math.isclose(sum(split.values()), spent, rel_tol=1e-9,
                                                  abs_tol=1e-12):
                bars = OrderedDict(split)
            elif lines or spent:
                note = (note + "; " if note else "") + (
                    "the split per transform could not be recovered from the report")
        budget = r.get("budget_epsilon")
        rows.append(BudgetRow(
            unit=unit, relation=relation, spent=spent, tight=r.get("epsilon_at_delta"),
            at_delta=r.get("at_delta"), method=r.get("method") or "", budget=budget,
            remaining=r.get("remaining_epsilon"),
            within=(r.get("within_budget") if budget is not None or r.get("budget_rho")
                    is not None else None),
            bars=bars, transforms=tuple(r.get("transforms") or ()), note=note))
    return rows


def spent_text(row: BudgetRow) -> str:
    """What the panel prints beside a total: the sum of its bars, or why there is none."""
    if row.spent is None:
        return "no bound (see the note)"
    text = f"ε spent {fmt(row.spent)}"
    if row.budget is not None:
        text += f" of {fmt(row.budget)}"
    if row.tight is not None and row.tight < row.spent * (1 - 1e-9):
        text += f"; tightest at δ={fmt(row.at_delta)}: {fmt(row.tight)}"
    return text


def status_text(row: BudgetRow) -> str:
    if row.spent is None:
        return "no bound" + (" (not within budget)" if row.within is False else "")
    if row.within is None:
        return "not budgeted"
    return "within" if row.within else "OVER"


# --------------------------------------------------------------------------- drawing

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed (CI, containers, remote workers)
    import matplotlib.pyplot as plt

    return plt


def _date_axis(ax, show_offset=True):
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=3, maxticks=6)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=show_offset))


def display_range(records: Sequence[Dict[str, Any]],
                  bounds: Optional[Sequence[float]] = None) -> Optional[Tuple[float, float]]:
    """``(low, high)`` of the y-axis of a mean, or ``None`` (no clipping) for other series.

    ``bounds`` (the mean's declared ``[lower, upper]``) when given; else the
    range of the values after the first tenth of the steps, widened by a
    tenth: the first releases of a mean rest on few samples and their noise
    would flatten the rest of the year.
    """
    if bounds is not None:
        return float(bounds[0]), float(bounds[1])
    if not is_mean(records) or len(records) < 2:
        return None
    values = [float(r["value"]) for r in records[len(records) // 10:]
              if r.get("value") is not None and math.isfinite(float(r["value"]))]
    if not values:
        return None
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or max(abs(hi), 1.0) * 0.1
    return lo - pad, hi + pad


def _draw_series(ax, recs, sl, *, truth=None, iso=None, clip=None, ylabel="", title="",
                 legend=False):
    import numpy as np

    x = np.array([_utc(r["window_end"]) for r in recs], dtype=object)[sl]
    v = np.array([float(r["value"]) for r in recs])[sl]
    ci = np.array([float(r["ci95"]) for r in recs])[sl]
    ax.fill_between(x, v - ci, v + ci, step="post", color="tab:blue", alpha=0.25, linewidth=0,
                    label=f"95 % band (± {fmt(float(recs[-1]['ci95']), 3)} at the last step)",
                    zorder=1)
    shaded = False
    for xi, xe, r in zip(x, list(x[1:]) + [x[-1]], recs[sl]):
        if r.get("record") == "MeanRelease" and not r.get("diverse", True):
            ax.axvspan(xi, xe, color="0.88", linewidth=0, zorder=0,
                       label=None if shaded else "diversity flag false (no accuracy guarantee)")
            shaded = True
    if iso is not None:
        # Beneath the release and dashed: the fit must not hide what was released.
        ax.step(x, np.asarray(iso)[sl], where="post", color="tab:red", linewidth=1.6,
                linestyle=(0, (4, 3)), alpha=0.8, label="consistent (isotonic) fit", zorder=2)
    ax.step(x, v, where="post", color="tab:blue", linewidth=1.0, zorder=3,
            label=f"private release ({recs[-1]['mechanism']})")
    if truth:
        start = x[0] if len(x) else None
        kept = [(t, y) for t, y in truth if start is None or _utc(t) >= start]
        if kept:
            ax.step([_utc(t) for t, _ in kept], [y for _, y in kept], where="post",
                    color="black", linewidth=0.8, linestyle="--", zorder=4,
                    label="non-private truth (public demo data)")
    if clip is not None:
        ax.set_ylim(*clip)
    _date_axis(ax)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.grid(True, alpha=0.3)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlabel("end of step (UTC)", fontsize=8)
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(loc="upper left", fontsize=7)


def _budget_panel(ax, rows: List[BudgetRow]):
    """Stacked bars per total, one colour per transform over all rows, every transform in the legend."""
    plt = _pyplot()
    names = []
    for row in rows:
        for name in (row.bars or {}):
            if name not in names:
                names.append(name)
    colour = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
    handles = OrderedDict()
    widest = max([sum((row.bars or {}).values()) for row in rows]
                 + [row.budget or 0 for row in rows] + [1e-12])
    for i, row in enumerate(rows):
        left = 0.0
        for name, eps in (row.bars or {}).items():
            handles[name] = ax.barh(i, eps, left=left, color=colour[name], edgecolor="white",
                                    label=name)
            left += eps
        if row.budget is not None:
            handles["budget"] = ax.plot([row.budget] * 2, [i - 0.4, i + 0.4], color="black",
                                        linewidth=2)[0]
        ax.text(max(left, row.budget or 0) + 0.01 * widest, i, " " + spent_text(row),
                va="center", fontsize=8, color="black" if row.spent is not None else "tab:red")
    ax.set_yticks(range(len(rows)), [f"{r.unit}-level, {r.relation}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ε")
    ax.set_xlim(0, widest * 1.6)
    ax.set_title("privacy budget per unit and neighbour relation (bars: each transform's ε as "
                 "it enters that total; they add up to the ε spent)", fontsize=9)
    if handles:
        ax.legend(list(handles.values()), list(handles), loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)


def _draw_models(ax, models, title, top=6):
    """Released coefficients of one ERM stream against ``t``, the ``top`` largest at the end.

    ``t`` (points consumed when the model was released) is public and spreads
    the models out: a step's window may complete many blocks.
    """
    import numpy as np

    def flat(m):
        w = m.get("weights")
        if w and isinstance(w[0], list):
            return [x for row in w for x in row]
        return list(w or [])

    rows = [flat(m) for m in models]
    width = max(len(r) for r in rows)
    W = np.array([r + [np.nan] * (width - len(r)) for r in rows], dtype=float)
    x = [m.get("t") or 0 for m in models]
    order = np.argsort(-np.abs(np.nan_to_num(W[-1])))[:top]
    for j in order:
        ax.plot(x, W[:, j], "o-", ms=2.5, linewidth=0.9, label=f"weight {j}")
    ax.axhline(0.0, color="0.6", linewidth=0.6)
    ax.grid(True, alpha=0.3)
    ax.set_ylabel("released coefficient", fontsize=8)
    ax.set_xlabel("t: points the stream had consumed when the model was released", fontsize=8)
    ax.set_title(f"{title} ({len(models)} models; the {len(order)} largest weights of the last)",
                 fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)


def plot_series(streams: Mapping[Any, Sequence[Any]], out: Optional[str] = None, *, dpi: int = 100,
                **kw: Any) -> bytes:
    """PNG bytes of :func:`series_figure` (written to ``out``, a path, when given)."""
    plt = _pyplot()
    fig = series_figure(streams, **kw)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    png = buf.getvalue()
    if out is not None:
        write_bytes(out, png)
    return png


def series_figure(streams: Mapping[Any, Sequence[Any]], *,
                  truth: Optional[Mapping[str, Sequence[Tuple[Any, float]]]] = None,
                  titles: Optional[Mapping[str, str]] = None,
                  consistent: AbstractSet[str] = frozenset(),
                  counts: AbstractSet[str] = frozenset(),
                  bounds: Optional[Mapping[str, Tuple[float, float]]] = None,
                  rows: Optional[List[BudgetRow]] = None,
                  models: Optional[Mapping[str, Sequence[Any]]] = None,
                  ylabels: Optional[Mapping[str, str]] = None, zoom: int = ZOOM_STEPS,
                  max_streams: int = 12) -> Any:
    """A matplotlib figure: released series (whole and last ``zoom`` steps), models, budget.

    ``streams`` as from :func:`series_of`; ``truth`` maps a transform to
    ``[(window_end, value), ...]`` (public demo data only: the truth is not
    private); ``titles`` a transform to a panel title; ``consistent`` the
    transforms whose isotonic fit is drawn; ``counts`` those labelled as
    counts; ``bounds`` a transform to the ``(lower, upper)`` its y-axis is
    clipped to (means: see :func:`display_range`); ``ylabels`` a transform
    to its y-axis label (default: :func:`value_label`); ``rows`` the
    :class:`BudgetRow` list of the budget panel (``None``: no panel);
    ``models`` as from :func:`models_of`. One row of panels per stream
    (the zoom panel only when the series is longer than ``zoom``), per
    model stream, and the budget panel last.
    """
    from dp_beam.mechanisms.counting.postprocess import isotonic_increasing

    plt = _pyplot()
    truth, titles, bounds, ylabels = truth or {}, titles or {}, bounds or {}, ylabels or {}
    shown = list(streams.items())[:max_streams]
    model_items = list((models or {}).items())
    heights = ([3.0] * len(shown) + [3.0] * len(model_items)
               + ([0.9 + 0.45 * max(1, len(rows))] if rows is not None else []))
    if not heights:
        raise ReportError("nothing to plot: no released series, models or budget")
    fig, axes = plt.subplots(len(heights), 2, figsize=(14, sum(heights) + 0.3), squeeze=False,
                             gridspec_kw={"width_ratios": [2.2, 1], "height_ratios": heights})
    i = 0
    for (transform, key_json), recs in shown:
        base = transform.split("[", 1)[0]
        title = titles.get(transform, transform or "release")
        if key_json != "null":
            title += f" — key {json.loads(key_json)}"
        iso = ([float(y) for y in isotonic_increasing([float(r["value"]) for r in recs])]
               if base in consistent else None)
        clip = display_range(recs, bounds.get(base) or bounds.get(transform))
        common = dict(truth=truth.get(transform), iso=iso, clip=clip,
                      ylabel=ylabels.get(transform) or value_label(transform, recs, counts))
        _draw_series(axes[i, 0], recs, slice(None), title=f"{title} ({len(recs)} steps)",
                     legend=True, **common)
        if len(recs) > zoom:
            _draw_series(axes[i, 1], recs, slice(-zoom, None), title=f"last {zoom} steps",
                         **common)
        else:
            axes[i, 1].axis("off")  # the whole series is already that short
        i += 1
    for (transform, key_json), ms in model_items:
        title = transform + ("" if key_json == "null" else f" — key {json.loads(key_json)}")
        _draw_models(axes[i, 0], ms, title)
        axes[i, 1].axis("off")
        i += 1
    if rows is not None:
        axes[i, 1].axis("off")
        if rows:
            _budget_panel(axes[i, 0], rows)
        else:
            axes[i, 0].axis("off")
            axes[i, 0].text(0, 0.5, "no ledger or accounting report in this folder", fontsize=9)
    fig.tight_layout()
    return fig


def render_html(out_dir: str, png: bytes, outputs: Outputs, rows: List[BudgetRow],
                consistent: AbstractSet[str]) -> str:
    """A self-contained page: the series and models tables, the PNG, the budget and the ledger."""
    esc = html.escape

    def table(header, body):
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        return f"<table><tr>{head}</tr>{''.join(body)}</table>"

    def tr(cells):
        return "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>"

    stream_rows = []
    for (transform, key_json), recs in outputs.streams.items():
        last = recs[-1]
        stream_rows.append(tr((
            transform, json.loads(key_json), len(recs),
            f"{_utc(recs[0]['window_start']):%Y-%m-%d %H:%M}",
            f"{_utc(last['window_end']):%Y-%m-%d %H:%M}",
            f"{fmt(float(last['value']), 6)} ± {fmt(float(last['ci95']), 3)}", last["mechanism"],
            "yes" if transform.split("[", 1)[0] in consistent else "")))
    model_rows = []
    for (transform, key_json), ms in outputs.models.items():
        last = ms[-1]
        kinds = defaultdict(int)
        for m in ms:
            kinds[m.get("kind")] += 1
        model_rows.append(tr((
            transform, json.loads(key_json), len(ms),
            ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: str(kv[0]))),
            last.get("t"), last.get("data_window"), fmt(last.get("noise_std"), 4),
            f"{_utc(last['window_end']):%Y-%m-%d %H:%M}")))
    budget = [tr((r.unit, r.relation, fmt(r.spent, none="no bound"),
                  "" if r.tight is None or r.spent is None or r.tight >= r.spent * (1 - 1e-9)
                  else f"{fmt(r.tight)} at δ={fmt(r.at_delta)} ({r.method})",
                  fmt(r.budget), fmt(r.remaining, scale=r.budget), status_text(r),
                  ", ".join(f"{n}: {fmt(e)}" for n, e in r.bars.items()) if r.bars else "",
                  r.note)) for r in rows]
    ledger = [tr((e.get("transform"), e.get("unit"), e.get("key"),
                  e.get("relation") or "add/remove", e.get("neighbours"), fmt(e.get("epsilon")),
                  fmt(e.get("delta")), fmt(e.get("rho")), e.get("max_contributions") or "",
                  e.get("mechanism"), e.get("noise"))) for e in outputs.ledger]
    img = base64.b64encode(png).decode("ascii")
    models = ("" if not model_rows else
              "<h2>Released models</h2>\n" + table(
                  ("transform", "key", "models", "kinds", "last t", "last data window",
                   "noise std", "last released (UTC)"), model_rows))
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
running statistic; the band is its 95 % interval, which depends only on public parameters.
Consistent (isotonic) fits are free post-processing of the releases.</p>
<h2>Released series</h2>
{table(("transform", "key", "steps", "first window start (UTC)", "last window end (UTC)",
        "last value ± 95 %", "mechanism", "consistent"), stream_rows)}
{models}
<img alt="released series and privacy budget" src="data:image/png;base64,{img}">
<h2>Privacy budget per unit and neighbour relation</h2>
<p>From the run's accounting reports. "ε spent" is the sum of the per-transform charges as they
enter each total; a total the accounting cannot bound says "no bound", with the reason.</p>
{table(("unit", "relation", "ε spent", "tightest ε", "budget ε", "remaining ε", "status",
        "per transform", "note"), budget)}
<h2>Ledger</h2>
{table(("transform", "unit", "key", "relation", "neighbours", "ε", "δ", "ρ",
        "max per user", "mechanism", "noise"), ledger)}
</body></html>
"""


def parse_bounds(items: Optional[Iterable[str]]) -> Dict[str, tuple]:
    """``["LABEL=LOWER,UPPER", ...]`` → ``{label: (lower, upper)}``; ``ValueError`` naming the item."""
    out = {}
    for item in items or ():
        label, sep, rest = item.rpartition("=")
        parts = rest.split(",")
        try:
            lo, hi = (float(p) for p in parts)
        except ValueError:
            lo = hi = None
        if not sep or not label or len(parts) != 2 or lo is None or not lo < hi:
            raise ReportError(f"--bounds takes LABEL=LOWER,UPPER with LOWER < UPPER, "
                              f"got {item!r}")
        out[label] = (lo, hi)
    return out


def write_report(out_dir: str, dest: Optional[str] = None, consistent: bool = False,
                 counts: Optional[AbstractSet[str]] = None,
                 bounds: Optional[Mapping[str, Tuple[float, float]]] = None,
                 max_streams: int = 12) -> Tuple[str, str, List[str]]:
    """Reads ``out_dir`` and writes ``report.png`` and ``report.html`` to ``dest`` (default ``out_dir``).

    Returns ``(html_path, png_path, warnings)``; ``warnings`` are lines worth
    telling the user (series not plotted, unknown record types).
    """
    out_dir = out_dir.rstrip("/") if "://" in out_dir else out_dir
    outputs = load_outputs(out_dir)
    if not outputs.streams and not outputs.models:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(outputs.other.items()))
        raise ReportError(f"no plottable releases in {out_dir} (found {kinds})")
    released = {t.split("[", 1)[0] for t, _ in outputs.streams}
    if counts is not None:
        unknown = set(counts) - released
        if unknown:
            raise ReportError("--counts names no released transform: "
                              + ", ".join(sorted(unknown)))
        counts = set(counts)
    else:
        counts = count_like_transforms(outputs.ledger) & released
    bounds = dict(bounds or {})
    unknown = set(bounds) - released - {t for t, _ in outputs.streams}
    if unknown:
        raise ReportError("--bounds names no released transform: " + ", ".join(sorted(unknown)))
    fitted = counts if consistent else set()
    rows = budget_rows(outputs.ledger, outputs.reports)
    png = plot_series(outputs.streams, consistent=fitted, counts=counts, bounds=bounds, rows=rows,
                      models=outputs.models, max_streams=max_streams)
    dest = dest or out_dir
    png_path, html_path = join(dest, "report.png"), join(dest, "report.html")
    write_bytes(png_path, png)
    write_bytes(html_path, render_html(out_dir, png, outputs, rows, fitted).encode("utf-8"))
    warnings = []
    if len(outputs.streams) > max_streams:
        warnings.append(f"plotted {max_streams} of {len(outputs.streams)} streams "
                        "(--max-streams); the HTML table lists all")
    for kind, n in sorted(outputs.other.items()):
        warnings.append(f"not plotted: {n} {kind} records (no running value)")
    return html_path, png_path, warnings
