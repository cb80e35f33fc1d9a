"""The shortcuts of a keyed draw read exactly the documented streams.

``KeyedNoise`` hashes its first draw without keeping a prefix state, later draws from a kept
prefix, and ``NoiseKey`` starts every stream from a cached state that has absorbed the key;
draw n of identity I must still read ``noise_key.stream(*I, n)``, itself pinned against
hashlib in ``test_noise_key.py``.
"""

import pickle

from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

KEY = NoiseKey.from_bytes(bytes(range(32)))


def _bits(stream):
    return stream.randbits(1500)


def test_every_draw_reads_its_documented_stream():
    parent = KeyedNoise(KEY, ("c", "key-1"))
    for source in (parent, parent.for_identity(7, "step"), KeyedNoise(KEY, ("c", "key-1", 7, "step"))):
        for n in range(4):
            assert _bits(source._next_stream()) == _bits(KEY.stream(*source.identity, n))
    # A pickled source continues with its counter (its hash states are rebuilt).
    source = parent.for_identity(8, "step")
    source._next_stream()
    restored = pickle.loads(pickle.dumps(source))
    assert _bits(restored._next_stream()) == _bits(KEY.stream("c", "key-1", 8, "step", 1))


def test_keys_share_no_cached_state():
    other = NoiseKey.from_bytes(bytes(range(1, 33)))
    assert _bits(KEY.stream("a")) != _bits(other.stream("a"))
    assert _bits(pickle.loads(pickle.dumps(KEY)).stream("a")) == _bits(KEY.stream("a"))


def test_draws_are_the_same_values_as_a_fresh_source():
    """One source per step (a release) and a source rebuilt for every draw give the same ints."""
    parent = KeyedNoise(KEY, ("blt", "k"))
    for step in range(20):
        child = parent.for_identity(step, "step")
        fresh = KeyedNoise(KEY, ("blt", "k", step, "step"))
        assert child.integer_noise("gaussian", 3.5, -60, 1) == fresh.integer_noise("gaussian", 3.5, -60, 1)
        assert child.integer_noise("laplace", 3.5, -40, 3) == fresh.integer_noise("laplace", 3.5, -40, 3)


def _reference_gaussian(stream, p, q):
    """CKS20 Algorithm 3 written plainly with the public samplers (no inlined coins)."""
    import math

    from dp_beam.mechanisms.exact_samplers import bernoulli_exp, discrete_laplace

    t = math.isqrt(p // q) + 1
    while True:
        y = discrete_laplace(stream, t, 1)
        if bernoulli_exp(stream, (abs(y) * q * t - p) ** 2, 2 * p * q * t * t):
            return y


def test_discrete_gaussian_reads_the_bits_of_the_plain_algorithm():
    """Same values and same stream position (the next draw continues alike) as the plain
    algorithm, from σ² below 1 to BLT's integer scales of 2^60 and more."""
    from dp_beam.mechanisms.exact_samplers import discrete_gaussian

    for p, q in [(1, 3), (9, 4), (7, 3), (2**61 + 1, 1), (3**80, 2**9), (2**127 - 1, 1)]:
        for i in range(150):
            fast, plain = KEY.stream("dg", p, q, i), KEY.stream("dg", p, q, i)
            assert discrete_gaussian(fast, p, q) == _reference_gaussian(plain, p, q)
            assert fast.randbits(64) == plain.randbits(64)
