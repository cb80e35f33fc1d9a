"""Microseconds per draw of the exact keyed noise samplers.

Three cases, all through :class:`KeyedNoise` with the fixed key
``bytes(range(32))``: a discrete-Laplace grid draw (``laplace(7.2, 1)``, one
new stream per call, as a tree-counter release draws), a discrete-Gaussian
grid draw (``gaussian(3.1, 1)``) and the incremental regression's vector of
integer Gaussians (``integer_noise("gaussian", 1.5, -60, 77)``, reported per
value). Each rate is the best of ``--repeats`` timings of ``--number`` calls,
so the stream set-up is included in the per-draw cost like in a release.

    python benchmarks/samplers.py [--number 2000] [--repeats 5]
"""

import argparse
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey  # noqa: E402


def cases():
    key = NoiseKey.from_bytes(bytes(range(32)))
    return [
        ("discrete Laplace   KeyedNoise.laplace(7.2, 1)", 1,
         KeyedNoise(key, ("bench", "laplace")).laplace, (7.2, 1)),
        ("discrete Gaussian  KeyedNoise.gaussian(3.1, 1)", 1,
         KeyedNoise(key, ("bench", "gaussian")).gaussian, (3.1, 1)),
        ("integer Gaussian   integer_noise('gaussian', 1.5, -60, 77), per value", 77,
         KeyedNoise(key, ("bench", "integer")).integer_noise, ("gaussian", 1.5, -60, 77)),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=5, help="timings per case (best kept)")
    args = parser.parse_args(argv)
    for label, per_call, draw, call_args in cases():
        number = max(1, args.number // per_call)
        draw(*call_args)  # warm the per-scale caches
        best = min(timeit.repeat(lambda: draw(*call_args), number=number, repeat=args.repeats))
        print(f"{label:72s} {1e6 * best / (number * per_call):7.2f} µs/draw")


if __name__ == "__main__":
    main()
