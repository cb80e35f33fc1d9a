"""The ``dp-beam`` command: run jobs, print their privacy plan, render their outputs.

::

    dp-beam jobs                          # the jobs of the jobs folder
    dp-beam run JOB [job and Beam options]
    dp-beam plan JOB [job options]        # privacy plan table; nothing runs
    dp-beam report OUT_DIR [--consistent] # PNG + self-contained HTML of a run's outputs

A job is a module with ``main(argv)`` (runs it) and ``build_pipeline(argv)
-> (pipeline, {label: accounting}, budget)`` (constructs it without
running), in a jobs folder: ``--jobs-dir DIR``, else ``$DP_BEAM_JOBS``, else
``pipelines/`` in the current directory (the example jobs of a dp_beam
checkout; they are not installed with the library). ``JOB`` may also be the
path of a job's ``.py`` file. The folder is imported as a package named
after it, from its parent directory, as ``python -m pipelines.JOB`` does from
the repository root.

Errors are one line on stderr and a non-zero exit status; ``--verbose`` adds
the traceback and Beam's own INFO logs. Apache Beam is imported only by the
commands that need it (``--help`` does not).
"""

import argparse
import importlib
import logging
import os
import pkgutil
import re
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

if TYPE_CHECKING:  # imported lazily at run time: the command line starts before Beam loads
    from dp_beam.accounting.budget import Budget

__all__ = ["available_jobs", "CliError", "configure_logging", "DEFAULT_JOBS_DIR", "guarded",
           "hide_beam_import_noise", "job_main", "jobs_dir", "JOBS_ENV", "load_job", "main",
           "make_parser", "one_line", "plan_tables", "PROG"]

PROG = "dp-beam"
JOBS_ENV = "DP_BEAM_JOBS"
DEFAULT_JOBS_DIR = "pipelines"
_LOG = logging.getLogger("dp_beam.cli")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


# --------------------------------------------------------------------------- logging

class _BeamImportNoise(logging.Filter):
    """Drops the one warning Beam logs on every import when apitools is absent.

    ``import apache_beam`` imports ``apache_beam.io``, which tries the
    BigQuery client and logs "apitools not found, and bigquery client
    libraries are not available ..." through the root logger whenever the
    ``gcp`` extra of Beam is not installed. dp_beam uses no BigQuery, so at
    the default verbosity this line says nothing about the run; ``-v``
    shows it.
    """

    def filter(self, record):
        return not str(record.msg).startswith("apitools not found, and bigquery client")


def hide_beam_import_noise() -> None:
    """Installs :class:`_BeamImportNoise` on the root logger (once); ``-v`` removes it again."""
    root = logging.getLogger()
    if not any(isinstance(f, _BeamImportNoise) for f in root.filters):
        root.addFilter(_BeamImportNoise())


def configure_logging(verbosity: int = 0) -> None:
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
    for f in [f for f in root.filters if isinstance(f, _BeamImportNoise)]:
        root.removeFilter(f)
    if verbosity == 0:
        hide_beam_import_noise()
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    logging.getLogger("dp_beam").setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
    beam_level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.getLogger("apache_beam").setLevel(beam_level)


# --------------------------------------------------------------------------- errors

class CliError(Exception):
    """An error whose message is already the one line to show."""


_EXC_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Invalid))(: .*)?$")


def one_line(exc: BaseException) -> str:
    """One readable line for an exception.

    Errors raised inside Beam workers arrive wrapped, with the worker's whole
    traceback in the message: the last ``SomeError: ...`` line is the cause.
    """
    from dp_beam.report import ReportError  # no Beam import

    if isinstance(exc, (CliError, ReportError)):
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

def jobs_dir(override: Optional[str] = None) -> str:
    """The jobs folder: ``override``, else ``$DP_BEAM_JOBS``, else ``./pipelines``; checked."""
    path = override or os.environ.get(JOBS_ENV) or DEFAULT_JOBS_DIR
    folder = os.path.abspath(path)
    if not os.path.isdir(folder):
        source = ("--jobs-dir" if override else JOBS_ENV if os.environ.get(JOBS_ENV)
                  else "the default")
        raise CliError(f"no jobs folder {path!r} ({source}): run from the root of a dp_beam "
                       f"checkout (its jobs are in pipelines/), or name a folder of job modules "
                       f"with --jobs-dir or {JOBS_ENV}")
    if not os.path.basename(folder).isidentifier():
        raise CliError(f"the jobs folder name must be a Python identifier, got {folder!r}")
    return folder


def _package(folder) -> str:
    """Makes ``folder`` importable as a package (its parent on ``sys.path``); returns its name."""
    parent, name = os.path.split(folder)
    if not any(os.path.abspath(p or os.curdir) == parent for p in sys.path):
        sys.path.insert(0, parent)
    module = sys.modules.get(name)
    if module is not None:
        where = [os.path.abspath(p) for p in getattr(module, "__path__", [])]
        if folder not in where:
            raise CliError(f"a module named {name!r} is already imported from "
                           f"{where or getattr(module, '__file__', '?')}, not {folder}")
    return name


def _is_job(module) -> bool:
    return callable(getattr(module, "main", None)) and callable(
        getattr(module, "build_pipeline", None))


def available_jobs(folder: Optional[str] = None) -> dict:
    """``{name: module}`` of the modules of the jobs folder that are jobs (see :func:`jobs_dir`)."""
    folder = jobs_dir(folder)
    package = _package(folder)
    jobs = {}
    for info in pkgutil.iter_modules([folder]):
        module = importlib.import_module(f"{package}.{info.name}")
        if _is_job(module):
            jobs[info.name] = module
    return jobs


def load_job(name: str, folder: Optional[str] = None) -> types.ModuleType:
    """The job module ``name`` of the jobs folder, or of the ``.py`` file ``name`` names."""
    if name.endswith(".py") and os.path.isfile(name):
        folder, name = os.path.dirname(os.path.abspath(name)), os.path.basename(name)[:-3]
    folder = jobs_dir(folder)
    key = name.replace("-", "_")
    if key.endswith(".py"):
        key = os.path.basename(key)[:-3]
    if key.isidentifier() and os.path.isfile(os.path.join(folder, f"{key}.py")):
        module = importlib.import_module(f"{_package(folder)}.{key}")
        if _is_job(module):
            return module
    jobs = available_jobs(folder)
    raise CliError(f"unknown job {name!r}; available: {', '.join(sorted(jobs)) or 'none'}")


def _summary(module) -> str:
    doc = (module.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def cmd_jobs(args: argparse.Namespace) -> int:
    for name, module in sorted(available_jobs(args.jobs_dir).items()):
        print(f"{name:24s} {_summary(module)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    job = load_job(args.job, args.jobs_dir)
    job.main(list(args.job_args))
    return 0


# --------------------------------------------------------------------------- plan

def _num(x, scale=None) -> str:
    """A number for the tables, without float noise (:func:`dp_beam.accounting.display.fmt`)."""
    from dp_beam.accounting.display import fmt

    return fmt(x, scale=scale)


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def plan_tables(accountings: Union[Mapping[str, Any], Iterable[Any]],
                budget: Optional["Budget"]) -> str:
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
                     _num(r.remaining_epsilon, r.budget_epsilon),
                     _num(r.remaining_delta, r.budget_delta),
                     _num(r.remaining_rho, r.budget_rho), status))
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


def cmd_plan(args: argparse.Namespace) -> int:
    job = load_job(args.job, args.jobs_dir)
    _pipeline, accountings, budget = job.build_pipeline(list(args.job_args))
    print(plan_tables(accountings, budget))
    return 0


# --------------------------------------------------------------------------- report

def cmd_report(args: argparse.Namespace) -> int:
    from dp_beam import report

    counts = None
    if args.counts is not None:
        counts = {c.strip() for c in args.counts.split(",") if c.strip()}
    html_path, png_path, warnings = report.write_report(
        args.out_dir, dest=args.dest, consistent=args.consistent, counts=counts,
        bounds=report.parse_bounds(args.bounds), max_streams=args.max_streams)
    for line in warnings:
        _LOG.warning("%s", line)
    print(f"report: {html_path}\nplot: {png_path}")
    return 0


# --------------------------------------------------------------------------- main

def make_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="more logging (-vv: everything) and tracebacks on errors")
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common],
        description="Run dp_beam jobs, show their privacy plan, and render their outputs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    jobs = argparse.ArgumentParser(add_help=False)
    jobs.add_argument("--jobs-dir", default=None, metavar="DIR",
                      help=f"folder of job modules (default: ${JOBS_ENV}, else "
                           f"./{DEFAULT_JOBS_DIR}, the example jobs of a dp_beam checkout)")

    p = sub.add_parser("jobs", parents=[common, jobs], help="list the jobs of the jobs folder")
    p.set_defaults(func=cmd_jobs)
    _add_run_parser(sub, [common, jobs])
    _add_plan_parser(sub, [common, jobs])
    _add_report_parser(sub, [common])
    return parser


_JOB_HELP = ("a job of the jobs folder (see `dp-beam jobs`) or the path of a job's .py "
             "file; everything after it goes to the job: its own options and Beam "
             "pipeline options (`dp-beam run JOB --help` lists the job's)")


def _add_run_parser(sub, parents):
    p = sub.add_parser("run", parents=parents, help="run a job",
                       description="Run a job. Beam options pass through, e.g. --runner "
                                   "PortableRunner --job_endpoint HOST:PORT.")
    p.add_argument("job", metavar="JOB", help=_JOB_HELP)
    p.add_argument("job_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run)


def _add_plan_parser(sub, parents):
    p = sub.add_parser("plan", parents=parents,
                       help="print a job's privacy plan; runs nothing",
                       description="Construct a job without running it and print each "
                                   "transform's charge and the total per privacy unit against "
                                   "the budget.")
    p.add_argument("job", metavar="JOB", help=_JOB_HELP)
    p.add_argument("job_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_plan)


def _add_report_parser(sub, parents):
    p = sub.add_parser("report", parents=parents, help="render a run's outputs as PNG and HTML",
                       description="Read releases*.jsonl (or models*.jsonl), ledger*.jsonl and "
                                   "report*.jsonl of OUT_DIR and write report.png and a "
                                   "self-contained report.html (the PNG embedded).")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the job's --output (local or gs://)")
    p.add_argument("--consistent", action="store_true",
                   help="also draw the isotonic (non-decreasing) fit of count series "
                        "(free post-processing)")
    p.add_argument("--counts", default=None, metavar="LABEL[,LABEL]",
                   help="which transforms are counts for --consistent (default: those whose "
                        "ledger shows a per-event bound of 1)")
    p.add_argument("--dest", default=None, help="folder for report.png/.html (default: OUT_DIR)")
    p.add_argument("--bounds", action="append", default=[], metavar="LABEL=LOWER,UPPER",
                   help="clip the y-axis of a transform's series to its declared value range "
                        "(e.g. a mean's lower and upper; repeatable). Without it a mean's axis "
                        "spans its values after the first tenth of the steps")
    p.add_argument("--max-streams", type=int, default=12,
                   help="plot at most this many streams (default 12)")
    p.set_defaults(func=cmd_report)


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = make_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    verbosity = getattr(args, "verbose", 0) or 0
    if hasattr(args, "job_args"):
        args.job_args, extra = _pop_verbose(args.job_args)
        verbosity += extra
    configure_logging(verbosity)
    return guarded(args.func, args, verbosity=verbosity)


def guarded(func: Callable[..., Any], *args: Any, verbosity: int = 0, prog: str = PROG) -> int:
    """``func(*args)`` with the command line's error handling: one line, exit status 1.

    Returns ``func``'s result (0 when it returns None), 1 after an error,
    130 after Ctrl-C; ``verbosity`` > 0 prints the traceback too.
    """
    try:
        out = func(*args)
        return 0 if out is None or not isinstance(out, int) else out
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as exc:  # the one-line report is the point of a CLI
        if verbosity:
            traceback.print_exc()
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1


def job_main(main_fn: Callable[..., Any], prog: str, argv: Optional[Sequence[str]] = None) -> int:
    """What a job's ``python -m pipelines.JOB`` runs: logging as ``dp-beam``, one-line errors.

    ``-v``/``--verbose`` in ``argv`` (default ``sys.argv[1:]``) are taken
    here, as with ``dp-beam run``. Returns the exit status.
    """
    job_args, verbosity = _pop_verbose(sys.argv[1:] if argv is None else argv)
    configure_logging(verbosity)
    return guarded(main_fn, job_args, verbosity=verbosity, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
