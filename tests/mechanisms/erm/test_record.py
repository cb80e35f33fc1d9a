"""Model releases and the prediction helpers (dp_beam.mechanisms.erm.record).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import json

import numpy as np

from dp_beam.mechanisms import ZeroNoise
from dp_beam.mechanisms.erm import ContinualERMMechanism, ModelRelease, predict, predict_proba

from .helpers import data


def test_release_record_round_trips_through_json():
    stream = ContinualERMMechanism(1.0, 2, 2, lam=0.5, rng=1, n_features=2, classes=["x", "y", "z"], feature_bound=1.0)
    X, y = data(4, k=3, seed=8)
    rel = stream.extend(X, [["x", "y", "z"][i] for i in y])[-1]
    again = ModelRelease.from_dict(json.loads(json.dumps(rel.to_dict())))
    assert again == rel
    np.testing.assert_array_equal(again.params, rel.params)
    assert rel.weights.shape == (3, 2) and rel.intercept.shape == (3,)


def test_prediction_helper_on_separable_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 2))
    y = np.where(X[:, 0] > 0, "pos", "neg")
    stream = ContinualERMMechanism(1.0, 32, 32, lam=0.01, rng=ZeroNoise(), n_features=2, classes=["neg", "pos"],
                          feature_bound=5.0)
    rel = stream.extend(X, y)[-1]
    proba = predict_proba(rel, X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert np.mean(np.array(predict(rel, X)) == y) > 0.9
    assert rel.weights.shape == (2,) and isinstance(rel.intercept, float)
    # Softmax: probabilities agree with the flat parameters' own decision function.
    soft = ContinualERMMechanism(1.0, 8, 8, lam=0.1, rng=1, n_features=2, classes=["a", "b", "c"], feature_bound=3.0)
    rel3 = soft.extend(X[:8], ["a", "b", "c", "a", "b", "c", "a", "b"])[-1]
    Z = soft.loss.decision(rel3.params, X)
    np.testing.assert_allclose(predict_proba(rel3, X), np.exp(Z) / np.exp(Z).sum(axis=1, keepdims=True))
    assert predict(rel3, X) == [["a", "b", "c"][i] for i in np.argmax(Z, axis=1)]
