"""Alg. 4, the continual ERM mechanism (dp_beam.mechanisms.erm.continual; spec
private_erm_and_incremental_regression.md §4.2).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

from fractions import Fraction

import numpy as np

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import ContinualERMMechanism

from .helpers import UNIT, data, feed


def alg4_table(n_blocks, base_blocks):
    tg, out = None, []
    for c in range(1, n_blocks + 1):
        kind = ContinualERMMechanism.schedule(c, base_blocks, tg)
        if kind is None:
            continue
        if kind[0] == "base":
            tg = c
        out.append((c, kind[0]))
    return out


def test_continual_schedule_matches_mnist_and_arxiv_tables():
    mnist = alg4_table(19, 8)     # b0 = 1024, B = 8192: t/b0 = 8..19
    assert mnist == [(8, "base"), (9, "doubling"), (10, "doubling"), (11, "single"), (12, "doubling"),
                     (13, "single"), (14, "single"), (15, "single"), (16, "base"), (17, "doubling"),
                     (18, "doubling"), (19, "single")]
    arxiv = alg4_table(16, 4)     # b0 = 512, B = 2048
    assert [(c * 512, k) for c, k in arxiv] == [
        (2048, "base"), (2560, "doubling"), (3072, "doubling"), (3584, "single"), (4096, "base"),
        (4608, "doubling"), (5120, "doubling"), (5632, "single"), (6144, "doubling"), (6656, "single"),
        (7168, "single"), (7680, "single"), (8192, "base")]


def test_continual_per_batch_accounting_maximum():
    # §4.2 item 10: updates only (bases are the other half), B = 8 b0, horizon 2^12 b0.
    tg, cost = None, {}
    for c in range(1, 2**12 + 1):
        kind = ContinualERMMechanism.schedule(c, 8, tg)
        if kind is None:
            continue
        what, level = kind
        if what == "base":
            tg = c
            continue
        lo = tg if what == "doubling" else c - 1
        for b in range(lo + 1, c + 1):
            cost[b] = cost.get(b, 0) + Fraction(1, 2 ** (level + 1))
    assert max(cost.values()) == Fraction(2047, 2048)
    worst = max(cost, key=cost.get)
    assert worst == 2**11 + 1           # the first batch after the base at t = 2^11 b0


def test_continual_releases_lineage_and_regularisers():
    cont = ContinualERMMechanism(1.0, 2, 4, lam=0.5, rng=ZeroNoise(), **UNIT)
    releases = [r for rs in feed(cont, 14)[0] for r in rs]
    by_t = {r.t: r for r in releases}
    # b0 = 2 points, B = 2 blocks (records): base@4, doubling@6, base@8, doubling@10, @12,
    # single@14, base@16, doubling@18, @20, single@22, doubling@24, single@26, @28.
    assert sorted(by_t) == list(range(4, 29, 2))
    assert [by_t[t].kind for t in (4, 6, 8, 10, 12, 14, 16, 20, 22, 24, 26, 28)] == [
        "base", "doubling", "base", "doubling", "doubling", "single", "base", "doubling", "single",
        "doubling", "single", "single"]
    assert by_t[6].regulariser == (0, 4) and by_t[6].trained_on == (4, 6) and by_t[6].depends_on == ((0, 6),)
    assert by_t[12].regulariser == (0, 8)
    assert by_t[12].trained_on == (8, 12) and by_t[12].depends_on == ((0, 12),)
    assert by_t[14].regulariser == (8, 12) and by_t[14].depends_on == ((0, 14),)
    assert by_t[24].regulariser == (0, 16) and by_t[24].trained_on == (16, 24)
    # Single steps chain to f_c (the doubling at 24), not to each other: (24, 26] is unused at 28.
    assert by_t[28].regulariser == (16, 24) and by_t[28].trained_on == (26, 28)
    assert by_t[28].depends_on == ((0, 24), (26, 28))
    assert by_t[28].window == (0, 28)
    assert cont.state_size()[1] <= 2


def test_continual_single_step_ignores_records_between_tc_and_the_block():
    # §4.2 item 12 with b0 = 1, B = 4: base@4, doubling@5,6, single@7, base@8, doubling@9,10,
    # single@11, doubling@12, single@13,14,15. At t = 14, t_c = 12 and (t_c, t − b0] = (12, 13].
    def run(perturb):
        cont = ContinualERMMechanism(1.0, 1, 4, lam=0.5, rng=123, **UNIT)
        X, y = data(16, seed=9)
        X, y = X.copy(), y.copy()
        if perturb:
            X[12], y[12] = [5.0, -5.0], 1 - y[12]      # record 13
        out = {}
        for c in range(14):
            for r in cont.step(X[c:c + 1], y[c:c + 1]):
                out[r.t] = r
        return out

    base, moved = run(False), run(True)
    assert base[14].kind == "single" and base[14].depends_on == ((0, 12), (13, 14))
    np.testing.assert_array_equal(base[14].params, moved[14].params)
    # Positive control: the single step at t = 13 is trained on record 13 and changes.
    assert base[13].depends_on == ((0, 13),)
    assert not np.array_equal(base[13].params, moved[13].params)
