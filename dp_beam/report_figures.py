"""The report's figure: released series (whole and zoomed), model streams, the budget panel.

matplotlib is imported only when drawing, so reading needs neither the
``plot`` extra nor a display.
"""

import io
import json
import math
from collections import OrderedDict
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from dp_beam.accounting.display import fmt
from dp_beam.report_budget import BudgetRow, spent_text
from dp_beam.report_reading import ReportError, is_mean, utc, value_label, write_bytes

__all__ = ["display_range", "plot_series", "series_figure", "ZOOM_STEPS"]

#: Steps enlarged beside each whole series: over a long stream the band is thinner than the line.
ZOOM_STEPS = 72


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

    x = np.array([utc(r["window_end"]) for r in recs], dtype=object)[sl]
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
        kept = [(t, y) for t, y in truth if start is None or utc(t) >= start]
        if kept:
            ax.step([utc(t) for t, _ in kept], [y for _, y in kept], where="post",
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
    plt = _pyplot()
    truth, titles, bounds, ylabels = truth or {}, titles or {}, bounds or {}, ylabels or {}
    shown = list(streams.items())[:max_streams]
    model_items = list((models or {}).items())
    fig, axes = _panel_grid(plt, len(shown), len(model_items), rows)
    i = 0
    for (transform, key_json), recs in shown:
        base = transform.split("[", 1)[0]
        _stream_panels(axes[i], recs, _keyed(titles.get(transform, transform or "release"),
                                             key_json),
                       zoom=zoom, truth=truth.get(transform), fit=base in consistent,
                       clip=display_range(recs, bounds.get(base) or bounds.get(transform)),
                       ylabel=ylabels.get(transform) or value_label(transform, recs, counts))
        i += 1
    for (transform, key_json), ms in model_items:
        _draw_models(axes[i, 0], ms, _keyed(transform, key_json))
        axes[i, 1].axis("off")
        i += 1
    if rows is not None:
        _budget_row(axes[i], rows)
    fig.tight_layout()
    return fig


def _panel_grid(plt, n_streams, n_models, rows):
    """The figure and its two columns of axes: one row per stream, per model stream, the budget."""
    heights = ([3.0] * n_streams + [3.0] * n_models
               + ([0.9 + 0.45 * max(1, len(rows))] if rows is not None else []))
    if not heights:
        raise ReportError("nothing to plot: no released series, models or budget")
    return plt.subplots(len(heights), 2, figsize=(14, sum(heights) + 0.3), squeeze=False,
                        gridspec_kw={"width_ratios": [2.2, 1], "height_ratios": heights})


def _keyed(title, key_json):
    return title if key_json == "null" else f"{title} — key {json.loads(key_json)}"


def _stream_panels(axes, recs, title, *, zoom, truth, fit, clip, ylabel):
    """The whole series on the left, its last ``zoom`` steps on the right (when longer)."""
    from dp_beam.mechanisms.counting.postprocess import isotonic_increasing

    iso = ([float(y) for y in isotonic_increasing([float(r["value"]) for r in recs])]
           if fit else None)
    common = dict(truth=truth, iso=iso, clip=clip, ylabel=ylabel)
    _draw_series(axes[0], recs, slice(None), title=f"{title} ({len(recs)} steps)", legend=True,
                 **common)
    if len(recs) > zoom:
        _draw_series(axes[1], recs, slice(-zoom, None), title=f"last {zoom} steps", **common)
    else:
        axes[1].axis("off")  # the whole series is already that short


def _budget_row(axes, rows):
    axes[1].axis("off")
    if rows:
        _budget_panel(axes[0], rows)
    else:
        axes[0].axis("off")
        axes[0].text(0, 0.5, "no ledger or accounting report in this folder", fontsize=9)
