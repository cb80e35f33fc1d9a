"""The block log (dp_beam.mechanisms.erm.log; spec §3: small state rewritten per firing, blocks
in a durable log).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import json

import numpy as np
import pytest

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import (
    BlockLog,
    ContinualERMMechanism,
    MultiResolutionERMMechanism,
    SlidingWindowERMMechanism,
)

from .helpers import UNIT, data


class RecordingLog(BlockLog):
    """A log outside the stream's state that records what the stream asks of it.

    Released blocks are deleted at once, so a read of a block the stream said
    it would never need again fails (KeyError).
    """

    def __init__(self):
        self.blocks = {}
        self.reads = []          # (block being completed, lo, hi)
        self.now = 0

    def append(self, index, block):
        self.now = index
        self.blocks[index] = block

    def read(self, lo, hi):
        self.reads.append((self.now, lo, hi))
        return [self.blocks[b] for b in range(lo + 1, hi + 1)]

    def release_before(self, keep):
        for b in [b for b in self.blocks if b < keep]:
            del self.blocks[b]


STREAMS = {
    "continual": lambda rng, log=None: ContinualERMMechanism(1.0, 2, 4, lam=0.5, rng=rng, log=log, **UNIT),
    "sliding": lambda rng, log=None: SlidingWindowERMMechanism(1.0, 2, 14, lam=0.5, rng=rng, log=log, **UNIT),
    "multires": lambda rng, log=None: MultiResolutionERMMechanism(1.0, 2, lam=0.5, rng=rng, log=log, **UNIT),
    "multires_capped": lambda rng, log=None: MultiResolutionERMMechanism(1.0, 2, lam=0.5, max_scale=2, rng=rng,
                                                                log=log, **UNIT),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_external_log_gives_the_same_releases_bit_for_bit(name):
    # The engine path: the small state round-trips through JSON after every
    # block (a firing) and the blocks stay in the log; the default keeps them
    # in memory and never restores. Same seed, same releases, bit for bit.
    make = STREAMS[name]
    X, y = data(2 * 40, seed=21)
    a = make(np.random.default_rng(8))
    gen = np.random.default_rng(8)
    log = RecordingLog()
    b = make(gen, log)
    n = 0
    for c in range(40):
        ra = a.step(X[2 * c:2 * c + 2], y[2 * c:2 * c + 2])
        rb = b.step(X[2 * c:2 * c + 2], y[2 * c:2 * c + 2])
        assert ra == rb
        for r1, r2 in zip(ra, rb):
            np.testing.assert_array_equal(r1.params, r2.params)
        n += len(ra)
        state = json.loads(json.dumps(b.to_state()))
        assert "blocks" not in state and state["log"] == "external"
        b = type(b).from_state(state, rng=gen, log=log)
    assert n >= 30
    with pytest.raises(ValueError, match="log"):
        type(b).from_state(b.to_state())


def _numbers(obj):
    """How many numbers a (JSON-like) state holds."""
    if isinstance(obj, dict):
        return sum(_numbers(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_numbers(v) for v in obj)
    return int(isinstance(obj, (int, float)) and not isinstance(obj, bool))


@pytest.mark.parametrize("name,max_models", [("continual", 2), ("sliding", 3), ("multires", 0),
                                             ("multires_capped", 0)])
def test_small_state_is_bounded_whatever_t(name, max_models):
    # 64 blocks: the small state must not grow with t. Bound: the partial block
    # ((b0 − 1)·(d + 1) numbers), the models (p parameters plus < 24 numbers of
    # intervals and noise description each; the sliding window W = 7 keeps
    # log2(W + 1) = 3) and a few counters and configuration values (< 40).
    b0, d, p = 2, 2, 2
    stream = STREAMS[name](ZeroNoise(), RecordingLog())
    X, y = data(b0 * 64 + 1, seed=5)
    sizes = []
    for i in range(b0 * 64 + 1):
        stream.push(X[i], y[i])
        state = stream.to_state()
        sizes.append((i + 1, _numbers(state), len(json.dumps(state))))
        assert stream.state_size()[1] <= max_models
    bound = (b0 - 1) * (d + 1) + max_models * (p + 24) + 40
    assert max(n for _, n, _ in sizes) <= bound
    # Same count of numbers late as early (no hidden history), and the encoded
    # size grows only by the width of the counters (a few digits).
    early = [s for s in sizes if 16 * b0 < s[0] <= 32 * b0]
    late = [s for s in sizes if s[0] > 48 * b0]
    assert max(n for _, n, _ in late) <= max(n for _, n, _ in early)
    assert max(b for _, _, b in late) <= max(b for _, _, b in early) + 64
    if name in ("continual", "multires"):
        # The self-contained state of the same stream holds all t points: the
        # measure above would see it.
        full = STREAMS[name](ZeroNoise())
        full.extend(X, y)
        assert _numbers(full.to_state()) >= 64 * b0 * (d + 1)


def _retained_and_reads(make, n_blocks, block=2, seed=3):
    log = RecordingLog()
    stream = make(ZeroNoise(), log)
    X, y = data(block * n_blocks, seed=seed)
    retained, trained = [], []
    for c in range(1, n_blocks + 1):
        stream.step(X[block * (c - 1):block * c], y[block * (c - 1):block * c])
        retained.append(stream.retained_blocks)
        assert sorted(log.blocks) == list(range(retained[-1][0], c + 1))
        trained.append({(m.trained_on[0] // block, m.trained_on[1] // block) for m in stream.trained_last_step})
    return log, retained, trained


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_log_retains_what_future_trainings_need_and_is_read_only_for_trainings(name):
    n = 48
    log, retained, trained = _retained_and_reads(STREAMS[name], n)
    for c, (first, last) in enumerate(retained, start=1):
        assert last == c
        if name in ("continual", "multires"):
            assert first == 1                       # the base / top scale trains on (0, t]
        elif name == "sliding":
            assert first == max(1, c - 7 + 2)       # the W − 1 = 6 newest blocks
        else:
            assert first == (c // 4) * 4 + 1       # the current aligned interval of 2^2 blocks
    # Every read is of exactly the data a model of that firing trains on, and
    # firings whose models train only on the new block read nothing older.
    for c, lo, hi in log.reads:
        assert (lo, hi) in trained[c - 1]
    old_readers = {c for c, lo, hi in log.reads if lo + 1 < c}
    assert old_readers == {c for c in range(1, n + 1) if any(lo + 1 < c for lo, hi in trained[c - 1])}
    assert old_readers and len(old_readers) < n


@pytest.mark.parametrize("name,shift", [("sliding", 1), ("multires_capped", 1)])
def test_log_retention_is_tight(name, shift):
    # Releasing one block earlier than the bound breaks a later training: the
    # retained blocks are exactly what the algorithm needs.
    make = STREAMS[name]

    def shrunk(rng, log):
        stream = make(rng, log)
        retain = stream._retain_from
        stream._retain_from = lambda c: retain(c) + shift
        return stream

    with pytest.raises(KeyError):
        _retained_and_reads(shrunk, 48)
