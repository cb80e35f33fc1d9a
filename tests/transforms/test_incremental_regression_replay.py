"""Replay stability of IncrementalRegression: a keyed pipeline's releases, pinned.

The fingerprint is a SHA-256 digest of the exact bits (``float.hex``) of every
release's noise stds, α, n and t and of the dead-letter reasons; the models θ,
solved through LAPACK on the CPU's own BLAS kernels, are pinned by their sums
to rounding. Recorded when BLT's float values stopped depending on those
kernels. It pins *replay stability* (the same noise key gives the same
releases), not a statistical property: a failure means a change altered the
released values, and it must be deliberate.
"""

import hashlib

import apache_beam as beam
import numpy as np
import pytest

import dp_beam as dpb
from dp_beam.mechanisms.regression import L2Ball
from tests.beam_util import batch_options, collect

D = 4
DIGEST = "a7fc6702bd4454939714266f142b3656eeae2d0da36649c0c24ba05969583d1b"
THETA_SUMS = (63.84935448178271, 132.35630447432237)


def _events():
    rng = np.random.default_rng(9)
    out = []
    for i in range(300):
        x = rng.normal(size=D) * (0.3 if i % 10 else 2.0)    # every tenth event is clipped
        y = float(x @ np.array([0.5, -0.4, 0.2, 0.1]) + 0.1 * rng.normal())
        out.append({"ts": 0.5 + i * 0.25, "x": x if i % 3 else [float(v) for v in x], "y": y,
                    "key": "ab"[i % 2]})
    out += [{"ts": 5.0, "x": [0.1, float("nan"), 0.2, 0.0], "y": 0.1},
            {"ts": 5.0, "x": [0.1, 0.2], "y": 0.1},
            {"ts": 5.0, "x": np.array([1e300, 1e300, 0.0, 0.0]), "y": 2.0},   # huge but finite
            {"ts": 5.0, "x": [0.1, 0.2, 0.3, 0.4], "y": "high"}]
    return out


def test_keyed_pipeline_releases_are_pinned_bit_for_bit():
    transform = dpb.IncrementalRegression(
        features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], dim=D, epsilon=1.0, delta=1e-6,
        step=4.0, start=0.0, end=80.0, key_fn=lambda e: e.get("key", "a"), keys=["a", "b"],
        timestamp_fn=lambda e: e["ts"], constraint=L2Ball(2.0),
        noise_key=dpb.NoiseKey.from_bytes(bytes(range(32))))

    def build(p):
        res = p | beam.Create(_events(), reshuffle=False) | transform
        return {"releases": res.releases, "invalid": res.invalid}

    out = collect(batch_options(), build)
    exact, theta = [], []
    for r in sorted(out["releases"], key=lambda r: (r.key, r.step)):
        theta += list(r.theta)
        exact += [r.noise_std_gram, r.noise_std_xy, r.alpha, r.n, r.t]
    digest = hashlib.sha256((repr([float(v).hex() for v in exact])
                             + repr(sorted(r.reason for r in out["invalid"]))).encode()).hexdigest()
    assert len(out["releases"]) == 40 and len(out["invalid"]) == 3
    assert digest == DIGEST, digest
    # θ is solved through LAPACK on the CPU's BLAS kernels: the same to rounding on every
    # machine (tests/mechanisms/regression/test_incremental_replay.py), so pinned by sums.
    theta = np.array(theta)
    assert (float(theta.sum()), float(np.abs(theta).sum())) == pytest.approx(THETA_SUMS, rel=1e-7)
