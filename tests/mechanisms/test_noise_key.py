"""Keyed reproducible noise (dp_beam.mechanisms.noise_key).

Every key here is fixed, so every test is deterministic: a statistical test
either always passes or always fails. Tolerances are still taken from theory
so that a correct sampler passes for all but a negligible fraction of keys:
moment checks allow 5 standard errors of the estimator (two-sided
probability ~6e-7 under a normal approximation), goodness-of-fit tests
require a p-value above 1e-6, and frequency checks use a Clopper-Pearson
interval of confidence 1 − 1e-6.
"""

import base64
import hashlib
import math
import os
import pickle
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import NoiseSource
from dp_beam.mechanisms.noise_grid import (
    grid_laplace,
)
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey, encode_identity

KEY_BYTES = bytes(range(32))
KEY = NoiseKey.from_bytes(KEY_BYTES)
OTHER_KEY = NoiseKey.from_bytes(bytes(range(1, 33)))
REPO_ROOT = Path(__file__).resolve().parents[2]


def _tol(std_of_estimate):
    return 5.0 * std_of_estimate


# -- identity encoding and the bit stream -----------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        (("a", "bc"), ("ab", "c")),
        ((1,), ("1",)),
        ((1,), (1.0,)),
        (("1",), (1.0,)),
        ((True,), (1,)),
        ((None,), ()),
        ((b"a",), ("a",)),
        ((("a", "b"),), ("a", "b")),
        ((("a",),), (["a"],)),
        ((0.0,), (-0.0,)),
        ((1, 2), (12,)),
        ((-1,), (255,)),
    ],
)
def test_identity_encoding_is_unambiguous(a, b):
    assert encode_identity(a) != encode_identity(b)
    assert KEY.stream(*a).randbytes(32) != KEY.stream(*b).randbytes(32)


def test_identity_encoding_of_numpy_scalars_matches_python():
    assert encode_identity((np.int64(7), np.float64(0.5), np.bool_(True))) == encode_identity((7, 0.5, True))


def _documented(label):
    # The encoding as encode_identity's docstring states it, one item at a time.
    if isinstance(label, tuple):
        return (b"T" + len(label).to_bytes(8, "big")
                + b"".join(_documented(item) for item in label))
    if isinstance(label, (float, np.floating)):
        return b"F" + struct.pack(">d", float(label))
    body = int(label).to_bytes((int(label).bit_length() + 8) // 8, "big", signed=True)
    return b"I" + len(body).to_bytes(8, "big") + body


@pytest.mark.parametrize("label", [
    0.5, -0.0, math.inf, 5e-324, (), (0.25,), (1.0, -0.0, math.inf, 5e-324, -1e308),
    tuple(np.linspace(-1, 1, 100).tolist()), (0.5, np.float64(0.25)), (np.float64(2.0),) * 3,
    (0.5, np.float32(0.25)), (0.5, 1), (1, 0.5), ((0.5, 0.25), 0.125),
])
def test_float_labels_and_vectors_encode_item_by_item(label):
    # Floats and all-float tuples (ERM features) take a packed fast path; its bytes
    # must be those of the documented item-by-item encoding, and so must every
    # tuple that mixes in other types.
    assert encode_identity((label,)) == b"T" + (1).to_bytes(8, "big") + _documented(label)


@pytest.mark.parametrize("bad", [object(), Fraction(1, 2), {"a": 1}, {1, 2}, 1j])
def test_identity_rejects_other_types(bad):
    with pytest.raises(ValueError, match="identity labels"):
        KEY.stream("x", bad)
    with pytest.raises(ValueError, match="identity labels"):
        KeyedNoise(KEY, ("x", (bad,)))


def test_stream_is_keyed_blake2b_in_counter_mode():
    # The documented construction, recomputed with hashlib directly.
    identity = ("release", "k", 3)
    prefix = encode_identity(identity)

    def block(i):
        return hashlib.blake2b(
            prefix + i.to_bytes(8, "big"), key=KEY_BYTES, digest_size=64, person=b"dp_beam.noise.v1"
        ).digest()

    stream = KEY.stream(*identity)
    # 100 bytes cross the block boundary; bits are read big-endian in order.
    assert stream.randbytes(100) == block(0) + block(1)[:36]
    stream = KEY.stream(*identity)
    assert stream.randbits(4) == block(0)[0] >> 4
    assert stream.randbits(12) == ((block(0)[0] & 0xF) << 8) | block(0)[1]


def test_streams_differ_by_identity_and_key_and_repeat_otherwise():
    a = KEY.stream("t", "k", 1).randbytes(64)
    assert a == KEY.stream("t", "k", 1).randbytes(64)
    assert a != KEY.stream("t", "k", 2).randbytes(64)
    assert a != OTHER_KEY.stream("t", "k", 1).randbytes(64)


def test_randbelow_is_uniform_and_validated():
    stream = KEY.stream("uniform")
    n, m = 7, 70000
    counts = np.bincount([stream.randbelow(n) for _ in range(m)], minlength=n)
    assert stats.chisquare(counts).pvalue > 1e-6
    assert stream.randbelow(1) == 0
    with pytest.raises(ValueError, match="n must be"):
        stream.randbelow(0)
    with pytest.raises(ValueError, match="k must be"):
        stream.randbits(-1)
    assert stream.randbits(0) == 0


def test_fingerprint_is_a_separate_domain():
    # The fingerprint is not a prefix of any noise block.
    assert KEY.fingerprint == hashlib.blake2b(
        b"", key=KEY_BYTES, digest_size=4, person=b"dp_beam.fprnt.v1"
    ).hexdigest()
    assert KEY.fingerprint != KEY.stream().randbytes(4).hex()
    assert KEY.fingerprint != OTHER_KEY.fingerprint


# -- KeyedNoise --------------------------------------------------------------------


def test_keyed_noise_is_a_secure_noise_source():
    source = KeyedNoise(KEY, ("t",))
    assert isinstance(source, NoiseSource)
    assert source.secure is True
    out = source.laplace(1.0, 4)
    assert out.shape == (4,) and out.dtype == np.float64


def _variance_tolerance(var, excess_kurtosis, n):
    # Var(sample second moment) = σ⁴(2 + κ)/n with κ the excess kurtosis
    # (3 for Laplace, 0 for Gaussian); 5 standard errors.
    return _tol(var * math.sqrt((2.0 + excess_kurtosis) / n))


@pytest.mark.parametrize("b", [0.3, 1.5, 1000.0])
def test_keyed_laplace_has_std_sqrt2_b(b):
    n = 20000
    draws = KeyedNoise(KEY, ("lap", b)).laplace(b, n)
    var = 2 * b * b
    assert abs(draws.mean()) < _tol(math.sqrt(var / n))
    assert abs(np.mean(draws**2) - var) < _variance_tolerance(var, 3.0, n)
    assert stats.kstest(draws, "laplace", args=(0.0, b)).pvalue > 1e-6


@pytest.mark.parametrize("sigma", [0.3, 2.5, 1000.0])
def test_keyed_gaussian_has_std_sigma(sigma):
    n = 20000
    draws = KeyedNoise(KEY, ("gauss", sigma)).gaussian(sigma, n)
    var = sigma * sigma
    assert abs(draws.mean()) < _tol(math.sqrt(var / n))
    assert abs(np.mean(draws**2) - var) < _variance_tolerance(var, 0.0, n)
    assert stats.kstest(draws, "norm", args=(0.0, sigma)).pvalue > 1e-6


def _direction_statistics(directions):
    """(max |mean of a coordinate|, max |mean of a squared coordinate − 1/p|) over n draws."""
    n, p = directions.shape
    return np.max(np.abs(directions.mean(axis=0))), np.max(np.abs((directions ** 2).mean(axis=0) - 1 / p))


@pytest.mark.parametrize("dim", [3, 10, 101])
def test_keyed_direction_is_a_uniform_unit_vector(dim):
    n = 6000
    source = KeyedNoise(KEY, ("dir", dim))
    U = np.array([source.direction(dim) for _ in range(n)])
    assert source.draws == n                                 # one stream per direction
    np.testing.assert_allclose(np.linalg.norm(U, axis=1), 1.0, rtol=1e-15, atol=0)
    # Uniform on the sphere: E U_j = 0 with Var U_j = 1/p, and E U_j² = 1/p with
    # Var U_j² = E U_j⁴ − 1/p² = 3/(p(p+2)) − 1/p²; 5 standard errors of a mean of n, for
    # every coordinate (a 5-sd excursion has probability 6e-7 each).
    mean_err, square_err = _direction_statistics(U)
    assert mean_err < _tol(math.sqrt(1 / (dim * n)))
    assert square_err < _tol(math.sqrt((3 / (dim * (dim + 2)) - 1 / dim ** 2) / n))
    if dim == 3:
        # Archimedes: a coordinate of a uniform point on S² is uniform on [−1, 1].
        assert stats.kstest(U[:, 2], "uniform", args=(-1.0, 2.0)).pvalue > 1e-6
    # The same test rejects a direction confined to the positive orthant (a planted bug).
    mean_err, _ = _direction_statistics(np.abs(U))
    assert mean_err > _tol(math.sqrt(1 / (dim * n)))


def test_keyed_direction_is_reproducible_and_reads_its_own_stream():
    a, b = KeyedNoise(KEY, ("t", "dir")), KeyedNoise(KEY, ("t", "dir"))
    first = a.direction(7)
    assert first.tobytes() == b.direction(7).tobytes()
    assert not np.array_equal(first, a.direction(7))         # the next call, the next stream
    # Box–Muller on the stream's 64-bit words (top 53 bits each), pairs in order; the odd
    # dimension drops the last sine.
    words = struct.unpack(">8Q", KEY.stream("t", "dir", 0).randbytes(64))
    g = []
    for i in range(0, 8, 2):
        r = math.sqrt(-2.0 * math.log1p(-(words[i] >> 11) * 2.0 ** -53))
        angle = 2.0 * math.pi * ((words[i + 1] >> 11) * 2.0 ** -53)
        g += [r * math.cos(angle), r * math.sin(angle)]
    g = np.array(g[:7])
    np.testing.assert_array_equal(first, g / math.hypot(*g))
    from dp_beam.mechanisms import SeededNoise
    for source in (a, SeededNoise(0)):
        for bad in (0, -1, True, 2.0):
            with pytest.raises(ValueError, match="dim"):
                source.direction(bad)


def _calls(source):
    return [source.laplace(1.7, 3), source.gaussian(0.3, 2), source.laplace(0.0, 2), source.laplace(250.0, 1)]


def test_keyed_noise_is_reproducible_per_identity_and_call_sequence():
    a = _calls(KeyedNoise(KEY, ("t", "k", 5)))
    b = _calls(KeyedNoise(KEY, ("t", "k", 5)))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    other = _calls(KeyedNoise(KEY, ("t", "k", 6)))
    other_key = _calls(KeyedNoise(OTHER_KEY, ("t", "k", 5)))
    assert not np.array_equal(a[0], other[0])
    assert not np.array_equal(a[0], other_key[0])
    # Successive calls read different streams.
    assert not np.array_equal(a[0][:1], a[3])


def test_keyed_noise_uses_one_stream_per_call():
    source = KeyedNoise(KEY, ("t", "k"))
    source.laplace(1.0, 1)
    second = source.laplace(2.0, 2)
    stream = KEY.stream("t", "k", 1)
    expected = [grid_laplace(stream, 2.0), grid_laplace(stream, 2.0)]
    np.testing.assert_array_equal(second, expected)
    # Zero scales and sizes still consume their counter value.
    source.gaussian(0.0, 3)
    source.laplace(1.0, 0)
    assert source.draws == 4


def test_float_noise_reads_the_stream_of_the_array_call():
    """The list draw a tree node takes reads the same stream and values as ``laplace`` and
    ``gaussian``, and counts as one call (zero scale and size included)."""
    lists, arrays = KeyedNoise(KEY, ("t", "floats")), KeyedNoise(KEY, ("t", "floats"))
    for kind, scale, size in (("laplace", 2.0, 1), ("gaussian", 3.5, 3), ("laplace", 0.0, 2),
                              ("gaussian", 1.0, 0), ("laplace", 1e-3, 4)):
        values = lists.float_noise(kind, scale, size)
        assert all(type(v) is float for v in values)
        assert [v.hex() for v in values] == [v.hex() for v in getattr(arrays, kind)(scale, size)]
    assert lists.draws == arrays.draws == 5
    stream = KEY.stream("t", "floats", 5)
    assert lists.float_noise("laplace", 2.0, 2) == [grid_laplace(stream, 2.0), grid_laplace(stream, 2.0)]
    with pytest.raises(ValueError, match="kind"):
        lists.float_noise("exponential", 1.0, 1)
    with pytest.raises(ValueError, match="sigma"):
        lists.float_noise("gaussian", -1.0, 1)


@pytest.mark.parametrize("draws", [0, 127, 128, 255, 256, 32767, 32768, 2**31, 2**63 + 5])
def test_keyed_noise_call_n_reads_the_stream_of_identity_plus_n(draws):
    # The counter label is encoded inline; its length grows at these boundaries.
    source = KeyedNoise.__new__(KeyedNoise)
    source.__setstate__({"noise_key": KEY, "identity": ("t", "counter"), "draws": draws})
    stream = KEY.stream("t", "counter", draws)
    expected = [grid_laplace(stream, 1.5) for _ in range(3)]
    np.testing.assert_array_equal(source.laplace(1.5, 3), expected)
    assert source.draws == draws + 1


def test_keyed_noise_survives_pickling_mid_stream():
    source = KeyedNoise(KEY, ("t", "pickle"))
    source.laplace(1.0, 2)
    restored = pickle.loads(pickle.dumps(source))
    assert restored.draws == 1 and restored.identity == source.identity
    np.testing.assert_array_equal(restored.gaussian(3.0, 4), source.gaussian(3.0, 4))
    np.testing.assert_array_equal(restored.laplace(0.5, 2), source.laplace(0.5, 2))


_SUBPROCESS_CODE = """
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
src = KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("subproc", 3, 1.5, None, b"x", ("n", -2)))
values = list(src.laplace(1.7, 4)) + list(src.gaussian(0.3, 4))
print(",".join(float(v).hex() for v in values))
"""


def test_keyed_noise_is_identical_in_a_fresh_interpreter():
    src = KeyedNoise(KEY, ("subproc", 3, 1.5, None, b"x", ("n", -2)))
    expected = ",".join(float(v).hex() for v in list(src.laplace(1.7, 4)) + list(src.gaussian(0.3, 4)))
    # Another hash seed proves nothing depends on hash() or dict order.
    env = dict(os.environ, PYTHONHASHSEED="12345")
    result = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_CODE], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, check=True,
    )
    assert result.stdout.strip() == expected


def test_for_identity_extends_the_identity_with_a_fresh_counter():
    parent = KeyedNoise(KEY, ("t",))
    parent.laplace(1.0, 1)
    child = parent.for_identity("step", 9)
    assert child.identity == ("t", "step", 9) and child.draws == 0
    np.testing.assert_array_equal(child.laplace(1.0, 2), KeyedNoise(KEY, ("t", "step", 9)).laplace(1.0, 2))
    with pytest.raises(ValueError, match="at least one label"):
        parent.for_identity()


def test_for_identity_step_labels_are_encoded_by_type(monkeypatch):
    """A release's (step, phase) labels are encoded once per pair and reused: the child
    must read the stream of its full identity, and a pair that compares equal but differs in
    type (1.0, True, a NumPy int) must not take another pair's encoding."""
    from dp_beam.mechanisms import noise_key

    monkeypatch.setattr(noise_key, "_STEP_LABELS", {})
    monkeypatch.setattr(noise_key, "_STEP_LABELS_MAX", 3)
    parent = KeyedNoise(KEY, ("count", "key-1"))
    for labels in ((1, "step"), (1.0, "step"), (True, "step"), (np.int64(1), "step"), (1, "open"),
                   (2**70, "step"), (-3, "step"), (1, "step"), ("step", 1), (1, "step", 0)):
        child = parent.for_identity(*labels)
        assert child.identity == ("count", "key-1") + labels
        assert child._encoded == encode_identity(("count", "key-1") + labels)[9:]
        expected = KeyedNoise(KEY, ("count", "key-1") + labels).laplace(1.0, 2)
        np.testing.assert_array_equal(child.laplace(1.0, 2), expected)
        assert len(noise_key._STEP_LABELS) <= 3
    # The int 1 and the NumPy int 1 are the same label; 1.0 and True are not.
    # (A list: the three pairs are equal as dict keys.)
    draws = [parent.for_identity(*labels).laplace(1.0, 1)[0]
             for labels in ((1, "step"), (1.0, "step"), (True, "step"))]
    assert len(set(draws)) == 3
    assert parent.for_identity(np.int64(1), "step").laplace(1.0, 1)[0] == draws[0]


def test_keyed_noise_validates_eagerly():
    with pytest.raises(ValueError, match="noise_key"):
        KeyedNoise(KEY_BYTES, ("t",))
    with pytest.raises(ValueError, match="identity"):
        KeyedNoise(KEY, "t")
    source = KeyedNoise(KEY, ("t",))
    with pytest.raises(ValueError, match="scale"):
        source.laplace(-1.0, 2)
    with pytest.raises(ValueError, match="sigma"):
        source.gaussian(float("nan"), 2)
    with pytest.raises(ValueError, match="size"):
        source.laplace(1.0, -1)
    assert source.draws == 0


def test_keyed_noise_repr_hides_the_key():
    text = repr(KeyedNoise(KEY, ("t", 1)))
    assert KEY_BYTES.hex() not in text and "<secret>" in text and KEY.fingerprint in text


# -- NoiseKey ----------------------------------------------------------------------


def test_generate_gives_fresh_keys():
    a, b = NoiseKey.generate(), NoiseKey.generate()
    assert a != b
    assert len(bytes.fromhex(a.secret_hex())) == 32


def test_from_bytes_round_trip_equality_and_pickle():
    key = NoiseKey.from_bytes(bytearray(KEY_BYTES))
    assert key == KEY and hash(key) == hash(KEY)
    assert key.secret_hex() == KEY_BYTES.hex()
    assert pickle.loads(pickle.dumps(key)) == KEY
    assert NoiseKey.from_bytes(KEY_BYTES + b"\x00") != KEY


def test_long_keys_are_compressed_but_distinct():
    long_a, long_b = NoiseKey.from_bytes(bytes(100)), NoiseKey.from_bytes(bytes(99) + b"\x01")
    assert long_a != long_b
    assert long_a.stream("x").randbytes(8) != long_b.stream("x").randbytes(8)


@pytest.mark.parametrize("bad", [b"", bytes(31), "00" * 32, 123, None])
def test_from_bytes_errors_name_noise_key(bad):
    with pytest.raises(ValueError, match="noise_key"):
        NoiseKey.from_bytes(bad)


def test_repr_hides_the_secret():
    text = repr(KEY)
    assert text == f"NoiseKey(<secret>, fingerprint={KEY.fingerprint})"
    assert KEY_BYTES.hex() not in text and repr(KEY_BYTES) not in text
    assert str(KEY) == text


@pytest.mark.parametrize(
    "text",
    [
        KEY_BYTES.hex(),
        KEY_BYTES.hex().upper(),
        "  " + KEY_BYTES.hex()[:32] + "\n" + KEY_BYTES.hex()[32:] + "\n",
        base64.b64encode(KEY_BYTES).decode(),
        base64.b64encode(KEY_BYTES).decode().rstrip("="),
        base64.urlsafe_b64encode(KEY_BYTES).decode(),
    ],
)
def test_from_env_reads_hex_and_base64(monkeypatch, text):
    monkeypatch.setenv("DP_BEAM_TEST_NOISE_KEY", text)
    assert NoiseKey.from_env("DP_BEAM_TEST_NOISE_KEY") == KEY


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("zz!" * 20, "neither hex nor base64"),
        ("ab" * 16, "at least 32 bytes"),
        (base64.b64encode(bytes(16)).decode(), "at least 32 bytes"),
    ],
)
def test_from_env_errors_are_clear(monkeypatch, text, message):
    monkeypatch.setenv("DP_BEAM_TEST_NOISE_KEY", text)
    with pytest.raises(ValueError, match=f"noise_key.*{message}"):
        NoiseKey.from_env("DP_BEAM_TEST_NOISE_KEY")


def test_from_env_missing_variable(monkeypatch):
    monkeypatch.delenv("DP_BEAM_TEST_NOISE_KEY", raising=False)
    with pytest.raises(ValueError, match="noise_key.*DP_BEAM_TEST_NOISE_KEY.*not set"):
        NoiseKey.from_env("DP_BEAM_TEST_NOISE_KEY")
    with pytest.raises(ValueError, match="noise_key"):
        NoiseKey.from_env("")


def test_from_file_reads_raw_hex_and_base64(tmp_path):
    raw = bytes([200]) + bytes(range(1, 32))  # not printable: read as raw bytes
    (tmp_path / "raw").write_bytes(raw)
    assert NoiseKey.from_file(tmp_path / "raw") == NoiseKey.from_bytes(raw)
    (tmp_path / "hex").write_text(KEY_BYTES.hex() + "\n")
    assert NoiseKey.from_file(str(tmp_path / "hex")) == KEY
    (tmp_path / "b64").write_text(base64.b64encode(KEY_BYTES).decode())
    assert NoiseKey.from_file(tmp_path / "b64") == KEY
    (tmp_path / "wrapped").write_text(KEY_BYTES.hex()[:32] + "\r\n" + KEY_BYTES.hex()[32:] + "\n")
    assert NoiseKey.from_file(tmp_path / "wrapped") == KEY


def test_from_file_errors_name_noise_key(tmp_path):
    with pytest.raises(ValueError, match="noise_key.*cannot read"):
        NoiseKey.from_file(tmp_path / "missing")
    (tmp_path / "short").write_bytes(bytes([200]) * 8)
    with pytest.raises(ValueError, match="noise_key.*at least 32 bytes"):
        NoiseKey.from_file(tmp_path / "short")
    # A text key with a typo fails instead of becoming a raw key.
    (tmp_path / "typo").write_text(KEY_BYTES.hex()[:-1] + "!")
    with pytest.raises(ValueError, match="noise_key.*neither hex nor base64"):
        NoiseKey.from_file(tmp_path / "typo")




# -- integer noise, the exact exponential mechanism, the grid pad ----------------------


def test_integer_noise_is_the_discrete_gaussian_of_the_unit_scale():
    """Ints of scale σ/2^e: sample mean and variance within 5 standard errors
    (variance of the sample variance ≈ 2σ⁴/n for a near-Gaussian law)."""
    src = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("test", "ints"))
    n, sigma, exponent = 4000, 1.5, -40
    z = np.array(src.integer_noise("gaussian", sigma, exponent, n), dtype=np.float64) * 2.0 ** exponent
    assert all(isinstance(v, int) for v in src.integer_noise("gaussian", sigma, exponent, 3))
    assert abs(z.mean()) < 5 * sigma / math.sqrt(n)
    assert abs(z.var() - sigma**2) < 5 * math.sqrt(2.0 / n) * sigma**2
    lap = np.array(src.integer_noise("laplace", 2.0, -10, n), dtype=np.float64) * 2.0**-10
    # Var Lap(b) = 2b²; the sample variance of a Laplace has variance 20b⁴/n.
    assert abs(lap.var() - 8.0) < 5 * math.sqrt(20.0 / n) * 4.0
    again = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("test", "ints"))
    assert again.integer_noise("gaussian", sigma, exponent, 5) == KeyedNoise(
        NoiseKey.from_bytes(bytes(32)), ("test", "ints")).integer_noise("gaussian", sigma, exponent, 5)
    with pytest.raises(ValueError, match="kind"):
        src.integer_noise("cauchy", 1.0, 0, 1)


def test_default_integer_noise_rounds_float_noise_to_the_unit():
    from dp_beam.mechanisms import SeededNoise, ZeroNoise

    assert ZeroNoise().integer_noise("gaussian", 1.0, -3, 4) == [0, 0, 0, 0]
    ints = SeededNoise(0).integer_noise("laplace", 1.0, -3, 4)
    floats = SeededNoise(0).laplace(1.0, 4)
    assert ints == [round(v * 8) for v in floats]


def test_exponential_choice_has_the_softmax_law():
    """20,000 keyed draws over γ = (0, 0.5, 1, 2): each count within 5 binomial
    standard deviations of n·softmax (a fixed key, so the test is deterministic)."""
    gammas = [0.0, 0.5, 1.0, 2.0]
    p = np.exp(-np.array(gammas))
    p /= p.sum()
    key = NoiseKey.from_bytes(bytes(range(32)))
    n = 20000
    counts = np.zeros(4)
    for i in range(n):
        counts[KeyedNoise(key, ("em", i)).exponential_choice(gammas)] += 1
    assert np.all(np.abs(counts - n * p) < 5 * np.sqrt(n * p * (1 - p)))
    # A planted bug (γ doubled) is far outside the same band: the test has power.
    q = np.exp(-2 * np.array(gammas))
    q /= q.sum()
    assert np.any(np.abs(counts - n * q) > 5 * np.sqrt(n * q * (1 - q)))


def test_exponential_mechanism_runs_on_the_keyed_source_and_replays():
    """The transforms give ContinualMean's median prior a KeyedNoise; it used to raise."""
    from dp_beam.mechanisms.continual_mean import exponential_mechanism

    key = NoiseKey.from_bytes(bytes(32))
    cost = [5.0, 1.0, 3.0, 1.0]
    picks = [exponential_mechanism(cost, 2.0, 1.0, KeyedNoise(key, ("median", i))) for i in range(200)]
    assert picks == [exponential_mechanism(cost, 2.0, 1.0, KeyedNoise(key, ("median", i))) for i in range(200)]
    assert set(picks) <= {0, 1, 2, 3} and picks.count(1) + picks.count(3) > picks.count(0) + picks.count(2)
