"""LockstepTrees: many scalar tree streams stepped as one array, bit for bit their own steps."""

import math
import pickle

import numpy as np
import pytest

from dp_beam.mechanisms import BinaryTreeMechanism, SeededNoise, ZeroNoise
from dp_beam.mechanisms.counting import LockstepBLT, LockstepStreams, LockstepTrees, lockstep_of
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

KEY = NoiseKey.from_bytes(bytes(range(32)))


def _keyed(j, step):
    return KeyedNoise(KEY, ("lockstep", j)).for_identity(step, "step")


def _seeded(j, step):
    return SeededNoise(1000 * j + step)


def _inputs(n, steps):
    # Mixed magnitudes and signs: off-grid fractions, exact zeros, and values so large
    # that the grid rounding keeps them as they are (beyond 2^53 grid steps).
    rng = np.random.default_rng(7)
    out = []
    for s in range(steps):
        row = []
        for j in range(n):
            kind = (s + j) % 5
            if kind == 0:
                row.append(0.0)
            elif kind == 1:
                row.append(float(rng.normal()) * 1e-9)
            elif kind == 2:
                row.append(float(rng.integers(0, 5)))
            elif kind == 3:
                row.append(float(rng.normal()) * 1e17)
            else:
                row.append(-0.3 * j)
        out.append(row)
    return out


def _streams(n, horizon, noise="laplace", **kw):
    delta = 1e-6 if noise == "gaussian" else None
    return [BinaryTreeMechanism(1.0, horizon=horizon, noise=noise, delta=delta, **kw)
            for _ in range(n)]


def _own_steps(mechanisms, inputs, source, first=0):
    """Each stream stepped on its own, as a per-key release does."""
    out = []
    for s, row in enumerate(inputs, start=first):
        values = []
        for j, (m, x) in enumerate(zip(mechanisms, row)):
            m.set_noise_source(source(j, s))
            values.append(m.step(x))
        out.append(values)
    return out


def _lock_steps(lock, inputs, source, first=0):
    return [lock.step(row, [source(j, s) for j in range(len(row))])
            for s, row in enumerate(inputs, start=first)]


def _bits(rows):
    return [[v.hex() for v in row] for row in rows]


@pytest.mark.parametrize("horizon,steps", [(1, 1), (2, 2), (7, 7), (8, 8), (72, 72), (300, 300),
                                           (None, 1), (None, 130), (None, 520)])
@pytest.mark.parametrize("source", [_keyed, _seeded], ids=["keyed", "seeded"])
def test_releases_are_each_streams_own_bit_for_bit(horizon, steps, source):
    """Bounded horizons (a 300-step tree sums 8 live nodes at t = 255, the pairwise branch),
    and unbounded streams across several epochs; keyed (exact-grid) and seeded sources."""
    n = 5
    inputs = _inputs(n, steps)
    own = _own_steps(_streams(n, horizon), inputs, source)
    lock = LockstepTrees(_streams(n, horizon))
    assert _bits(_lock_steps(lock, inputs, source)) == _bits(own)
    assert lock.t == steps


def test_gaussian_node_noise_and_mixed_sources():
    """Gaussian tree nodes; streams whose sources differ in exact_grid round only where theirs
    is exact-grid, as each stream's own step does."""
    n, steps = 4, 20
    inputs = _inputs(n, steps)

    def mixed(j, s):
        return _keyed(j, s) if j % 2 else SeededNoise(j * 100 + s)

    own = _own_steps(_streams(n, 32, noise="gaussian"), inputs, mixed)
    lock = LockstepTrees(_streams(n, 32, noise="gaussian"))
    assert _bits(_lock_steps(lock, inputs, mixed)) == _bits(own)


@pytest.mark.parametrize("horizon", [40, None])
def test_starts_from_and_writes_back_each_streams_state(horizon):
    """Streams stepped on their own first (the list path's nodes included), then together,
    then on their own again: the same releases and states as streams never stepped together."""
    n = 3
    inputs = _inputs(n, 30)
    plain = _streams(n, horizon)
    expected = _own_steps(plain, inputs, _keyed)

    mixed = _streams(n, horizon)
    got = _own_steps(mixed, inputs[:5], _keyed)
    lock = LockstepTrees(mixed)
    got += _lock_steps(lock, inputs[5:17], _keyed, first=5)
    assert [m.t for m in mixed] == [5] * n           # unchanged until written back
    lock.write_back()
    got += _own_steps(mixed, inputs[17:], _keyed, first=17)
    assert _bits(got) == _bits(expected)
    for a, b in zip(plain, mixed):
        assert a.to_state() == b.to_state()


def test_written_back_streams_keep_their_last_source():
    """As after its own steps, a stream's source is the one of its last draw (its counter
    advanced), so a draw after write_back is the next one of that source."""
    n = 2
    own = _streams(n, 16)
    _own_steps(own, _inputs(n, 3), _keyed)
    together = _streams(n, 16)
    lock = LockstepTrees(together)
    _lock_steps(lock, _inputs(n, 3), _keyed)
    lock.write_back()
    for a, b in zip(own, together):
        assert a._source.draws == b._source.draws == 1
        assert a._source.identity == b._source.identity


def test_zero_noise_gives_the_running_sums():
    lock = LockstepTrees([BinaryTreeMechanism(1.0, horizon=None, rng=ZeroNoise()) for _ in range(3)])
    totals = [lock.step([1.0, 2.0, 0.5], [ZeroNoise()] * 3) for _ in range(9)]
    assert totals[-1] == [9.0, 18.0, 4.5]


def test_eligibility():
    a, b = _streams(2, 8)
    assert LockstepTrees.eligible([a, b])
    assert not LockstepTrees.eligible([])
    assert not LockstepTrees.eligible([a, BinaryTreeMechanism(2.0, horizon=8)])        # epsilon
    assert not LockstepTrees.eligible([a, BinaryTreeMechanism(1.0, horizon=16)])       # horizon
    assert not LockstepTrees.eligible([a, BinaryTreeMechanism(1.0, horizon=8, dim=2)])
    assert not LockstepTrees.eligible([BinaryTreeMechanism(1.0, horizon=8, dim=2)] * 2)

    class Sub(BinaryTreeMechanism):
        pass

    assert not LockstepTrees.eligible([a, Sub(1.0, horizon=8)])
    b.set_noise_source(ZeroNoise())
    b.step(1.0)
    assert not LockstepTrees.eligible([a, b])                                         # step count
    with pytest.raises(ValueError, match="same step count"):
        LockstepTrees([a, b])


class _FailingAt(KeyedNoise):
    """A keyed source whose draw raises (as an over-long draw would)."""

    def float_noise(self, kind, scale, size):
        raise OverflowError("planted")


def test_a_step_that_raises_leaves_every_stream_unchanged():
    n = 3
    inputs = _inputs(n, 6)
    expected = _own_steps(_streams(n, None), inputs, _keyed)
    lock = LockstepTrees(_streams(n, None))
    got = _lock_steps(lock, inputs[:3], _keyed)
    bad = [_keyed(0, 3), _keyed(1, 3), _keyed(2, 3)]
    bad[1].__class__ = _FailingAt
    with pytest.raises(OverflowError, match="planted"):
        lock.step(inputs[3], bad)
    with pytest.raises(ValueError, match="finite"):
        lock.step([1.0, math.nan, 0.0], [_keyed(j, 3) for j in range(n)])
    with pytest.raises(ValueError, match="one entry per stream"):
        lock.step([1.0, 2.0], [_keyed(j, 3) for j in range(2)])
    assert lock.t == 3
    got += _lock_steps(lock, inputs[3:], _keyed, first=3)
    assert _bits(got) == _bits(expected)


def test_the_horizon_is_enforced():
    lock = LockstepTrees(_streams(2, 2))
    for _ in range(2):
        lock.step([1.0, 1.0], [ZeroNoise()] * 2)
    with pytest.raises(ValueError, match="horizon exceeded"):
        lock.step([1.0, 1.0], [ZeroNoise()] * 2)
    assert lock.t == 2


@pytest.mark.parametrize("k", [-30, -1, 0, 3, -1074])
def test_array_rounding_is_round_on_exponent_elementwise(k):
    """The array rounding is the scalar one element by element, down to the sign of zero
    (round() gives the int 0, so -0.3 grid steps round to +0.0): ties to even, values
    beyond 2^53 grid steps or whose scaling overflows kept as they are, subnormals."""
    from dp_beam.mechanisms.counting.tree import _round_on_exponent
    from dp_beam.mechanisms.noise_grid import round_on_exponent

    step = math.ldexp(1.0, k)
    values = [0.0, -0.0, -0.3 * step, 0.3 * step, 0.5 * step, 1.5 * step, 2.5 * step, -2.5 * step,
              1e300, -1e300, 1.7e308, 5e-324, -5e-324, 2.0 ** 60 * step + step, 0.1, -7.75, 3e17]
    got = _round_on_exponent(np.array(values), k).tolist()
    assert [v.hex() for v in got] == [round_on_exponent(v, k).hex() for v in values]


def _counter(cls, horizon, noise):
    delta = 1e-6 if noise == "gaussian" else None
    return cls(1.0, horizon=horizon, noise=noise, delta=delta)


@pytest.mark.parametrize("name,noise,kind", [
    ("BLTMechanism", "gaussian", "LockstepBLT"), ("HonakerTreeMechanism", "laplace", "LockstepStreams"),
    ("SmoothBinaryMechanism", "gaussian", "LockstepStreams"),
    ("SqrtToeplitzMechanism", "gaussian", "LockstepStreams")])
@pytest.mark.parametrize("horizon,steps", [(20, 20), (72, 72), (None, 20), (None, 140)])
def test_other_counters_step_together_with_their_own_releases(name, noise, kind, horizon, steps):
    """Every other scalar counter steps together (BLT with its float post-processing on one
    array, the others by their own mechanisms): the releases of each stream's own steps,
    and the mechanisms end in their own states (unbounded: across several epochs)."""
    from dp_beam.mechanisms import counting

    cls = getattr(counting, name)
    n = 3
    inputs = _inputs(n, steps)
    own_streams = [_counter(cls, horizon, noise) for _ in range(n)]
    own = _own_steps(own_streams, inputs, _keyed)
    streams = [_counter(cls, horizon, noise) for _ in range(n)]
    lock = lockstep_of(streams)
    assert type(lock).__name__ == kind and lock.template is streams[0]
    got = _lock_steps(lock, inputs, _keyed)
    lock.write_back()
    assert _bits(got) == _bits(own) and lock.t == steps
    for a, b in zip(own_streams, streams):
        assert a.to_state() == b.to_state()


@pytest.mark.parametrize("horizon", [40, None])
def test_blt_streams_start_from_and_write_back_their_state(horizon):
    """BLT streams stepped on their own (their floats in a list or in the arrays), then
    together, then on their own again: each stream's releases and state."""
    from dp_beam.mechanisms import BLTMechanism

    n = 3
    inputs = _inputs(n, 36)
    plain = [_counter(BLTMechanism, horizon, "gaussian") for _ in range(n)]
    expected = _own_steps(plain, inputs, _keyed)
    mixed = [_counter(BLTMechanism, horizon, "gaussian") for _ in range(n)]
    got = _own_steps(mixed, inputs[:5], _keyed)
    mixed[0].to_state()                 # the array path's sync: its floats back in the arrays
    lock = LockstepBLT(mixed)
    got += _lock_steps(lock, inputs[5:20], _keyed, first=5)
    lock.write_back()
    got += _own_steps(mixed, inputs[20:], _keyed, first=20)
    assert _bits(got) == _bits(expected)
    for a, b in zip(plain, mixed):
        assert a.to_state() == b.to_state()


def test_a_blt_step_whose_draw_raises_leaves_every_stream_unchanged():
    from dp_beam.mechanisms import BLTMechanism

    class Failing(KeyedNoise):
        def integer_noise(self, kind, scale, exponent, size):
            raise OverflowError("planted")

    n = 3
    inputs = _inputs(n, 8)
    expected = _own_steps([_counter(BLTMechanism, 8, "gaussian") for _ in range(n)], inputs, _keyed)
    lock = LockstepBLT([_counter(BLTMechanism, 8, "gaussian") for _ in range(n)])
    got = _lock_steps(lock, inputs[:3], _keyed)
    bad = [_keyed(j, 3) for j in range(n)]
    bad[2].__class__ = Failing
    with pytest.raises(OverflowError, match="planted"):
        lock.step(inputs[3], bad)
    with pytest.raises(ValueError, match="finite"):
        lock.step([1.0, math.inf, 0.0], [_keyed(j, 3) for j in range(n)])
    assert lock.t == 3
    got += _lock_steps(lock, inputs[3:], _keyed, first=3)
    assert _bits(got) == _bits(expected)
    with pytest.raises(ValueError, match="horizon exceeded"):
        lock.step(inputs[0], [_keyed(j, 9) for j in range(n)])


def test_lockstep_picks_the_array_path_for_trees_and_refuses_mixed_streams():
    from dp_beam.mechanisms import BLTMechanism, HonakerTreeMechanism

    assert type(lockstep_of(_streams(2, 8))) is LockstepTrees
    blt = [_counter(BLTMechanism, 8, "gaussian") for _ in range(2)]
    assert type(lockstep_of(blt)) is LockstepBLT
    assert not LockstepBLT.eligible([]) and not LockstepBLT.eligible(_streams(2, 8))
    honaker = [_counter(HonakerTreeMechanism, 8, "laplace") for _ in range(2)]
    assert type(lockstep_of(honaker)) is LockstepStreams
    assert lockstep_of([]) is None
    assert lockstep_of([_streams(1, 8)[0], blt[0]]) is None                        # classes
    assert lockstep_of([blt[0], _counter(BLTMechanism, 16, "gaussian")]) is None    # parameters
    assert lockstep_of([BinaryTreeMechanism(1.0, horizon=8, dim=2)] * 2) is None    # vectors
    assert lockstep_of([BLTMechanism(1.0, horizon=8, noise="gaussian", delta=1e-6, dim=2)] * 2) is None
    blt[1].set_noise_source(ZeroNoise())
    blt[1].step(1.0)
    assert lockstep_of(blt) is None                                                  # step counts
    with pytest.raises(ValueError, match="same step count"):
        LockstepStreams(blt)
    with pytest.raises(ValueError, match="same step count"):
        LockstepBLT(blt)
    with pytest.raises(ValueError, match="one entry per stream"):
        LockstepStreams(blt[:1]).step([1.0, 2.0], [ZeroNoise()])
    with pytest.raises(ValueError, match="one entry per stream"):
        LockstepBLT(blt[:1]).step([1.0, 2.0], [ZeroNoise()])


def test_streams_stepped_in_place_keep_a_partly_failed_step_after_write_back():
    """LockstepStreams steps each mechanism in place: when the second stream's draw raises,
    the first has taken the step and the others have not, and write_back keeps exactly
    that (it would undo the first stream's step if it wrote a shared step count back)."""
    from dp_beam.mechanisms import HonakerTreeMechanism

    class Failing(KeyedNoise):
        def laplace(self, scale, size=None):
            raise OverflowError("planted")

        float_noise = laplace

    n = 3
    inputs = _inputs(n, 4)
    streams = [_counter(HonakerTreeMechanism, 8, "laplace") for _ in range(n)]
    lock = LockstepStreams(streams)
    _lock_steps(lock, inputs[:2], _keyed)
    bad = [_keyed(j, 2) for j in range(n)]
    bad[1].__class__ = Failing
    with pytest.raises(OverflowError, match="planted"):
        lock.step(inputs[2], bad)
    lock.write_back()
    assert [m.t for m in streams] == [3, 2, 2] and lock.t == 3


def _blt_streams(n, horizon):
    from dp_beam.mechanisms import BLTMechanism

    return [_counter(BLTMechanism, horizon, "gaussian") for _ in range(n)]


@pytest.mark.parametrize("kind", ["tree", "blt"])
@pytest.mark.parametrize("horizon,steps,cut", [(72, 72, 0), (72, 72, 30), (None, 130, 0),
                                               (None, 130, 63), (None, 130, 64), (None, 130, 65)])
def test_streams_held_as_arrays_continue_and_split_bit_for_bit(kind, horizon, steps, cut):
    """A streaming shard keeps its tree or BLT streams as their arrays only: rebuilt from
    ``arrays()`` at every step (no mechanism per stream), they release each stream's own
    values, and ``stream_state(j)`` is stream j's own ``to_state()`` after the same steps,
    at any step (unbounded: at and around an epoch's end, between two epochs)."""
    make, cls = (_streams, LockstepTrees) if kind == "tree" else (_blt_streams, LockstepBLT)
    n = 4
    inputs = _inputs(n, steps)
    own = make(n, horizon)
    expected = _own_steps(own, inputs[:cut], _keyed)
    states_at_cut = [m.to_state() for m in own]
    expected += _own_steps(own, inputs[cut:], _keyed, first=cut)
    template = make(1, horizon)[0]
    lock = cls(make(n, horizon))
    got = []
    for s, row in enumerate(inputs):
        if s == cut:
            assert [lock.stream_state(j) for j in range(n)] == states_at_cut
        arrays = pickle.loads(pickle.dumps(lock.arrays()))      # as a state cell stores it
        lock = cls.from_arrays(template, arrays)
        got.append(lock.step(row, [_keyed(j, s) for j in range(n)]))
    assert _bits(got) == _bits(expected)
    assert [lock.stream_state(j) for j in range(n)] == [m.to_state() for m in own]
    assert lock.t == steps and len(lock) == n and lock.template is template
    lock.write_back()                                           # no mechanisms: nothing to write


def test_arrays_are_checked_against_the_template():
    from dp_beam.mechanisms import BLTMechanism

    bounded = LockstepTrees(_streams(3, 8)).arrays()
    unbounded = LockstepTrees(_streams(3, None)).arrays()
    with pytest.raises(ValueError, match="template"):
        LockstepTrees.from_arrays(BLTMechanism(1.0, horizon=8, noise="gaussian", delta=1e-6),
                                  bounded)
    with pytest.raises(ValueError, match="template"):
        LockstepTrees.from_arrays(BinaryTreeMechanism(1.0, horizon=8, dim=2), bounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepTrees.from_arrays(_streams(1, 16)[0], bounded)         # another horizon
    with pytest.raises(ValueError, match="arrays"):
        LockstepTrees.from_arrays(_streams(1, 8)[0], unbounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepTrees.from_arrays(_streams(1, None)[0], bounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepTrees.from_arrays(_streams(1, 8)[0], {**bounded, "t": 9})
    blt_bounded = LockstepBLT(_blt_streams(3, 8)).arrays()
    blt_unbounded = LockstepBLT(_blt_streams(3, None)).arrays()
    with pytest.raises(ValueError, match="template"):
        LockstepBLT.from_arrays(_streams(1, 8)[0], blt_bounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepBLT.from_arrays(_blt_streams(1, 8)[0], {**blt_bounded, "t": 9})
    with pytest.raises(ValueError, match="arrays"):
        LockstepBLT.from_arrays(_blt_streams(1, 8)[0],
                                {**blt_bounded, "floats": blt_bounded["floats"][1:]})
    with pytest.raises(ValueError, match="arrays"):
        LockstepBLT.from_arrays(_blt_streams(1, 8)[0], blt_unbounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepBLT.from_arrays(_blt_streams(1, None)[0], blt_bounded)
    with pytest.raises(ValueError, match="arrays"):
        LockstepBLT.from_arrays(_blt_streams(1, 8)[0], {**blt_bounded, "right": []})


@pytest.mark.parametrize("name,noise", [("BinaryTreeMechanism", "laplace"),
                                        ("BLTMechanism", "gaussian"),
                                        ("HonakerTreeMechanism", "laplace")])
def test_write_counts_gives_the_step_counts_only(name, noise):
    """Between steps ``write_counts`` gives every mechanism its step count, so its public
    figures at ``m.t`` are those of its own steps, and the releases and states after
    ``write_back`` are unchanged by it (a counter stepped in place keeps its own count)."""
    from dp_beam.mechanisms import counting

    cls = getattr(counting, name)
    n, steps = 3, 12
    inputs = _inputs(n, steps)
    own_streams = [_counter(cls, None, noise) for _ in range(n)]
    own = _own_steps(own_streams, inputs, _keyed)
    streams = [_counter(cls, None, noise) for _ in range(n)]
    lock = lockstep_of(streams)
    got = []
    for s, row in enumerate(inputs):
        got += _lock_steps(lock, [row], _keyed, first=s)
        lock.write_counts()
        assert [m.t for m in streams] == [s + 1] * n
        assert [m.ci_halfwidth(m.t) for m in streams] == [own_streams[0].ci_halfwidth(s + 1)] * n
    lock.write_back()
    assert _bits(got) == _bits(own)
    for a, b in zip(own_streams, streams):
        assert a.to_state() == b.to_state()
