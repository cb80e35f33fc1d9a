"""A run's JSON-lines outputs read back and drawn: ``dp-beam report`` and the jobs' plots.

One implementation for both: :func:`load_outputs` reads releases, models,
ledger and accounting reports of an output folder (local or any Beam
filesystem, per-bundle files of a streaming run included),
:func:`series_of` groups releases into streams, :func:`budget_rows` states
each privacy total exactly as the accounting report does, and
:func:`plot_series` / :func:`series_figure` / :func:`render_html` draw them.

They live in sibling modules, re-exported here: :mod:`dp_beam.report_reading`
(files and records), :mod:`dp_beam.report_budget` (the budget rows),
:mod:`dp_beam.report_figures` (the PNG) and :mod:`dp_beam.report_page` (the
HTML page); this module writes the report.

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

from typing import AbstractSet, Dict, Iterable, List, Mapping, Optional, Tuple

from dp_beam.report_budget import BudgetRow, budget_rows, final_reports, spent_text, status_text
from dp_beam.report_figures import ZOOM_STEPS, display_range, plot_series, series_figure
from dp_beam.report_page import render_html
from dp_beam.report_reading import (MEAN_PREFIX, MODEL_RECORDS, RELEASE_FILES, SERIES_RECORDS,
                                    Outputs, ReportError, count_like_transforms, is_mean, join,
                                    load_outputs, models_of, read_jsonl, series_of, value_label,
                                    write_bytes)

__all__ = ["budget_rows", "BudgetRow", "count_like_transforms", "display_range", "final_reports",
           "is_mean", "join", "load_outputs", "MEAN_PREFIX", "MODEL_RECORDS", "models_of",
           "Outputs", "parse_bounds", "plot_series", "read_jsonl", "RELEASE_FILES", "render_html",
           "ReportError", "series_figure", "series_of", "SERIES_RECORDS", "spent_text",
           "status_text", "value_label", "write_bytes", "write_report", "ZOOM_STEPS"]


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
