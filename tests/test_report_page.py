"""The report's HTML page (report_page.py): tables of what was read, the PNG embedded."""

import base64

from dp_beam import report_page as page
from dp_beam.report_budget import BudgetRow
from dp_beam.report_reading import Outputs


def _outputs(models=None):
    release = dict(record="Release", transform="count", key=None, step=0, value=2.0, ci95=0.5,
                   window_start=0.0, window_end=3600.0, mechanism="tree")
    ledger = [{"transform": "count", "unit": "event", "epsilon": 0.5, "delta": 0.0, "rho": 0.1,
               "mechanism": "tree", "noise": "gaussian", "neighbours": "add/remove one event"}]
    return Outputs({("count", "null"): [release]}, models or {}, ledger, [], {})


def test_render_html_escapes_the_folder_and_embeds_the_png():
    text = page.render_html("runs/<a&b>", b"\x89PNG", _outputs(), [], {"count"})
    assert text.startswith("<!DOCTYPE html>")
    assert "<title>dp_beam report: runs/&lt;a&amp;b&gt;</title>" in text
    assert base64.b64encode(b"\x89PNG").decode("ascii") in text
    assert ("<tr><td>count</td><td>None</td><td>1</td><td>1970-01-01 00:00</td>"
            "<td>1970-01-01 01:00</td><td>2 ± 0.5</td><td>tree</td><td>yes</td></tr>") in text
    assert "Released models" not in text
    assert "body { font-family: sans-serif;" in text  # the style sheet's braces are single


def test_render_html_lists_models_budget_and_ledger():
    model = {"t": 7, "kind": "private", "data_window": [0, 7], "noise_std": 0.25,
             "window_end": 7200.0}
    row = BudgetRow("user", "add/remove", None, None, None, "", 1.0, None, False, None, (),
                    "no user-level bound")
    outputs = _outputs({("erm", "null"): [model, model]})
    text = page.render_html("out", b"", outputs, [row], set())
    assert "<h2>Released models</h2>" in text
    assert "<td>erm</td><td>None</td><td>2</td><td>2 private</td><td>7</td>" in text
    # No remaining ε without a bound: fmt shows a missing number as "-".
    assert ("<td>user</td><td>add/remove</td><td>no bound</td><td></td><td>1</td><td>-</td>"
            "<td>no bound (not within budget)</td><td></td><td>no user-level bound</td>") in text
    assert "<td>count</td><td>event</td><td>None</td><td>add/remove</td>" in text
