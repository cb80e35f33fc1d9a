"""The regularised logistic loss (dp_beam.mechanisms.erm.loss).

Statistical tolerances are derived next to each test; seeds are fixed.
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms.erm import LogisticLoss

from .helpers import data


def test_finite_difference_gradient_and_lipschitz_bound():
    loss = LogisticLoss(3, ["a", "b", "c"], 1.5, True)
    X, y = data(5, d=3, k=3, seed=3)
    Xa = loss.augment(loss.clip(X))
    theta = np.random.default_rng(0).normal(size=loss.n_params)
    _, grad = loss.value_grad(theta, Xa, y)
    eps = 1e-6
    num = [(loss.value_grad(theta + eps * e, Xa, y)[0] - loss.value_grad(theta - eps * e, Xa, y)[0]) / (2 * eps)
           for e in np.eye(loss.n_params)]
    np.testing.assert_allclose(grad, num, atol=1e-7)
    # Per-example gradients never exceed the public L = √2·√(R²+1).
    for i in range(5):
        _, g = loss.value_grad(theta * 50, Xa[i:i + 1], y[i:i + 1])
        assert np.linalg.norm(g) <= loss.lipschitz + 1e-12
    assert loss.lipschitz == pytest.approx(math.sqrt(2) * math.sqrt(1.5**2 + 1))
