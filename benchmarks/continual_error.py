"""Error of the continual-counting mechanisms: exact, simulated, and the lower bound.

For each mechanism of ``dp_beam.mechanisms.MECHANISMS`` and horizon T, in
units of σ (the Gaussian scale for unit L2 sensitivity, so the numbers do not
depend on ε, δ):

* ``exact max`` / ``exact mean``: max and mean over t = 1..T of the release
  std stated by ``noise_std(t)``, i.e. ``‖B[t]‖₂ · max_s ‖R[:, s]‖₂`` of the
  mechanism's factorisation;
* ``emp max`` / ``emp mean``: the same from ``--runs`` simulated runs (one
  mechanism with ``dim = runs`` and SeededNoise: coordinates get independent
  noise) on all-zero data, so a release is pure noise; ``emp max`` is the
  empirical std at the step where the formula is largest; ``emp/exact`` is
  the ratio of the means (its standard error is about ``1/√(2·runs)``);
* ``/LB``: exact max over the factorisation lower bound ``‖A_T‖_*/T``
  (no mechanism can go below 1.0);
* ``µs/step`` for dim = 1 and ``state B``: pickled ``to_state()`` at t = T.

sqrt_toeplitz refuses horizons above its limit (O(T) state); past it only its
exact error is printed, computed from the same formula.

    python benchmarks/continual_error.py [--log2 10 16] [--runs 2000] [--timing-steps 4096]

T = 2^20 (``--log2 20``) takes several minutes per mechanism for the simulation.
"""

import argparse
import os
import pickle
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from dp_beam.mechanisms import (  # noqa: E402
    MECHANISMS,
    SeededNoise,
    ZeroNoise,
    gaussian_sigma,
    prefix_sum_lower_bound,
)

EPSILON, DELTA = 1.0, 1e-6
KW = dict(noise="gaussian", delta=DELTA)


def exact_stds(cls, horizon):
    """``noise_std(t)/σ`` for t = 1..T, or None if the mechanism refuses T."""
    unit = gaussian_sigma(1.0, EPSILON, DELTA)
    limit = getattr(cls, "MAX_HORIZON", None)
    if limit is not None and horizon > limit:
        plan = cls._plan(horizon)
        return np.sqrt([cls._var_factor(plan, t) for t in range(1, horizon + 1)]) * plan.l2, False
    mech = cls(EPSILON, horizon=horizon, rng=ZeroNoise(), **KW)
    return np.array([mech.noise_std(t) for t in range(1, horizon + 1)]) / unit, True


def simulate(cls, horizon, runs, seed):
    """Empirical per-step std (σ units) over ``runs`` independent coordinates."""
    unit = gaussian_sigma(1.0, EPSILON, DELTA)
    mech = cls(EPSILON, horizon=horizon, dim=runs, rng=SeededNoise(seed), **KW)
    zero = np.zeros(runs)
    second = np.empty(horizon)
    start = time.perf_counter()
    for t in range(horizon):
        release = mech.step(zero)
        second[t] = np.dot(release, release) / runs
    elapsed = time.perf_counter() - start
    return np.sqrt(second) / unit, elapsed


def timing(cls, horizon, steps, seed):
    """µs per step for dim = 1 over the first ``steps`` steps, and the pickled state at t = T."""
    mech = cls(EPSILON, horizon=horizon, rng=SeededNoise(seed), **KW)
    steps = min(steps, horizon)
    start = time.perf_counter()
    for _ in range(steps):
        mech.step(1.0)
    per_step = (time.perf_counter() - start) / steps * 1e6
    # Advance to T without the clock (only the state size is wanted).
    for _ in range(horizon - steps):
        mech.step(1.0)
    return per_step, len(pickle.dumps(mech.to_state()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2", type=int, nargs="+", default=[10, 16])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--timing-steps", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--no-sim", action="store_true", help="exact numbers only")
    args = parser.parse_args(argv)

    for log2 in args.log2:
        horizon = 1 << log2
        bound = prefix_sum_lower_bound(horizon)
        print(f"\nT = 2^{log2} = {horizon}: lower bound ‖A‖_*/T = {bound:.4f} σ "
              f"(unit L2 sensitivity, Gaussian; {args.runs} simulated runs)")
        header = (f"{'mechanism':<14}{'exact max':>10}{'/LB':>7}{'exact mean':>11}"
                  f"{'emp max':>9}{'emp mean':>9}{'emp/exact':>10}{'µs/step':>9}{'state B':>9}{'sim s':>7}")
        print(header)
        print("-" * len(header))
        for index, (name, cls) in enumerate(MECHANISMS.items()):
            stds, runnable = exact_stds(cls, horizon)
            worst = int(np.argmax(stds))
            row = f"{name:<14}{stds.max():>10.3f}{stds.max() / bound:>7.3f}{stds.mean():>11.3f}"
            if runnable and not args.no_sim:
                emp, elapsed = simulate(cls, horizon, args.runs, args.seed + index)
                per_step, state_bytes = timing(cls, horizon, args.timing_steps, args.seed)
                row += (f"{emp[worst]:>9.3f}{emp.mean():>9.3f}{emp.mean() / stds.mean():>10.4f}"
                        f"{per_step:>9.1f}{state_bytes:>9d}{elapsed:>7.1f}")
            elif not runnable:
                row += f"  (horizon above the {cls.MAX_HORIZON}-step limit: exact formula only)"
            print(row, flush=True)
        print(f"{'lower bound':<14}{bound:>10.3f}{1.0:>7.3f}")


if __name__ == "__main__":
    main()
