"""Replay stability of PrivIncReg1/2: noisy sums under fixed keyed noise pinned bit for bit, models to rounding.

The fingerprints are SHA-256 digests of the exact bits (``float.hex``) of
what a step releases that is the same on every machine (the noisy sums, n,
t); the models and α are solved through LAPACK on the CPU's own BLAS
kernels, so they are pinned, with the noise stds, by sums to a relative 1e-7.
They were recorded after the BLT's float recurrence stopped using BLAS
(before, the releases of a stream depended on the CPU's kernel).
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
    """``(digest, summary)``: the digest of what is exact on every machine (the noisy sums,
    n, t) and sums of the post-processed values (θ, the noise stds, α), which LAPACK
    computes with the CPU's own BLAS kernels: they agree across machines to rounding only."""
    mech = cls(params, rng=KeyedNoise(KEY, ("reg",)))
    data = np.random.default_rng(2)
    exact, theta, stds, alphas = [], [], [], []
    for t in range(steps):
        if t == 20:  # a state round trip, as a release DoFn without reseeding does
            mech = cls.from_state(mech.to_state(), rng=KeyedNoise(KEY, ("reg", t)))
        if t % 3 == 0:  # a new source per step, as the release DoFn does
            mech.set_noise_source(KeyedNoise(KEY, ("reg", "step", t)))
        n = int(data.integers(0, 40))
        X = data.uniform(-0.5, 0.5, size=(n, params.dim)) * (3 if t == 7 else 1)  # step 7 clips
        y = X @ np.linspace(-1, 1, params.dim) + data.normal(0, 0.1, n)
        release = mech.step_points(X, y)
        theta.extend(release.theta.tolist())
        stds += [release.noise_std_gram, release.noise_std_xy]
        alphas.append(release.alpha)
        exact += [release.n, release.t]
        Q, q = mech.statistics()
        exact.extend(Q.ravel().tolist())
        exact.extend(q.tolist())
    theta = np.array(theta)
    return fingerprint(exact), (float(np.sum(theta)), float(np.sum(np.abs(theta))),
                                float(np.sum(stds)), float(np.sum(alphas)))


@pytest.mark.parametrize("cls, params, steps, digest, summary", [
    (PrivIncReg1, PrivIncReg1Params(dim=11, epsilon=1.0, delta=1e-6, constraint=L2Ball(4.0), horizon=8760),
     50, "588cb961886b6335e787ea6d366f699e87c60f322727fe2443132877c3d6a21a",
     (-70.15115101987499, 545.1798043235858, 3716.319860310094, 182612.3632745416)),
    (PrivIncReg1, PrivIncReg1Params(dim=3, epsilon=0.5, delta=1e-6, constraint=L1Ball(2.0)),
     70, "931c3b07414bf8bcda9628807b91e0660a45e2a387a47059298fe6a9c5908ec0",
     (112.16032613103343, 140.0, 12511.76230296447, 269102.5818935143)),
    (PrivIncReg1, PrivIncReg1Params(dim=4, epsilon=1.0, delta=1e-6, horizon=64, solver="noisy_proj_grad",
                                    max_iterations=200),
     50, "02c22cbd5e9cf94b7c7cdf42e47c5e214acd71f74730ea546f50606e30969315",
     (-1.2068549643924458, 13.821665522605533, 3298.696408975541, 45927.373424708225)),
    (PrivIncReg2, PrivIncReg2Params(dim=6, epsilon=1.0, delta=1e-6, horizon=64, projection_dim=4),
     50, "8b12053874cf3414b52a3a23a4c1ac32079133c310724ccc374c2cd2496bb8da",
     (14.388980657862454, 102.17613865839411, 3298.696408975541, 123611.39668754271)),
])
def test_releases_are_pinned_bit_for_bit(cls, params, steps, digest, summary):
    exact, sums = _replay(cls, params, steps)
    assert exact == digest
    # The solves run on the CPU's BLAS: OpenBLAS's Haswell and Nehalem kernels
    # (OPENBLAS_CORETYPE) gave θ sums 1e-9 apart (relative) for the L1 ball and 1e-15 for
    # the rest, the stds and α the same bits; a changed noise draw or solver moves
    # them by far more than the tolerance.
    assert sums == pytest.approx(summary, rel=1e-7)
