"""Feedback on long runs: progress lines from the workers and a summary per transform.

A batch run releases nothing until all input is read (the release timers fire
after it), and then releases thousands of steps per stream; without feedback
a long run looks hung. Two pieces, both built on what Beam offers every runner:

* :class:`ReleaseProgress`, used inside the release DoFn of every transform:
  at the first release and then at most every ``DP_BEAM_PROGRESS_SECONDS``
  (default 30) seconds it logs, on the ``dp_beam.progress`` logger at INFO,
  the transform, the steps it released so far on this worker, the last step
  released (key, step, end of its window) and the events those steps used.
  The same events also go to the ``<transform>.events_used`` Beam counter.
  Logs are per worker (a distributed run logs one line per worker and
  transform); library users see them once INFO logging is on, e.g.
  ``logging.basicConfig(level=logging.INFO)``.
* :func:`summarise` / :func:`log_summary`, after a run: the ``dp_beam``
  counters of ``result.metrics()`` per transform (steps released, empty
  steps, events used, rejected elements by kind, late events), totals over
  all workers, and a check of the share of rejected input
  (:func:`check_invalid`): a run whose input was mostly invalid must not
  look like a success.

Measured on Beam 2.77: ``FnApiRunner`` (in process) reports all these
counters after ``wait_until_finish()``. ``BundleBasedDirectRunner`` (batch
and streaming) reports the counters of the per-event stages (``invalid``,
``over_contribution``) but none incremented in the release stage's timer
callbacks (``released_steps``, ``empty_steps``, ``events_used``): there the
summary lacks them, the share of invalid input cannot be checked (which
:func:`check_invalid` says), and the progress lines are the feedback.

Privacy: counts of used and rejected events are exact functions of the data,
as sensitive as the input (like every Beam counter and ``.invalid``); they
are operator feedback, not releases. Progress lines name only public things
beside them (transform labels, declared or admitted keys, step numbers).
"""

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Dict, Optional, Union

from apache_beam.metrics import Metrics
from apache_beam.runners.runner import PipelineResult

__all__ = ["check_invalid", "DEFAULT_INTERVAL", "format_summary", "INTERVAL_ENV",
           "interval_seconds", "invalid_share", "log_summary", "LOGGER", "NAMESPACE", "ORDER",
           "REJECTED", "rejected", "ReleaseProgress", "summarise", "TooManyInvalid", "WARN_SHARE"]

NAMESPACE = "dp_beam"
#: Environment variable read on the workers: seconds between progress lines.
INTERVAL_ENV = "DP_BEAM_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0
LOGGER = "dp_beam.progress"

#: Counters whose elements went to ``.invalid`` (validation, per-user caps, late drops).
REJECTED = ("invalid", "over_contribution", "over_keys", "late_dropped_events",
            "beyond_lateness_events")
#: Order in which a summary lists the counters it knows.
ORDER = ("released_steps", "empty_steps", "events_used") + REJECTED + (
    "late_deferred_events", "clamped", "clipped")


def interval_seconds(value: Optional[Union[float, str]] = None) -> float:
    """Seconds between progress lines: ``value``, else ``$DP_BEAM_PROGRESS_SECONDS``, else 30.

    Raises ``ValueError`` naming the source when it is not a number >= 0
    (0 logs every release: for tests and debugging only).
    """
    source = "interval"
    if value is None:
        text = os.environ.get(INTERVAL_ENV)
        if text is None or not text.strip():
            return DEFAULT_INTERVAL
        source = INTERVAL_ENV
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{INTERVAL_ENV} must be a number of seconds, got {text!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{source} must be a number of seconds >= 0, got {value!r}")
    return float(value)


class ReleaseProgress:
    """Rate-limited progress of one transform's release DoFn on one worker.

    Call :meth:`released` once per released step (or run of steps) and
    :meth:`report` after a run of them. The object travels with
    the pickled DoFn, so its counts start at zero on every worker; the
    interval is read on the worker (where ``DP_BEAM_PROGRESS_SECONDS`` is
    set), at the first release.

    >>> p = ReleaseProgress("hourly", interval=3600)
    >>> p.released("AA", 10, 39600.0, events=3); p.released("AA", 11, 43200.0, events=0)
    >>> p.report()
    >>> p.steps, p.events
    (2, 3)
    >>> p.released("AA", 14, 54000.0, events=4, steps=3); p.steps, p.events
    (5, 7)
    """

    def __init__(self, transform: str, interval: Optional[float] = None) -> None:
        if interval is not None:
            interval_seconds(interval)  # validates it, naming it
        self.transform = transform
        self._interval = interval
        self._used = Metrics.counter(NAMESPACE, f"{transform}.events_used")
        self.steps = 0
        self.events = 0
        self._unreported = 0
        self._next = None  # monotonic time of the next line; None until the first release
        self._started = None

    def released(self, key: Any, step: int, window_end: float, events: int = 0,
                 steps: int = 1) -> None:
        """``steps`` steps of ``key``'s stream released, the last one ``step`` (ending at
        ``window_end``), having used ``events`` input events (added to the ``events_used``
        metric by :meth:`report`). A release DoFn calls it once per run of steps."""
        self._unreported += events
        self.steps += steps
        self.events += events
        now = time.monotonic()
        if self._next is None:
            self._next = now
            self._started = now
            self._every = interval_seconds(self._interval)
        if now >= self._next:
            self._next = now + self._every
            self._log(key, step, window_end, now)

    def report(self) -> None:
        """Adds the events used since the last call to the ``events_used`` metric: once per
        firing, since a metric update costs more than a step's other bookkeeping."""
        if self._unreported:
            self._used.inc(self._unreported)
            self._unreported = 0

    def _log(self, key, step, window_end, now):
        end = time.strftime("%Y-%m-%d %H:%M", time.gmtime(window_end))
        # A rate over less than a second says nothing (the first steps come in a burst).
        rate = self.steps / (now - self._started) if now - self._started >= 1.0 else None
        logging.getLogger(LOGGER).info(
            "%s: %d step(s) released so far on this worker%s, last: %sstep %d "
            "(window ending %s UTC); %d event(s) used", self.transform, self.steps,
            f" ({rate:.0f}/s)" if rate else "", "" if key is None else f"key {key!r}, ",
            step, end, self.events)


def summarise(result: PipelineResult,
              namespace: str = NAMESPACE) -> Optional[Dict[str, Dict[str, int]]]:
    """``{transform: {counter: value}}`` of a finished run's ``dp_beam`` counters.

    Totals over all workers (committed values where the runner has them,
    else attempted). ``None`` when the runner reports no ``dp_beam``
    counter at all or cannot be asked (see the module docstring for what
    ``BundleBasedDirectRunner`` leaves out). Transforms are sorted by label;
    counters in :data:`ORDER`, unknown ones after.
    """
    from apache_beam.metrics.metric import MetricsFilter

    try:
        counters = result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]
    except Exception:  # a runner without metrics support: nothing to summarise
        return None
    if not counters:
        return None
    out = OrderedDict()
    for c in counters:
        name = c.key.metric.name
        transform, _, counter = name.rpartition(".")
        value = c.committed if c.committed is not None else c.attempted
        if not transform or value is None:
            continue
        per = out.setdefault(transform, {})
        per[counter] = per.get(counter, 0) + int(value)
    rank = {name: i for i, name in enumerate(ORDER)}
    return OrderedDict((t, dict(sorted(v.items(), key=lambda kv: (rank.get(kv[0], len(rank)),
                                                                   kv[0]))))
                       for t, v in sorted(out.items()))


def rejected(counts: Dict[str, int]) -> int:
    """Elements a transform sent to ``.invalid``, as its counters record them."""
    return sum(counts.get(name, 0) for name in REJECTED)


def invalid_share(counts: Dict[str, int]) -> Optional[float]:
    """Rejected / (used + rejected) of one transform's counters; ``None`` if it saw nothing.

    >>> invalid_share({"events_used": 30, "invalid": 60, "over_contribution": 10})
    0.7
    """
    used = counts.get("events_used")
    if used is None:
        return None
    bad = rejected(counts)
    return bad / (used + bad) if used + bad else None


class TooManyInvalid(RuntimeError):
    """A run in which a transform rejected more than the allowed share of its input."""


#: Share of rejected input above which :func:`check_invalid` warns even below the limit.
WARN_SHARE = 0.1


def check_invalid(summary: Optional[Dict[str, Dict[str, int]]], max_fraction: Optional[float] = 0.5,
                  logger: Optional[logging.Logger] = None) -> None:
    """Warns about transforms that rejected much of their input; raises past ``max_fraction``.

    A rejected share above 10 % is logged at WARNING with the counts; above
    ``max_fraction`` (``None``: never) :class:`TooManyInvalid` names every
    such transform. Raises ``ValueError`` naming ``max_fraction`` when it is
    not in [0, 1]. ``summary`` as from :func:`summarise` (``None``: nothing
    to check, which is logged).

    >>> check_invalid({"count": {"events_used": 1, "invalid": 9}}, 0.5)
    Traceback (most recent call last):
    ...
    dp_beam.progress.TooManyInvalid: 'count' rejected 9 of 10 input events (90 %), more than max_invalid_fraction=0.5; see the invalid output for the reasons
    """
    if max_fraction is not None and (isinstance(max_fraction, bool) or not isinstance(
            max_fraction, (int, float)) or not 0 <= max_fraction <= 1):
        raise ValueError(f"max_fraction must be a number in [0, 1], got {max_fraction!r}")
    log = logger or logging.getLogger(LOGGER)
    if summary is None:
        log.warning("the runner reported no metrics: the share of invalid input was not checked")
        return
    over = []
    for transform, counts in summary.items():
        if "events_used" not in counts and rejected(counts):
            log.warning("%r rejected %d input events, and the runner reported no events_used "
                        "for it: its share of invalid input was not checked", transform,
                        rejected(counts))
            continue
        share = invalid_share(counts)
        if share is None or share <= WARN_SHARE:
            continue
        bad = rejected(counts)
        text = (f"{transform!r} rejected {bad} of {bad + counts['events_used']} input events "
                f"({100 * share:.0f} %)")
        if max_fraction is not None and share > max_fraction:
            over.append(text)
        else:
            log.warning("%s; see the invalid output for the reasons", text)
    if over:
        raise TooManyInvalid(f"{'; '.join(over)}, more than max_invalid_fraction="
                             f"{max_fraction:g}; see the invalid output for the reasons")


def format_summary(summary: Dict[str, Dict[str, int]]) -> list:
    """One line per transform: ``'label': released_steps=…, events_used=…, …``."""
    if summary is None:
        return ["no dp_beam metrics reported by this runner"]
    return [f"{t!r}: " + ", ".join(f"{k}={v}" for k, v in counts.items())
            for t, counts in summary.items()]


def log_summary(result: PipelineResult, logger: Optional[logging.Logger] = None,
                max_invalid_fraction: Optional[float] = None
                ) -> Optional[Dict[str, Dict[str, int]]]:
    """Logs :func:`summarise` per transform (INFO) and runs :func:`check_invalid`; returns it.

    ``max_invalid_fraction=None`` only warns; a number raises
    :class:`TooManyInvalid` past it.
    """
    log = logger or logging.getLogger(LOGGER)
    summary = summarise(result)
    for line in format_summary(summary):
        log.info("summary %s", line)
    check_invalid(summary, max_invalid_fraction, log)
    return summary
