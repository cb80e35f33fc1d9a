"""The report's self-contained HTML page: tables of series, models, budget and ledger, the PNG."""

import base64
import html
import json
from collections import defaultdict
from typing import AbstractSet, List

from dp_beam.accounting.display import fmt
from dp_beam.report_budget import BudgetRow, status_text
from dp_beam.report_reading import Outputs, utc

__all__ = ["render_html"]


def render_html(out_dir: str, png: bytes, outputs: Outputs, rows: List[BudgetRow],
                consistent: AbstractSet[str]) -> str:
    """A self-contained page: the series and models tables, the PNG, the budget and the ledger."""
    esc = html.escape
    model_rows = _model_rows(outputs)
    models = ("" if not model_rows else
              "<h2>Released models</h2>\n" + _table(
                  ("transform", "key", "models", "kinds", "last t", "last data window",
                   "noise std", "last released (UTC)"), model_rows))
    series = _table(("transform", "key", "steps", "first window start (UTC)",
                     "last window end (UTC)", "last value ± 95 %", "mechanism", "consistent"),
                    _stream_rows(outputs, consistent))
    budget = _table(("unit", "relation", "ε spent", "tightest ε", "budget ε", "remaining ε",
                     "status", "per transform", "note"), _budget_rows(rows))
    ledger = _table(("transform", "unit", "key", "relation", "neighbours", "ε", "δ", "ρ",
                     "max per user", "mechanism", "noise"), _ledger_rows(outputs.ledger))
    img = base64.b64encode(png).decode("ascii")
    return _PAGE.format(out_dir=esc(out_dir), series=series, models=models, img=img,
                        budget=budget, ledger=ledger)


def _table(header, body):
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _tr(cells):
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def _stream_rows(outputs, consistent):
    out = []
    for (transform, key_json), recs in outputs.streams.items():
        last = recs[-1]
        out.append(_tr((
            transform, json.loads(key_json), len(recs),
            f"{utc(recs[0]['window_start']):%Y-%m-%d %H:%M}",
            f"{utc(last['window_end']):%Y-%m-%d %H:%M}",
            f"{fmt(float(last['value']), 6)} ± {fmt(float(last['ci95']), 3)}", last["mechanism"],
            "yes" if transform.split("[", 1)[0] in consistent else "")))
    return out


def _model_rows(outputs):
    out = []
    for (transform, key_json), ms in outputs.models.items():
        last = ms[-1]
        kinds = defaultdict(int)
        for m in ms:
            kinds[m.get("kind")] += 1
        out.append(_tr((
            transform, json.loads(key_json), len(ms),
            ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: str(kv[0]))),
            last.get("t"), last.get("data_window"), fmt(last.get("noise_std"), 4),
            f"{utc(last['window_end']):%Y-%m-%d %H:%M}")))
    return out


def _budget_rows(rows):
    return [_tr((r.unit, r.relation, fmt(r.spent, none="no bound"),
                 "" if r.tight is None or r.spent is None or r.tight >= r.spent * (1 - 1e-9)
                 else f"{fmt(r.tight)} at δ={fmt(r.at_delta)} ({r.method})",
                 fmt(r.budget), fmt(r.remaining, scale=r.budget), status_text(r),
                 ", ".join(f"{n}: {fmt(e)}" for n, e in r.bars.items()) if r.bars else "",
                 r.note)) for r in rows]


def _ledger_rows(ledger):
    return [_tr((e.get("transform"), e.get("unit"), e.get("key"),
                 e.get("relation") or "add/remove", e.get("neighbours"), fmt(e.get("epsilon")),
                 fmt(e.get("delta")), fmt(e.get("rho")), e.get("max_contributions") or "",
                 e.get("mechanism"), e.get("noise"))) for e in ledger]


# Filled by str.format: the braces of the style sheet are doubled.
_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dp_beam report: {out_dir}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>dp_beam report</h1>
<p>Outputs in <code>{out_dir}</code>. Each released value is a differentially private
running statistic; the band is its 95 % interval, which depends only on public parameters.
Consistent (isotonic) fits are free post-processing of the releases.</p>
<h2>Released series</h2>
{series}
{models}
<img alt="released series and privacy budget" src="data:image/png;base64,{img}">
<h2>Privacy budget per unit and neighbour relation</h2>
<p>From the run's accounting reports. "ε spent" is the sum of the per-transform charges as they
enter each total; a total the accounting cannot bound says "no bound", with the reason.</p>
{budget}
<h2>Ledger</h2>
{ledger}
</body></html>
"""
