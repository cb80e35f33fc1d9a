"""Every code block of the README runs (Python) or parses (shell) as written.

Each ```python block is executed as it stands, from an empty folder, and then
checked against what the README says it does; a block without a check must
at least run. Shell blocks are parsed with ``bash -n``; the cheap ``dp-beam``
commands (``jobs``, ``plan``) are run, and every job command line
(``dp-beam run JOB …``, ``python -m pipelines.JOB …``) is parsed by the job's
own option parser, so a README flag the job does not know fails here.
"""

import importlib
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DP_BEAM = os.path.join(os.path.dirname(sys.executable), "dp-beam")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(lang=None):
    """``[(language, code, first line number)]`` of the README's fenced blocks."""
    text = open(README).read()
    out = []
    for m in _FENCE.finditer(text):
        if lang is None or m.group(1) == lang:
            out.append((m.group(1), m.group(2), text[:m.start()].count("\n") + 1))
    return out


def _section_code(title):
    text = open(README).read()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _read(path):
    return [json.loads(l) for l in open(path) if l.strip()]


# --------------------------------------------------------------------------- Python blocks

def _check_using_it(tmp_path, printed, namespace):
    releases = _read(tmp_path / "out" / "departures.jsonl")
    # The README states 504 releases: 3 declared carriers x 168 hours of the declared week.
    assert len(releases) == 504
    assert {(r["key"], r["step"]) for r in releases} == {
        (k, s) for k in ("AA", "B6", "UA") for s in range(376944, 376944 + 168)}


def _check_real_data(tmp_path, printed, namespace):
    releases = _read(tmp_path / "out" / "origins.jsonl")
    assert len(releases) == 144  # 3 airports x 48 hours, as the README says
    assert {r["key"] for r in releases} == {"EWR", "JFK", "LGA"}
    # The README quotes the printed counters.
    assert "{'released_steps': 144, 'empty_steps': 35, 'events_used': 1785}" in printed
    assert len(namespace["flights"]) == 1785


def _check_accounting(tmp_path, printed, namespace):
    lines = printed.splitlines()
    event = next(l for l in lines if l.startswith("event "))
    user = next(l for l in lines if l.startswith("user "))
    assert float(event.split()[1]) == pytest.approx(0.202)
    assert float(user.split()[1]) == pytest.approx(0.4) and "group privacy" in user
    reports = _read(tmp_path / "report.jsonl")
    final = max((r for r in reports if r["unit"] == "user"), key=lambda r: len(r["lines"]))
    assert final["epsilon"] == pytest.approx(0.4) and final["within_budget"]


# What each block is known by (a string only it contains) and what it must have done.
CHECKS = {
    'dpb.io.WriteReleases("out/departures.jsonl")': _check_using_it,
    'dpb.io.WriteReleases("out/origins.jsonl")': _check_real_data,
    'dpb.io.WriteLedger("report.jsonl")': _check_accounting,
}


def test_every_python_block_is_checked_or_at_least_run():
    python = blocks("python")
    assert len(python) >= 3
    for marker in CHECKS:
        assert sum(marker in code for _, code, _ in python) == 1, marker


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_as_written(index, tmp_path, monkeypatch, capsys):
    _, code, line = blocks("python")[index]
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    exec(compile(code, f"README.md, block at line {line}", "exec"), namespace)
    printed = capsys.readouterr().out
    for marker, check in CHECKS.items():
        if marker in code:
            check(tmp_path, printed, namespace)


def test_the_sections_the_readme_names_hold_their_examples():
    assert "departures.jsonl" in _section_code("Using it")
    assert 'WriteLedger("report.jsonl")' in _section_code("Privacy accounting")


# --------------------------------------------------------------------------- shell blocks

def _shell_blocks():
    return [(code, line) for lang, code, line in blocks() if lang in ("", "bash", "sh")]


@pytest.mark.parametrize("index", range(len(_shell_blocks())))
def test_shell_block_parses(index):
    code, line = _shell_blocks()[index]
    proc = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
    assert proc.returncode == 0, f"README.md line {line}: {proc.stderr}"


def _commands(code):
    """Command lines of a shell block: continuations joined, comments and ``[…]`` placeholders dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for raw in joined.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", raw.split(" #", 1)[0]).strip().rstrip("&").strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


def _job_command_lines():
    found = []
    for code, line in _shell_blocks():
        for argv in _commands(code):
            if argv[:2] == ["dp-beam", "run"]:
                found.append((argv[2], argv[3:], line))
            elif argv[:2] == ["python", "-m"] and argv[2].startswith("pipelines."):
                found.append((argv[2].split(".", 1)[1], argv[3:], line))
    return found


def test_every_job_command_line_parses_with_the_job_options():
    found = _job_command_lines()
    assert {job for job, _, _ in found} >= {"continual_count", "user_mean", "streaming_erm"}
    for job, argv, line in found:
        module = importlib.import_module(f"pipelines.{job}")
        args, _beam = module.parse_args(argv)
        assert args.output, f"README.md line {line}: {job} {argv}"


@pytest.mark.parametrize("argv", [["jobs"], ["plan", "continual_count", "--epsilon", "2"]])
def test_the_cheap_dp_beam_commands_of_the_readme_run(argv):
    listed = [a for code, _ in _shell_blocks() for a in _commands(code) if a[0] == "dp-beam"]
    assert ["dp-beam", *argv] in listed
    proc = subprocess.run([DP_BEAM, *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "apitools" not in proc.stderr  # Beam's import noise is hidden by default
    assert ("continual_count" if argv == ["jobs"] else "within") in proc.stdout
