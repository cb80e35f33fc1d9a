"""The README's privacy-accounting example runs and prints what the README says."""

import json
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _section_code(title):
    text = open(README).read()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_privacy_accounting_example(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_section_code("Privacy accounting"), "README example", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    event = next(l for l in printed if l.startswith("event "))
    user = next(l for l in printed if l.startswith("user "))
    assert float(event.split()[1]) == pytest.approx(0.202)
    assert float(user.split()[1]) == pytest.approx(0.4) and "group privacy" in user
    reports = [json.loads(l) for l in open(tmp_path / "report.jsonl")]
    final = max((r for r in reports if r["unit"] == "user"), key=lambda r: len(r["lines"]))
    assert final["epsilon"] == pytest.approx(0.4) and final["within_budget"]


def test_using_it_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_section_code("Using it"), "README example", "exec"), {})
    releases = [json.loads(l) for l in open(tmp_path / "out" / "departures.jsonl")]
    # The README states 504 releases: 3 declared carriers x 168 hours of the declared week.
    assert len(releases) == 504
    assert {(r["key"], r["step"]) for r in releases} == {
        (k, s) for k in ("AA", "B6", "UA") for s in range(376944, 376944 + 168)}
