"""Private incremental regression (seed 002) against the dimension d, and against the spec's §2.7 bounds.

Spec private_erm_and_incremental_regression.md §2.4–2.7. Engine-free
mechanisms of ``dp_beam.mechanisms.regression`` (no Beam); noise from seeded
numpy generators (``SeededNoise``: fine for measuring accuracy, not the keyed
source the transform uses in production). Synthetic streams from the public
seed ``DATA_SEED`` (one generator per (design, d, seed, step)), T = ``--steps``
steps of ``--per-step`` records each, every record with ‖x‖ = 1 and |y| <= 1:

* ``dense``: x uniform on the unit sphere of R^d, θ* a uniform direction with
  ‖θ*‖ = 0.8, y = clip(⟨x, θ*⟩ + 0.1·N(0, 1)); C the unit L2 ball.
  The features' Gaussian width is that of the sphere, ≈ √d.
* ``sparse``: x has 4 non-zeros ±1/2 (‖x‖ = 1), one of them on the first two
  coordinates and three uniform among the others; θ* = (0.5, −0.5, 0, …);
  y = clip(⟨x, θ*⟩ + 0.1·N(0, 1)); C the unit L1 ball (Lasso). Gaussian widths
  w(X) (Monte Carlo, public seed) and w(C) ≈ √(2 ln 2d) grow like √log d.

Methods, each (ε, δ = 10⁻⁶)-DP for the whole sequence under replace-one:
``reg1`` PrivIncReg1 with the tree (002's TreeMech, the counter the §2.7
bound is written for) and the exact solver; ``reg2`` PrivIncReg2 with the
spec's m (``projection_dim`` with n = T·per-step records and the features'
width), the exact solver and the lift; ``incerm`` PrivIncERM (ridge output
perturbation every τ steps, the spec's default τ). The reference θ̂_t is the
exact minimiser over C of the sum loss J on the same prefix.

Measured at the end of the stream (t = T, n = T·per-step records): the excess
empirical risk ``J(θ_T) − J(θ̂_T)`` (sum-loss scale, as §2.7), its median over
``--seeds`` seeds, and the ratio to the spec's bound for the method (§2.7,
min with the trivial n(1 + ‖C‖)²):

* ``reg1``: ``4‖C‖α_T`` (Cor. B.2 with α_T of §2.4,
  ``2σ_T((2√d + s)‖C‖ + (√d + s))``, σ_T the release's noise std, s =
  √(2 ln(4T/β)), β = 0.05); the exact solver's own guarantee is half of it;
* ``reg2``: the three terms of §2.6, ``A√m + n‖C‖²W²/m + ‖C‖W√(n·OPT)/√m``
  with ``A = 8‖C‖σ_T√(ln T)(‖C‖ + 1)``, W = w(X) + w(C), OPT = J(θ̂_T);
* ``incerm``: ``L‖C‖(d·n)^{1/3}ε^{−2/3}`` with L = 2(‖C‖ + 1), the per-record
  Lipschitz constant of the squared loss on C; §2.7 hides polylog factors,
  so this ratio is against the bare rate.

Also: the realised gradient error of PrivIncReg1, ``2(‖N_Q‖‖C‖ + ‖N_q‖)``
with N_Q, N_q the noises in its released sums at T, the quantity the √d of
the bound comes from; and least-squares fits of log(value) against log d
(the growth exponents).

Usage (from the repository root)::

    python benchmarks/incremental_regression_dims.py [--quick] [--seeds 4] [--dims 8 32 128 512]
        [--plot docs/img/incremental_regression.png] [--markdown docs/incremental_regression.md]

The default run took 1.6 to 3.8 minutes on a shared two-core machine, depending on its
load (d = 512 is most of it); ``--quick`` about 10 seconds, a smoke test, not results.
"""

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dp_beam.mechanisms.regression import (L1Ball, L2Ball, PrivIncERM, PrivIncERMParams,  # noqa: E402
                                           PrivIncReg1, PrivIncReg1Params, PrivIncReg2,
                                           PrivIncReg2Params, solve_quadratic, svec)

DATA_SEED = 20020417
DELTA = 1e-6
BETA = 0.05
NOISE = 0.1
SPARSITY = 4
METHODS = ("reg1", "reg2", "incerm")
DESIGNS = ("dense", "sparse")
NAMES = {"reg1": "PrivIncReg1", "reg2": "PrivIncReg2", "incerm": "PrivIncERM"}


def constraint(design):
    return L2Ball(1.0) if design == "dense" else L1Ball(1.0)


def truth(design, d):
    if design == "dense":
        theta = np.random.default_rng([DATA_SEED, d]).normal(size=d)
        return 0.8 * theta / np.linalg.norm(theta)
    theta = np.zeros(d)
    theta[:2] = (0.5, -0.5)
    return theta


def step_data(design, d, seed, step, per_step):
    """The records of one step (the same for every method)."""
    rng = np.random.default_rng([DATA_SEED, DESIGNS.index(design), d, seed, step])
    if design == "dense":
        X = rng.normal(size=(per_step, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    else:
        X = np.zeros((per_step, d))
        rows = np.arange(per_step)
        X[rows, rng.integers(0, 2, per_step)] = 1.0
        for i in range(per_step):
            X[i, 2 + rng.choice(d - 2, SPARSITY - 1, replace=False)] = 1.0
        X *= rng.choice((-0.5, 0.5), size=X.shape)
    y = np.clip(X @ truth(design, d) + NOISE * rng.normal(size=per_step), -1.0, 1.0)
    return X, y


def feature_width(design, d):
    """w(X) = E sup_{x∈X} ⟨x, g⟩ (public: a property of the feature domain, not of the data)."""
    if design == "dense":
        return L2Ball(1.0).gaussian_width(d)
    g = np.abs(np.random.default_rng([DATA_SEED, d, 1]).normal(size=(2000, d)))
    top_first = g[:, :2].max(axis=1)
    rest = -np.sort(-g[:, 2:], axis=1)[:, :SPARSITY - 1].sum(axis=1)
    return float(np.mean(top_first + rest)) / math.sqrt(SPARSITY)


def project_rows(phi, X):
    """``project_features`` of every row at once: u = clip(Φx/√m, 1)."""
    U = X @ phi.T / math.sqrt(phi.shape[0])
    norms = np.linalg.norm(U, axis=1, keepdims=True)
    return np.where(norms > 1.0, U / np.maximum(norms, 1.0), U)


def make(method, design, d, eps, steps, seed, records):
    rng = np.random.default_rng([seed, METHODS.index(method), DESIGNS.index(design), d,
                                 int(eps * 1000)])
    common = dict(dim=d, epsilon=eps, delta=DELTA, constraint=constraint(design), horizon=steps)
    if method == "reg1":
        return PrivIncReg1(PrivIncReg1Params(**common, counter="tree", beta=BETA), rng=rng)
    if method == "reg2":
        return PrivIncReg2(PrivIncReg2Params(**common, counter="tree", beta=BETA,
                                             expected_records=records,
                                             feature_width=feature_width(design, d)), rng=rng)
    return PrivIncERM(PrivIncERMParams(**common), rng=rng)


def run_case(design, d, eps, seed, steps, per_step):
    """Excess, bound and extras of every method at t = T, plus the reference."""
    records = steps * per_step
    mechs = {m: make(m, design, d, eps, steps, seed, records) for m in METHODS}
    Q, q, yy = np.zeros((d, d)), np.zeros(d), 0.0
    for step in range(steps):
        X, y = step_data(design, d, seed, step, per_step)
        G, b = X.T @ X, X.T @ y
        Q += G
        q += b
        yy += float(y @ y)
        for name, mech in mechs.items():
            if name == "reg2":
                U = project_rows(mech.projection, X)
                gram, xy = svec(U.T @ U), U.T @ y
            else:
                gram, xy = svec(G), b
            if name == "incerm":
                rel_erm = mech.step(gram, xy, per_step)
            else:
                mech.update(gram, xy, per_step)
    C = constraint(design)
    theta_hat, _ = solve_quadratic(Q, q, C, psd=False)

    def J(theta):
        return yy - 2.0 * q @ theta + theta @ Q @ theta

    opt = J(theta_hat)
    radius = C.max_norm
    trivial = records * (1.0 + radius) ** 2
    out = {"opt": opt, "n": records}
    for name, mech in mechs.items():
        start = time.perf_counter()
        rel = rel_erm if name == "incerm" else mech.model()
        seconds = time.perf_counter() - start
        excess = J(rel.theta) - opt
        if name == "reg1":
            bound = 4.0 * radius * rel.alpha
            Qn, qn = mech.statistics()
            realised = 2.0 * (np.linalg.norm(Qn - Q, 2) * radius + np.linalg.norm(qn - q))
            extra = {"alpha": rel.alpha, "realised": realised}
        elif name == "reg2":
            m = mech.m
            width = feature_width(design, d) + C.gaussian_width(d)
            sigma = rel.noise_std_gram
            a = 8.0 * radius * sigma * math.sqrt(math.log(steps)) * (radius + 1.0)
            bound = (a * math.sqrt(m) + records * radius ** 2 * width ** 2 / m
                     + radius * width * math.sqrt(records * opt) / math.sqrt(m))
            extra = {"m": m, "width": width}
        else:
            lip = 2.0 * (radius + 1.0)
            bound = lip * radius * (d * records) ** (1.0 / 3.0) * eps ** (-2.0 / 3.0)
            extra = {"tau": mech.params.resolved_tau}
        capped = bound >= trivial
        bound = min(bound, trivial)
        out[name] = {"excess": excess, "bound": bound, "ratio": excess / bound, "capped": capped,
                     "seconds": seconds, **extra}
    return out


def slope(ds, values):
    """Least-squares exponent of values ∝ d^k (log–log)."""
    return float(np.polyfit(np.log(ds), np.log(values), 1)[0])


def summarise(results, dims, seeds, eps):
    rows = {}
    for design in DESIGNS:
        for d in dims:
            runs = [results[(design, d, s)] for s in range(seeds)]
            row = {"opt": float(np.median([r["opt"] for r in runs])), "n": runs[0]["n"]}
            for m in METHODS:
                row[m] = {k: float(np.median([r[m][k] for r in runs]))
                          for k in runs[0][m] if k != "seconds"}
                row[m]["q1"] = float(np.percentile([r[m]["excess"] for r in runs], 25))
                row[m]["q3"] = float(np.percentile([r[m]["excess"] for r in runs], 75))
                row[m]["seconds"] = float(np.median([r[m]["seconds"] for r in runs]))
            rows[(design, d)] = row
    fits = {}
    for design in DESIGNS:
        for m in METHODS:
            fits[(design, m, "excess")] = slope(dims, [rows[(design, d)][m]["excess"] for d in dims])
            fits[(design, m, "bound")] = slope(dims, [rows[(design, d)][m]["bound"] for d in dims])
        fits[(design, "reg1", "realised")] = slope(
            dims, [rows[(design, d)]["reg1"]["realised"] for d in dims])
    return rows, fits


def table_lines(rows, fits, dims):
    lines = []
    for design in DESIGNS:
        c = "unit L2 ball" if design == "dense" else "unit L1 ball"
        lines.append(f"**{design}** features, C = {c}; excess J(θ_T) − J(θ̂_T) (median "
                     "[quartiles] over seeds) and its ratio to the §2.7 bound:")
        lines.append("")
        lines.append("| d | OPT = J(θ̂_T) | PrivIncReg1 | ratio | PrivIncReg2 (m) | ratio "
                     "| PrivIncERM (τ) | ratio | PrivIncReg1 gradient error | lowest excess |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for d in dims:
            r = rows[(design, d)]
            cells = [f"{d}", f"{r['opt']:,.0f}"]
            for m, tag in (("reg1", None), ("reg2", "m"), ("incerm", "tau")):
                label = f"{r[m]['excess']:,.1f} [{r[m]['q1']:,.1f}, {r[m]['q3']:,.1f}]"
                if tag:
                    label += f" ({int(r[m][tag])})"
                cells += [label, f"{r[m]['ratio']:.2g}" + (" †" if r[m]["capped"] else "")]
            cells.append(f"{r['reg1']['realised']:,.0f}")
            best = min(METHODS, key=lambda m: r[m]["excess"])
            cells.append(NAMES[best])
            lines.append("| " + " | ".join(cells) + " |")
        lines.append(f"| exponent k (∝ d^k) | | {fits[(design, 'reg1', 'excess')]:.2f} "
                     f"(bound {fits[(design, 'reg1', 'bound')]:.2f}) | | "
                     f"{fits[(design, 'reg2', 'excess')]:.2f} "
                     f"(bound {fits[(design, 'reg2', 'bound')]:.2f}) | | "
                     f"{fits[(design, 'incerm', 'excess')]:.2f} "
                     f"(bound {fits[(design, 'incerm', 'bound')]:.2f}) | | "
                     f"{fits[(design, 'reg1', 'realised')]:.2f} | |")
        lines.append("")
    lines.append("† the method's bound exceeds the trivial n(1 + ‖C‖)², so the ratio is to that. "
                 "Exponents: least-squares slope of log(median) against log d.")
    lines.append("")
    return lines


def reading_lines(rows, fits, dims):
    """What the tables say, from the measured numbers."""
    ratios = [rows[(g, d)]["reg1"]["ratio"] for g in DESIGNS for d in dims]
    wins = {g: [d for d in dims if min(METHODS, key=lambda m: rows[(g, d)][m]["excess"]) == "reg2"]
            for g in DESIGNS}
    out = [
        "## Reading",
        "",
        f"* PrivIncReg1's realised gradient error grows as d^{fits[('dense', 'reg1', 'realised')]:.2f} "
        f"(dense) and d^{fits[('sparse', 'reg1', 'realised')]:.2f} (sparse): the √d of 002's bound "
        "(‖N_Q‖ of a d×d Gaussian matrix), and the bound itself grows as "
        f"d^{fits[('dense', 'reg1', 'bound')]:.2f} over this range (√d plus the d-free s term).",
        f"* The measured excess stays far below the bound ({min(ratios):.2g} to {max(ratios):.2g} "
        "of it) and does not follow √d: it is second order in the gradient error while the data "
        "dominate (dense x has curvature n/d per direction, so there it scales like d²σ²/n: "
        f"d = {dims[0]} → {dims[1]} multiplies it by "
        f"{rows[('dense', dims[1])]['reg1']['excess'] / rows[('dense', dims[0])]['reg1']['excess']:.0f}), "
        "and it is capped by the data's own curvature once the noise dominates (dense d = "
        f"{dims[-1]}: the excess falls back as every method's model is mostly noise); over the "
        f"whole range the fitted exponent is {fits[('dense', 'reg1', 'excess')]:.2f}. In the sparse "
        "design most of the data sit on two coordinates, so the noise in the others costs little "
        f"(exponent {fits[('sparse', 'reg1', 'excess')]:.2f}).",
        "* Configurations where PrivIncReg2 has the lowest median excess: "
        + ("; ".join(f"{g} d = {', '.join(map(str, ds))}" for g, ds in wins.items() if ds)
           if any(wins.values()) else "none")
        + ". With the spec's m (capped at d, and "
        f"m = {int(rows[('sparse', dims[-1])]['reg2']['m'])} for the sparse d = {dims[-1]}) the "
        "projection's distortion (n‖C‖²W²/m in §2.6) outweighs the smaller noise at this n.",
        "* PrivIncERM re-runs a ridge fit every τ steps with a share of the budget; against the "
        "bare rate of §2.7 (polylog factors dropped) its ratio runs from "
        f"{min(rows[(g, d)]['incerm']['ratio'] for g in DESIGNS for d in dims):.2g} to "
        f"{max(rows[(g, d)]['incerm']['ratio'] for g in DESIGNS for d in dims):.2g}.",
        "",
    ]
    return out


def plot(rows, dims, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {"reg1": "tab:blue", "reg2": "tab:orange", "incerm": "tab:green"}
    names = NAMES
    for ax, design in zip(axes, DESIGNS):
        for m in METHODS:
            ex = [rows[(design, d)][m]["excess"] for d in dims]
            lo = [rows[(design, d)][m]["q1"] for d in dims]
            hi = [rows[(design, d)][m]["q3"] for d in dims]
            ax.plot(dims, ex, "o-", color=colours[m], label=f"{names[m]} excess")
            ax.fill_between(dims, lo, hi, color=colours[m], alpha=0.2)
            ax.plot(dims, [rows[(design, d)][m]["bound"] for d in dims], "--", color=colours[m],
                    alpha=0.7, label=f"{names[m]} §2.7 bound")
        ax.plot(dims, [rows[(design, d)]["reg1"]["realised"] for d in dims], ":", color="k",
                label="PrivIncReg1 gradient error 2(‖N_Q‖‖C‖+‖N_q‖)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(dims)
        ax.set_xticklabels([str(d) for d in dims])
        ax.set_xlabel("d")
        ax.set_ylabel("at T, sum-loss scale (median, quartile band)")
        title = ("dense x, C = L2 ball" if design == "dense"
                 else "sparse x (4 non-zeros), C = L1 ball")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_markdown(path, lines, args, elapsed, plot_path, argv):
    command = "python benchmarks/incremental_regression_dims.py" + (" " + " ".join(argv) if argv else "")
    image = os.path.relpath(plot_path, os.path.dirname(path)) if plot_path else None
    text = [
        "# Private incremental regression against the dimension",
        "",
        f"Generated by `{command}` ({elapsed / 60:.1f} min); do not edit by hand.",
        "",
        "## Method",
        "",
        "Seed 002's mechanisms as implemented in `dp_beam.mechanisms.regression`, on synthetic",
        f"streams from the public seed {DATA_SEED}: T = {args.steps} steps of {args.per_step} records",
        f"(n = {args.steps * args.per_step:,}), ‖x‖ = 1, |y| <= 1, ε = {args.eps:g}, δ = 10⁻⁶,",
        f"{args.seeds} seeds (data and noise), d ∈ {{{', '.join(map(str, args.dims))}}}.",
        "`dense`: x uniform on the sphere, ‖θ*‖₂ = 0.8, C the unit L2 ball. `sparse`: x with 4",
        "non-zeros ±1/2 (one on the two informative coordinates), θ* = (0.5, −0.5, 0, …), C the",
        "unit L1 ball, feature and constraint widths ≈ √log d. y = ⟨x, θ*⟩ + 0.1·N(0, 1), clipped.",
        "PrivIncReg1 uses the tree (002's TreeMech) and the exact solver; PrivIncReg2 the spec's",
        "m and the lift; PrivIncERM its default τ. The excess is `J(θ_T) − J(θ̂_T)` on the sum",
        "loss (§2.7's scale), θ̂_T the exact minimiser over C. Bounds (all min'd with n(1+‖C‖)²):",
        "PrivIncReg1 `4‖C‖α_T` (Cor. B.2 with α_T of §2.4 from the release's noise std);",
        "PrivIncReg2 the three terms of §2.6 with the release's σ_T and W = w(X) + w(C);",
        "PrivIncERM the bare rate `2(‖C‖+1)‖C‖(dn)^{1/3}ε^{−2/3}` (§2.7 hides its polylog",
        "factors). The gradient error column is PrivIncReg1's realised `2(‖N_Q‖‖C‖ + ‖N_q‖)`.",
        "",
        "## Results",
        "",
    ]
    if image:
        text += [f"![excess against d]({image})", ""]
    text += lines
    with open(path, "w") as fh:
        fh.write("\n".join(text).rstrip() + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--per-step", type=int, default=256)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="d up to 128, 2 seeds, 64 steps")
    ap.add_argument("--plot", default=None, help="write the figure here (PNG)")
    ap.add_argument("--markdown", default=None, help="write the results page here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.dims, args.steps = 2, [8, 32, 128], 64
    started = time.time()
    results = {}
    for design in DESIGNS:
        for d in args.dims:
            for seed in range(args.seeds):
                results[(design, d, seed)] = out = run_case(design, d, args.eps, seed, args.steps,
                                                            args.per_step)
                print(f"  {design:6s} d={d:4d} seed {seed}: "
                      + ", ".join(f"{m} {out[m]['excess']:.2f} ({out[m]['ratio']:.2g} of bound)"
                                  for m in METHODS)
                      + f" ({time.time() - started:.0f} s)", flush=True)
    rows, fits = summarise(results, args.dims, args.seeds, args.eps)
    lines = table_lines(rows, fits, args.dims) + reading_lines(rows, fits, args.dims)
    print()
    print("\n".join(lines))
    elapsed = time.time() - started
    if args.plot:
        plot(rows, args.dims, args.plot)
        print(f"plot: {args.plot}")
    if args.markdown:
        write_markdown(args.markdown, lines, args, elapsed, args.plot,
                       argv if argv is not None else sys.argv[1:])
        print(f"markdown: {args.markdown}")
    print(f"total {elapsed:.0f} s")
    return rows, fits


if __name__ == "__main__":
    main()
