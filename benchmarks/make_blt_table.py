"""Generate dp_beam/mechanisms/counting/blt_table.py: BLT parameters for standard horizons.

Runs :func:`dp_beam.mechanisms.counting.blt.optimise_blt` (scipy Nelder-Mead + BFGS,
3-5 buffers, several deterministic restarts) for T = 2^10, 2^12, ..., 2^20
and writes the parameters with the max per-step std they achieve. The test
suite re-derives each entry's error from its parameters.

    python benchmarks/make_blt_table.py [--restarts 6] [--out dp_beam/mechanisms/counting/blt_table.py]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from dp_beam.mechanisms.counting.blt import optimise_blt  # noqa: E402
from dp_beam.mechanisms.counting.factorisation import prefix_sum_lower_bound  # noqa: E402

HEADER = '''"""BLT parameters for standard horizons (generated; do not edit by hand).

Written by ``benchmarks/make_blt_table.py`` with ``optimise_blt(T, buffers=(3, 4, 5),
restarts={restarts})``. ``max_std`` is the max per-step std in units of the
unit-sensitivity Gaussian σ; ``lower_bound`` the factorisation lower bound
``‖A‖_*/T`` for the same T. tests/mechanisms/counting/test_blt.py recomputes both.
"""

BLT_TABLE = {{
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=6)
    parser.add_argument(
        "--out",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "dp_beam", "mechanisms", "counting", "blt_table.py"),
    )
    args = parser.parse_args(argv)
    lines = [HEADER.format(restarts=args.restarts)]
    for log2 in range(10, 21, 2):
        horizon = 1 << log2
        start = time.perf_counter()
        best = optimise_blt(horizon, buffers=(3, 4, 5), restarts=args.restarts)
        bound = prefix_sum_lower_bound(horizon)
        print(
            f"T=2^{log2}: {len(best['theta'])} buffers, max std {best['max_std']:.4f}, "
            f"lower bound {bound:.4f}, ratio {best['max_std'] / bound:.4f} ({time.perf_counter() - start:.1f} s)"
        )
        lines.append(
            f"    {horizon}: {{\n"
            f"        \"theta\": {[float(v) for v in best['theta']]!r},\n"
            f"        \"omega\": {[float(v) for v in best['omega']]!r},\n"
            f"        \"max_std\": {best['max_std']!r},\n"
            f"        \"lower_bound\": {bound!r},\n"
            f"    }},\n"
        )
    lines.append("}\n")
    with open(args.out, "w") as fh:
        fh.write("".join(lines))
    print(f"wrote {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
