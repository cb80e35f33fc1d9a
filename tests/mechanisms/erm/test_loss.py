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


def _old_sigmoid(z):
    # The three-exponential form the shared one replaced.
    return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


def _old_value_grad(loss, theta, Xa, yi):
    # value_grad as it was before its mean, margin and exponentials were shared.
    n = Xa.shape[0]
    if loss.binary:
        s = 2.0 * yi - 1.0
        m = s * (Xa @ theta)
        value = float(np.mean(np.logaddexp(0.0, -m)))
        coef = -s * _old_sigmoid(-m)
        return value, Xa.T @ coef / n
    Th = theta.reshape(loss.n_outputs, Xa.shape[1])
    Z = Xa @ Th.T
    zmax = Z.max(axis=1, keepdims=True)
    lse = zmax[:, 0] + np.log(np.exp(Z - zmax).sum(axis=1))
    value = float(np.mean(lse - Z[np.arange(n), yi]))
    P = np.exp(Z - lse[:, None])
    P[np.arange(n), yi] -= 1.0
    return value, (P.T @ Xa).ravel() / n


@pytest.mark.parametrize("k", [2, 3, 5])
def test_value_grad_and_sigmoid_give_the_bits_of_the_unshared_computation(k):
    rng = np.random.default_rng(k)
    for d, n, spread in ((1, 1, 1.0), (2, 7, 30.0), (10, 8, 3.0), (100, 128, 0.3), (7, 1000, 800.0)):
        loss = LogisticLoss(d, list(range(k)), 1.0, fit_intercept=bool(n % 2))
        Xa = loss.augment(loss.clip(rng.normal(size=(n, d))))
        yi = rng.integers(0, k, size=n)
        theta = rng.normal(size=loss.n_params) * spread
        value, grad = loss.value_grad(theta, Xa, yi)
        old_value, old_grad = _old_value_grad(loss, theta, Xa, yi)
        assert value == old_value
        assert grad.tobytes() == old_grad.tobytes()
    from dp_beam.mechanisms.erm.loss import sigmoid
    z = np.concatenate([rng.normal(size=500) * 40, [0.0, -0.0, 745.0, -745.0, 1e300, -1e300]])
    assert sigmoid(z).tobytes() == _old_sigmoid(z).tobytes()


def test_augment_and_value_grad_on_give_the_bits_of_their_plain_forms():
    rng = np.random.default_rng(11)
    for k, d, n, intercept in ((2, 3, 9, True), (2, 100, 64, False), (4, 5, 1, True)):
        loss = LogisticLoss(d, list(range(k)), 1.0, fit_intercept=intercept)
        X = loss.clip(rng.normal(size=(n, d)))
        Xa = loss.augment(X)
        want = np.hstack([X, np.ones((n, 1))]) if intercept else X
        assert Xa.tobytes() == want.tobytes() and Xa.shape == want.shape and Xa.flags.c_contiguous
        yi = rng.integers(0, k, size=n)
        on_data = loss.value_grad_on(Xa, yi)
        for spread in (0.1, 5.0, 400.0):
            theta = rng.normal(size=loss.n_params) * spread
            value, grad = on_data(theta)
            old_value, old_grad = _old_value_grad(loss, theta, Xa, yi)
            assert value == old_value and grad.tobytes() == old_grad.tobytes()


def test_clip_point_and_label_index_match_the_batch_forms():
    loss = LogisticLoss(5, ["a", 1, 2.5, None, b"x"], 1.3, True)
    rng = np.random.default_rng(7)
    rows = [rng.normal(size=5) * scale for scale in (1e-3, 0.2, 0.58, 1.0, 7.0, 1e200)]
    rows += [np.zeros(5), np.full(5, 1.3 / math.sqrt(5)), [1e308, -1e308, 0.0, 1.0, 2.0],
             [3, 4, 0, 0, 0], (0.1, -0.2, 0.3, -0.4, 0.5)]
    for x in rows:
        with np.errstate(over="ignore"):     # 1e200² overflows in both forms
            want = loss.clip(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]
            assert loss.clip_point(x).tobytes() == want.tobytes()
    for bad in ([1.0, 2.0], [[1.0] * 5, [2.0] * 5], [np.nan, 0, 0, 0, 0], [0, 0, np.inf, 0, 0]):
        with pytest.raises(ValueError) as batch:
            loss.clip(np.asarray(bad, dtype=np.float64).reshape(1, -1))
        with pytest.raises(ValueError) as single:
            loss.clip_point(bad)
        assert str(single.value) == str(batch.value)
    for label in ("a", 1, 1.0, True, 2.5, None, b"x", np.int64(1), np.float64(2.5),
                  "b", 3, (1,), [1], (1, 2), np.array(1.0), np.array([2.5])):
        try:
            want = int(loss.labels([label])[0])
        except (ValueError, TypeError) as err:
            with pytest.raises(type(err)) as single:
                loss.label_index(label)
            assert str(single.value) == str(err)
        else:
            assert loss.label_index(label) == want
