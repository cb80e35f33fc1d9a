"""BLT's scalar fast path (a float per step, dim 1) against the general array path, bit for bit.

``BLTMechanism.step`` hands a Python float of a scalar stream to ``_step_scalar``,
which does the integer and float arithmetic of ``_core_step`` on Python numbers;
an array of shape (1,) takes the general path. Both must release the same bits
and leave the same state, for every noise source, horizon and integer storage.
"""

import numpy as np
import pytest

from dp_beam.mechanisms import BLTMechanism
from dp_beam.mechanisms.counting.factorisation import FactorisationMechanism
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

KEY = NoiseKey.from_bytes(bytes(range(32)))


def _inputs(steps, seed):
    """Step totals: counts, off-grid floats, zeros, negatives and a few huge values
    (these make the packed buffers widen)."""
    data = np.random.default_rng(seed)
    xs = []
    for t in range(steps):
        kind = t % 7
        if kind == 0:
            xs.append(float(data.integers(0, 50)))
        elif kind == 1:
            xs.append(float(data.uniform(-3, 3)))
        elif kind == 2:
            xs.append(0.0)
        elif kind == 3 and t % 140 == 3:
            xs.append(float(data.choice([1e30, -2.5e45, 7e200])))
        else:
            xs.append(float(data.normal(0, 1e3)))
    return xs


def _run(horizon, rng, xs, scalar, reseed):
    """Releases and final state of one stream; ``reseed`` gives every step its own keyed
    source (as a release DoFn does), else one source serves all steps."""
    source = KeyedNoise(KEY, rng) if isinstance(rng, tuple) else rng
    mech = BLTMechanism(1.0, sensitivity=1.5, horizon=horizon, noise="gaussian", delta=1e-6,
                        rng=source)
    out = []
    for t, x in enumerate(xs):
        if reseed:
            mech.set_noise_source(source.for_identity(t, "step"))
        value = mech.step(x if scalar else np.array([x]))
        assert type(value) is float
        out.append(value.hex())
    return out, mech.to_state()


@pytest.mark.parametrize("horizon, steps", [(72, 72), (1000, 1000), (None, 1100)])
@pytest.mark.parametrize("rng, reseed", [(("blt-scalar", 1), True), (("blt-scalar", 2), False), (11, False)])
def test_scalar_path_matches_the_array_path(horizon, steps, rng, reseed):
    xs = _inputs(steps, 5)
    fast, fast_state = _run(horizon, rng, xs, scalar=True, reseed=reseed)
    general, general_state = _run(horizon, rng, xs, scalar=False, reseed=reseed)
    assert fast == general
    assert fast_state == general_state


def test_scalar_core_keeps_its_ints_unpacked():
    """One lane packs nothing: a scalar stream stores its integer buffers as lists (the state
    holds lists either way), a vector stream packs them."""
    scalar = BLTMechanism(1.0, horizon=72, noise="gaussian", delta=1e-6, rng=KeyedNoise(KEY, ("s",)))
    vector = BLTMechanism(1.0, horizon=72, noise="gaussian", delta=1e-6, dim=2, rng=KeyedNoise(KEY, ("v",)))
    assert "right" in scalar._core and "packed" in vector._core
    restored = BLTMechanism.from_state(scalar.to_state(), rng=KeyedNoise(KEY, ("r",)))
    assert restored._core["right"] == scalar._core["right"]


def test_scalar_and_array_steps_interleave():
    """Either path continues the other's state, also across a state round trip."""
    xs = _inputs(300, 8)
    reference, _ = _run(None, ("blt-mixed",), xs, scalar=False, reseed=True)
    source = KeyedNoise(KEY, ("blt-mixed",))
    mech = BLTMechanism(1.0, sensitivity=1.5, noise="gaussian", delta=1e-6, rng=source)
    out = []
    for t, x in enumerate(xs):
        if t == 150:
            mech = BLTMechanism.from_state(mech.to_state(), rng=source)
        mech.set_noise_source(source.for_identity(t, "step"))
        out.append(mech.step(x if t % 3 else np.array([x])).hex())
    assert out == reference


def test_scalar_path_checks_its_input():
    mech = BLTMechanism(1.0, horizon=2, noise="gaussian", delta=1e-6, rng=KeyedNoise(KEY, ("check",)))
    with pytest.raises(ValueError, match="finite"):
        mech.step(float("nan"))
    mech.step(1.0)
    mech.step(1.0)
    with pytest.raises(ValueError, match="horizon exceeded"):
        mech.step(1.0)


def test_closed_form_epochs_match_the_loop():
    """``_epoch_of`` of a mechanism without MAX_HORIZON, closed form, against the loop it replaces."""
    def loop(t):
        start, k = 1, 0
        while t >= start + (1 << k):
            start += 1 << k
            k += 1
        return k, start, 1 << k

    assert BLTMechanism.MAX_HORIZON is None
    for t in list(range(1, 5000)) + [2**40 - 1, 2**40, 2**40 + 1]:
        assert BLTMechanism._epoch_of(t) == FactorisationMechanism._epoch_of(t) == loop(t)
