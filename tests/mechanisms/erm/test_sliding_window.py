"""Alg. 5, the sliding-window ERM mechanism (dp_beam.mechanisms.erm.sliding_window; spec
private_erm_and_incremental_regression.md §4.3).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

from fractions import Fraction

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import SlidingWindowERMMechanism, sliding_buckets

from .helpers import UNIT, data


def fmt(key):
    _, lo, hi = key
    return f"f[{lo}]" if lo == hi else f"f[{lo}:{hi}]"


EXAMPLE_1 = {
    6: ("f[0] <- f[1:2] <- f[3:6]", ["f[3:6]", "f[1:2]", "f[0]"]),
    7: ("f[7] <- f[1:2] <- f[3:6]", ["f[7]"]),
    8: ("f[2] <- f[7:8] <- f[3:6]", ["f[7:8]", "f[2]"]),
    9: ("f[9] <- f[7:8] <- f[3:6]", ["f[9]"]),
    10: ("f[4] <- f[5:6] <- f[7:10]", ["f[7:10]", "f[5:6]", "f[4]"]),
    11: ("f[11] <- f[5:6] <- f[7:10]", ["f[11]"]),
    12: ("f[6] <- f[11:12] <- f[7:10]", ["f[11:12]", "f[6]"]),
    13: ("f[13] <- f[11:12] <- f[7:10]", ["f[13]"]),
    14: ("f[8] <- f[9:10] <- f[11:14]", ["f[11:14]", "f[9:10]", "f[8]"]),
}


W15 = {
    14: ("f[0] <- f[1:2] <- f[3:6] <- f[7:14]", 4),
    15: ("f[15] <- f[1:2] <- f[3:6] <- f[7:14]", 1),
    16: ("f[2] <- f[15:16] <- f[3:6] <- f[7:14]", 2),
    17: ("f[17] <- f[15:16] <- f[3:6] <- f[7:14]", 1),
    18: ("f[4] <- f[5:6] <- f[15:18] <- f[7:14]", 3),
    21: ("f[21] <- f[19:20] <- f[15:18] <- f[7:14]", 1),
    22: ("f[8] <- f[9:10] <- f[11:14] <- f[15:22]", 4),
}


def run_sliding(W, n_blocks, policy="exact", rng=None):
    """Run a w0 = 1 sliding window; yield (s, r, chain, new, release, trained) per full step."""
    stream = SlidingWindowERMMechanism(1.0, 1, W, lam=0.5, window_policy=policy,
                              rng=ZeroNoise() if rng is None else rng, **UNIT)
    X, y = data(n_blocks, seed=W)
    for c in range(1, n_blocks + 1):
        s = c - 1
        plan = stream.plan(s) if s >= stream.W - 1 else None
        out = stream.step(X[s:s + 1], y[s:s + 1])
        if plan is None:
            assert out == []
            continue
        r, chain, new = plan
        yield stream, s, r, [k for k, _, _ in chain], new, out, stream.trained_last_step


def test_sliding_window_reproduces_example_1():
    seen = set()
    for stream, s, r, chain, new, out, trained in run_sliding(7, 15):
        text = " <- ".join(fmt(k) for k in reversed(chain))
        assert (text, [fmt(k) for k in new]) == EXAMPLE_1[s]
        assert [(m.trained_on[0], m.trained_on[1] - 1) for m in trained] == [(k[1], k[2]) for k in new]
        (rel,) = out
        assert rel.trained_on == (chain[-1][1], chain[-1][2] + 1)
        assert rel.window == (s - 6, s + 1)
        seen.add(s)
    assert seen == set(EXAMPLE_1)


def test_sliding_window_w15_table():
    for stream, s, r, chain, new, out, trained in run_sliding(15, 23):
        if s in W15:
            text, n_new = W15[s]
            assert " <- ".join(fmt(k) for k in reversed(chain)) == text
            assert len(new) == n_new == len(trained)


def trailing_ones(x):
    n = 0
    while x & 1:
        n, x = n + 1, x >> 1
    return n


@pytest.mark.parametrize("W,expected", [(1, Fraction(1, 3)), (3, Fraction(1, 2)), (7, Fraction(7, 12)),
                                        (15, Fraction(5, 8))])
def test_sliding_window_exact_mode_invariants_and_accounting(W, expected):
    k = (W + 1).bit_length() - 1
    P = (W + 1) // 2
    cost = {}
    for stream, s, r, chain, new, out, trained in run_sliding(W, W + 5 * P + 3):
        # Partition of the window, one bucket per level 0..k−2 plus the base of P blocks.
        blocks = sorted(b for _, lo, hi in chain for b in range(lo, hi + 1))
        assert blocks == list(range(s - W + 1, s + 1))
        sizes = sorted(hi - lo + 1 for _, lo, hi in chain)
        assert sizes == sorted([2**i for i in range(k - 1)] + [P])
        # New-model counts (§4.3 item 15).
        if r == 0:
            assert trained[0].kind == "base" and trained[0].regulariser is None
            assert len(trained) == k and all(m.kind == "left" for m in trained[1:])
        else:
            assert len(trained) == trailing_ones(r - 1) + 1
            assert all(m.kind != "base" for m in trained)
        # Chain consistency: each model's regulariser is its current chain predecessor.
        models = stream._models
        for a, b in zip(chain, chain[1:]):
            assert models[b]["parent"] == a
            assert models[b]["release"].regulariser == models[a]["release"].trained_on
        # Released bucket: size w0; newest block when r odd, oldest when r even (k >= 2).
        (rel,) = out
        assert rel.trained_on[1] - rel.trained_on[0] == (1 if W > 1 else P)
        if k >= 2:
            assert rel.trained_on == ((s, s + 1) if r % 2 else (s - W + 1, s - W + 2))
        # Lineage closure: everything the release depends on lies in the window.
        assert all(s - W + 1 <= lo and hi <= s + 1 for lo, hi in rel.depends_on)
        for m in trained:
            for b in range(*m.trained_on):
                cost[b] = cost.get(b, 0) + Fraction(m.fraction).limit_denominator(10**6)
        # State bound: W blocks, k models.
        points, n_models = stream.state_size()
        assert points <= W and n_models <= k
    assert max(cost.values()) == expected


@pytest.mark.parametrize("W,expected", [(8, 0.625), (10, 0.7917)])
def test_sliding_window_general_mode_accounting(W, expected):
    cost = {}
    for stream, s, r, chain, new, out, trained in run_sliding(W, 6 * W + 5, policy="general"):
        blocks = sorted(b for _, lo, hi in chain for b in range(lo, hi + 1))
        assert blocks == list(range(s - W + 1, s + 1))
        (rel,) = out
        assert all(s - W + 1 <= lo and hi <= s + 1 for lo, hi in rel.depends_on)
        for m in trained:
            for b in range(*m.trained_on):
                cost[b] = cost.get(b, 0.0) + m.fraction
    assert max(cost.values()) == pytest.approx(expected, abs=1e-4)


def test_sliding_release_depends_only_on_window_data():
    # §4.3 item 17: perturbing records outside the window leaves the release bit-identical.
    def releases(perturb_block):
        stream = SlidingWindowERMMechanism(1.0, 2, 14, lam=0.3, rng=99, **UNIT)   # w0 = 2, W = 7
        X, y = data(2 * 12, seed=4)
        X = X.copy()
        if perturb_block is not None:
            X[2 * perturb_block:2 * perturb_block + 2] = [[9.0, 1.0], [-4.0, -7.0]]
        return [stream.step(X[2 * c:2 * c + 2], y[2 * c:2 * c + 2]) for c in range(12)]

    base = releases(None)
    moved = releases(2)      # block 2 = records (4, 6]; outside the window from s = 9 on
    for s in range(9, 12):
        (a,), (b,) = base[s], moved[s]
        assert a.window[0] >= 6
        np.testing.assert_array_equal(a.params, b.params)
    (a,), (b,) = base[8], moved[8]           # window [2:8] contains block 2
    assert not np.array_equal(a.params, b.params)


def test_sliding_buckets_function():
    assert sliding_buckets(8, 7, 4) == (0, 2, 1, [("B", 3, 6, None), ("R", 7, 8, 1), ("L", 2, 2, 0)])


@pytest.mark.parametrize("kwargs,name", [
    (dict(epsilon=0), "epsilon"),
    (dict(epsilon=float("inf")), "epsilon"),
    (dict(lam=-1), "lam"),
    (dict(feature_bound=0), "feature_bound"),
    (dict(classes=[1]), "classes"),
    (dict(classes=[1, 1]), "classes"),
    (dict(block_size=0), "block_size"),
    (dict(n_features=0), "n_features"),
    (dict(noise="laplace"), "noise"),
    (dict(noise="gaussian"), "delta"),
    (dict(noise="gaussian", delta=1.5), "delta"),
    (dict(delta=1e-6), "delta"),
    (dict(tol_fraction=2.0), "tol_fraction"),
    (dict(window=8192), "window"),
    (dict(window=7000), "window"),
    (dict(window_policy="fuzzy"), "window_policy"),
])
def test_sliding_configuration_errors_name_the_parameter(kwargs, name):
    base = dict(epsilon=1.0, block_size=1024, window=7168, n_features=2, classes=[0, 1], feature_bound=1.0,
                lam=1.0)
    base.update(kwargs)
    with pytest.raises(ValueError, match=name):
        SlidingWindowERMMechanism(**base)


def test_window_policies():
    assert SlidingWindowERMMechanism(1.0, 1024, 7168, lam=1, **UNIT).effective_window == 7168
    assert SlidingWindowERMMechanism(1.0, 1024, 8192, lam=1, window_policy="round_down", **UNIT).effective_window == 7168
    general = SlidingWindowERMMechanism(1.0, 1024, 8192, lam=1, window_policy="general", **UNIT)
    assert (general.W, general.P) == (8, 4)
