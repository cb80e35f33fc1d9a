"""µs per stream and step of many streams stepped one by one and stepped together, engine-free.

A sharded release on bounded input steps a shard's streams together
(``ReleaseSpec.lockstep``). This measures that evaluation order without Beam:
``--streams`` streams of one configuration, each step of each stream from its
own keyed noise source (as a release gives it), ``--steps`` steps, first each
stream by its own mechanism, then all of them together; the two alternate
``--repeats`` times and the medians are kept. Both must release the same
values, bit for bit (checked at every run). Cases:

* ``tree``: ``BinaryTreeMechanism`` streams, unbounded (``LockstepTrees``);
* ``blt``: ``BLTMechanism`` streams with Gaussian noise (``LockstepBLT``);
* ``mean``: ``ContinualMeanCore`` streams of the tuned preset
  (``MeanLockstep``) with ``benchmarks/scale.py``'s mean configuration: two users
  per stream, two samples a step, ``max_samples_per_user`` the steps.

``--draws`` adds, per case, what the noise costs of the streams stepped together: the
values drawn and the µs spent in ``KeyedNoise``'s draws per stream and step, and that
time's share of the together run, from one more run with a timer around each draw (its
own overhead, about 0.2 µs a call, included). Each stream draws exactly from its own
keyed stream (docs/design.md D1.4), so this part does not shrink with stepping together.

    python benchmarks/lockstep.py [--streams 64] [--steps 72] [--repeats 5] [--cases tree,blt,mean]
        [--draws]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dp_beam.mechanisms import BinaryTreeMechanism  # noqa: E402
from dp_beam.mechanisms.continual_mean import (ContinualMeanCore, MeanLockstep,  # noqa: E402
                                               MeanParams, UserState, contribution)
from dp_beam.mechanisms.counting import BLTMechanism, lockstep_of  # noqa: E402
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey  # noqa: E402

KEY = NoiseKey.from_bytes(bytes(range(32)))
CASES = ("tree", "blt", "mean")


def _source(stream, step):
    return KeyedNoise(KEY, ("bench-lockstep", stream, step))


def _counter_case(kind, streams, steps):
    """(make the streams, the inputs per step): one input per stream and step."""
    def make():
        if kind == "tree":
            return [BinaryTreeMechanism(1.0) for _ in range(streams)]
        return [BLTMechanism(1.0, noise="gaussian", delta=1e-6) for _ in range(streams)]
    inputs = [[float((j + t) % 3) for j in range(streams)] for t in range(steps)]
    return make, inputs


def _mean_case(streams, steps):
    # As benchmarks/scale.py's mean: values in [0, 4] rescaled to [0, 1], two users a key.
    params = MeanParams(max_users=2, max_samples_per_user=steps, epsilon=1.0)
    inputs = []
    users = {}
    for t in range(steps):
        row = []
        for j in range(streams):
            agg = None
            for u in range(2):
                state = users.setdefault((j, u), UserState(uhash=2 * j + u))
                c = contribution(params, state, ((j + t + u) % 4) / 4.0, step=t + 1)
                agg = c if agg is None else agg.merge(c)
            row.append(agg)
        inputs.append(row)

    def make():
        return [ContinualMeanCore(params, 0.0, 4.0) for _ in range(streams)]
    return make, inputs


def _alone(make, inputs):
    streams = make()
    out = []
    for t, row in enumerate(inputs):
        for j, (m, x) in enumerate(zip(streams, row)):
            m.set_noise_source(_source(j, t))
            out.append(m.step(x))
    return out


def _together(make, inputs, kind):
    streams = make()
    lock = MeanLockstep(streams) if kind == "mean" else lockstep_of(streams)
    out = []
    for t, row in enumerate(inputs):
        out.extend(lock.step(row, [_source(j, t) for j in range(len(row))]))
    lock.write_back()
    return out


def _values(out, kind):
    if kind == "mean":
        return [(float(o.estimate).hex(), float(o.noise_std).hex(), o.diverse) for o in out]
    return [float(v).hex() for v in out]


def run(kind, streams, steps, repeats):
    """Median seconds per stream and step: (alone, together)."""
    make, inputs = _mean_case(streams, steps) if kind == "mean" else \
        _counter_case(kind, streams, steps)
    times = {"alone": [], "together": []}
    for _ in range(repeats):
        start = time.perf_counter()
        alone = _alone(make, inputs)
        times["alone"].append(time.perf_counter() - start)
        start = time.perf_counter()
        together = _together(make, inputs, kind)
        times["together"].append(time.perf_counter() - start)
        if _values(alone, kind) != _values(together, kind):
            raise AssertionError(f"{kind}: the streams stepped together released other values")
    n = streams * steps
    return statistics.median(times["alone"]) / n, statistics.median(times["together"]) / n


#: KeyedNoise's draws: each takes one new stream and returns what it drew.
_DRAWS = ("float_noise", "integer_noise", "direction", "exponential_choice")


def draw_cost(kind, streams, steps):
    """``(values drawn, seconds in the draws, seconds in all)`` per stream and step, the
    streams stepped together, with a timer around each of KeyedNoise's draws."""
    make, inputs = _mean_case(streams, steps) if kind == "mean" else \
        _counter_case(kind, streams, steps)
    spent = {"seconds": 0.0, "values": 0}
    originals = {name: getattr(KeyedNoise, name) for name in _DRAWS}

    def timed(draw):
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            out = draw(self, *args, **kwargs)
            spent["seconds"] += time.perf_counter() - start
            spent["values"] += len(out) if hasattr(out, "__len__") else 1
            return out
        return wrapper

    for name, draw in originals.items():
        setattr(KeyedNoise, name, timed(draw))
    try:
        start = time.perf_counter()
        _together(make, inputs, kind)
        total = time.perf_counter() - start
    finally:
        for name, draw in originals.items():
            setattr(KeyedNoise, name, draw)
    n = streams * steps
    return spent["values"] / n, spent["seconds"] / n, total / n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--draws", action="store_true",
                        help="also the values drawn and the time in the draws, together")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {unknown}, from {', '.join(CASES)}")
    if args.streams < 2 or args.steps < 1 or args.repeats < 1:
        parser.error("--streams must be >= 2, --steps and --repeats >= 1")
    print(f"{args.streams} streams x {args.steps} steps, medians of {args.repeats} alternating "
          "runs; µs per stream and step (the same values released both ways)")
    print("  case | one by one | together | speed-up")
    for kind in cases:
        alone, together = run(kind, args.streams, args.steps, args.repeats)
        print(f"{kind:>6} | {alone * 1e6:10.1f} | {together * 1e6:8.1f} | {alone / together:7.2f}x")
    if args.draws:
        print("noise draws of the streams stepped together, per stream and step (one timed run)")
        print("  case | values | µs in draws | µs in all | share")
        for kind in cases:
            values, seconds, total = draw_cost(kind, args.streams, args.steps)
            print(f"{kind:>6} | {values:6.2f} | {seconds * 1e6:11.1f} | {total * 1e6:9.1f} | "
                  f"{seconds / total:5.2f}")


if __name__ == "__main__":
    main()
