"""Replay stability of PrivIncReg1/2: models and noisy sums under fixed keyed noise, pinned bit for bit.

The fingerprints are SHA-256 digests of the exact bits (``float.hex``) of
everything a step releases (θ, the noise stds, α, the noisy sums), recorded
from the implementation before the per-step work was restructured (issue 18).
They pin *replay stability* (the same noise draws with the same identities
give the same releases), not a statistical property: a failure means a change
altered the released bits, and it must be deliberate.
"""

import hashlib

import numpy as np
import pytest

from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey
from dp_beam.mechanisms.regression import (L1Ball, L2Ball, PrivIncReg1, PrivIncReg1Params, PrivIncReg2,
                                           PrivIncReg2Params)

KEY = NoiseKey.from_bytes(bytes(range(32)))


def fingerprint(values):
    """SHA-256 of the exact bits of a list of floats."""
    return hashlib.sha256(repr([float(v).hex() for v in values]).encode()).hexdigest()


def _replay(cls, params, steps):
    mech = cls(params, rng=KeyedNoise(KEY, ("reg",)))
    data = np.random.default_rng(2)
    out = []
    for t in range(steps):
        if t == 20:  # a state round trip, as a release DoFn without reseeding does
            mech = cls.from_state(mech.to_state(), rng=KeyedNoise(KEY, ("reg", t)))
        if t % 3 == 0:  # a new source per step, as the release DoFn does
            mech.set_noise_source(KeyedNoise(KEY, ("reg", "step", t)))
        n = int(data.integers(0, 40))
        X = data.uniform(-0.5, 0.5, size=(n, params.dim)) * (3 if t == 7 else 1)  # step 7 clips
        y = X @ np.linspace(-1, 1, params.dim) + data.normal(0, 0.1, n)
        release = mech.step_points(X, y)
        out.extend(release.theta.tolist())
        out += [release.noise_std_gram, release.noise_std_xy, release.alpha, release.n, release.t]
        Q, q = mech.statistics()
        out.extend(Q.ravel().tolist())
        out.extend(q.tolist())
    return fingerprint(out)


@pytest.mark.parametrize("cls, params, steps, digest", [
    (PrivIncReg1, PrivIncReg1Params(dim=11, epsilon=1.0, delta=1e-6, constraint=L2Ball(4.0), horizon=8760),
     50, "54ee959ae78c10ac799ae79d95d16eeeaa3b6261a0b0672a9a066b13ff613b20"),
    (PrivIncReg1, PrivIncReg1Params(dim=3, epsilon=0.5, delta=1e-6, constraint=L1Ball(2.0)),
     70, "6427fd998dfe71e82010fb2cee75b871a375c6de072e9b695024078dc525b120"),
    (PrivIncReg1, PrivIncReg1Params(dim=4, epsilon=1.0, delta=1e-6, horizon=64, solver="noisy_proj_grad",
                                    max_iterations=200),
     50, "5b6eda38d4d406e0107f568f19afaaba2b010c53342d96759fb92af333e1815c"),
    (PrivIncReg2, PrivIncReg2Params(dim=6, epsilon=1.0, delta=1e-6, horizon=64, projection_dim=4),
     50, "39b95ad34b18b933a37bd2d997a1d4be5249ad9753ae713f68b5992558e1b725"),
])
def test_releases_are_pinned_bit_for_bit(cls, params, steps, digest):
    assert _replay(cls, params, steps) == digest
