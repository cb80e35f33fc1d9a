"""Replay stability of BLT: the releases under fixed keyed noise are pinned bit for bit.

The fingerprints are SHA-256 digests of the exact bits (``float.hex``) of the
released floats. They pin *replay stability* (the same noise draws with the
same identities give the same releases across versions and machines, which
retried bundles, restored states and other workers rely on), not a
statistical property: a failure means a change altered the released bits,
and it must be deliberate (then record the new digests and say why). They
were recorded again when the float recurrence stopped using BLAS, whose
kernel (chosen by CPU) had changed the releases from machine to machine;
:func:`test_releases_do_not_depend_on_the_cpu_kernels` checks that.
"""

import numpy as np
import pytest

from dp_beam.mechanisms import BLTMechanism
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

from .cpu_kernels import fingerprint, outputs_under_kernels, stream_releases

KEY = NoiseKey.from_bytes(bytes(range(32)))


def _replay(dim, horizon, rng, steps):
    mech = BLTMechanism(1.0, sensitivity=1.5, horizon=horizon, noise="gaussian", delta=1e-6, dim=dim,
                        rng=rng)
    out = stream_releases(mech, dim, steps)
    # A state round trip continues the same stream.
    restored = BLTMechanism.from_state(mech.to_state(), rng=KeyedNoise(KEY, ("blt", "restored")))
    out.extend(np.atleast_1d(restored.step(np.ones(dim) if dim > 1 else 1.0)).tolist())
    return fingerprint(out)


@pytest.mark.parametrize("dim, horizon, rng, steps, digest", [
    (1, 1024, ("blt", 1), 50, "356a6fc31cefd5d8e4a4a26375f36c8bf3a237d0c0fa9d73ca368dc7a243d985"),
    (7, 1024, ("blt", 7), 50, "2ed69fc7b1e378bd8cd5b13f06d743e24078c8ca250f914cbb0e0b83a0ccdc75"),
    # Unbounded: epochs of 1, 2, 4, … steps, each with its own plan.
    (3, None, ("blt", 3), 70, "7e299a02bcad061f8be4d9634a2dc40f33632d7d6ab527c03fc9b80fc61df452"),
    # A test seed (float noise rounded to the integer grid).
    (5, 4096, 11, 50, "0e82e9d6cfec5a0aed529f571025a6a0d087a43bfa86f34315c42213a9689985"),
])
@pytest.mark.parametrize("packed", [True, False])
def test_releases_are_pinned_bit_for_bit(dim, horizon, rng, steps, digest, packed, monkeypatch):
    from dp_beam.mechanisms.counting import blt

    if not packed:  # the list recurrence, for plans the lanes cannot take
        monkeypatch.setattr(blt, "_packable", lambda plan: False)
    source = KeyedNoise(KEY, rng) if isinstance(rng, tuple) else rng
    assert _replay(dim, horizon, source, steps) == digest


_KERNEL_SNIPPET = """
from tests.mechanisms.counting import test_blt_replay as t
from dp_beam.mechanisms.noise_key import KeyedNoise
print([t._replay(7, 1024, KeyedNoise(t.KEY, ("blt", 7)), 50), t._replay(1, None, 11, 40)])
"""


@pytest.mark.slow
def test_releases_do_not_depend_on_the_cpu_kernels():
    # Another worker's CPU must give the same bits. Before the recurrence left BLAS,
    # the Haswell and Sandy Bridge kernels gave different releases here.
    assert len(outputs_under_kernels(_KERNEL_SNIPPET)) == 1


# -- the exact integer arithmetic against plain references ------------------------------


def _round_reference(numerator, bits):
    """Nearest int to numerator/2^bits, ties to even, by Fraction."""
    from fractions import Fraction
    return round(Fraction(numerator, 1 << bits)) if bits > 0 else numerator << -bits


def test_integer_units_match_exact_references():
    from fractions import Fraction

    from dp_beam.mechanisms.counting.integer_units import (from_unit, from_units, round_div_pow2,
                                                           to_unit, to_units)

    rng = np.random.default_rng(0)
    for bits in (-3, 0, 1, 2, 7, 53, 90):
        values = [int(v) for v in rng.integers(-2**40, 2**40, 200)] + [2**95 + 2**40, -(2**95) - 1]
        values += [(2 * k + 1) << max(bits - 1, 0) for k in range(-4, 4)]   # exact ties
        assert [round_div_pow2(v, bits) for v in values] == [_round_reference(v, bits) for v in values]
    floats = np.concatenate([rng.normal(0, 1, 100) * 10.0 ** rng.integers(-300, 300, 100),
                             [0.5, 1.5, 2.5, -0.5, -2.5, 5e-324, -0.0, 1.7976931348623157e308]])
    for exponent in (-1100, -68, -3, 0, 4, 1100):
        got = to_units(floats, exponent)
        assert got == [round(Fraction(v) / Fraction(2) ** exponent) for v in floats.tolist()]
        assert [to_unit(v, exponent) for v in floats.tolist()] == got   # the scalar twin
        # 2^1023 + 2^970 is a tie to even; 2^1050 + 1 is no float, its scaled value is.
        ints = got[:50] + [3, -(2**80) - 1, 2**1100, 2**1023 + 2**970, 2**1050 + 1]
        # Only results that are finite floats (no release is larger).
        ints = [v for v in ints if abs(Fraction(v) * Fraction(2) ** exponent) < 2**1023]
        expect = [float(Fraction(v) * Fraction(2) ** exponent) for v in ints]
        assert from_units(ints, exponent).tolist() == expect
        assert [from_unit(v, exponent) for v in ints] == expect


def test_packed_buffers_follow_the_list_recurrence():
    from dp_beam.mechanisms import ZeroNoise
    from dp_beam.mechanisms.counting import blt

    rng = np.random.default_rng(3)
    packed = BLTMechanism(1.0, horizon=4096, noise="gaussian", delta=1e-6, dim=9, rng=ZeroNoise())
    plan = packed._plan(4096)
    assert "packed" in packed._core and blt._packable(plan)
    right = [[0] * 9 for _ in range(plan.buffers)]
    for t in range(300):
        # Magnitudes jump by up to 2^80 (the packing widens), signs and ties vary.
        units = [int(v) for v in rng.integers(-2**60, 2**60, 9)]
        units = [u << int(rng.integers(0, 80)) if t % 37 == 5 else u for u in units]
        noise = [int(v) for v in rng.integers(-2**50, 2**50, 9)]
        expect = BLTMechanism._list_step(plan, right, units, noise)
        assert packed._packed_step(plan, packed._core, units, noise) == expect
        assert BLTMechanism._right(packed._core) == right
    assert packed._core["packing"].bits > 100
