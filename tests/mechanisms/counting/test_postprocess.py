"""Free post-processing: isotonic fits, online monotone releases, Hay consistency (docs/privacy/counting.md, C-14)."""

import numpy as np
import pytest

from dp_beam.mechanisms import BinaryTreeMechanism, SeededNoise
from dp_beam.mechanisms.counting.postprocess import MonotoneRelease, hay_consistency, isotonic_increasing


def test_isotonic_examples_and_least_squares_optimality():
    assert isotonic_increasing([3, 1, 2]).tolist() == [2, 2, 2]
    assert isotonic_increasing([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.normal(0.2, 1.0, 12)) + rng.normal(0, 2, 12)
    fit = isotonic_increasing(y)
    assert np.all(np.diff(fit) >= -1e-12)
    # Projection onto a convex cone: no non-decreasing candidate is closer.
    for _ in range(200):
        cand = np.sort(fit + rng.normal(0, 0.3, 12))
        assert np.sum((cand - y) ** 2) >= np.sum((fit - y) ** 2) - 1e-9


def test_monotone_release_is_a_running_max_of_the_releases_only():
    inputs = [1.0, 0.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0]
    plain = BinaryTreeMechanism(epsilon=0.5, rng=SeededNoise(3))
    wrapped = MonotoneRelease(BinaryTreeMechanism(epsilon=0.5, rng=SeededNoise(3)))
    released = [plain.step(x) for x in inputs]
    monotone = [wrapped.step(x) for x in inputs]
    # A function of the released values alone (it never sees the inputs).
    assert monotone == pytest.approx(np.maximum.accumulate(released).tolist())
    assert wrapped.privacy_cost() == plain.privacy_cost()
    assert wrapped.noise_std(5) == plain.noise_std(5)
    restored = MonotoneRelease.from_state(wrapped.to_state(), BinaryTreeMechanism,
                                          rng=SeededNoise(4))
    assert restored.step(0.0) >= monotone[-1]


def _least_squares_tree(levels, k):
    # Brute force: parametrise by the leaves, every node is a sum of leaves.
    leaves = len(levels[0])
    rows, targets = [], []
    for i, lv in enumerate(levels):
        width = k ** i
        for j, v in enumerate(lv):
            row = np.zeros(leaves)
            row[j * width:(j + 1) * width] = 1
            rows.append(row)
            targets.append(v)
    x, *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return [np.array([x[j * k ** i:(j + 1) * k ** i].sum() for j in range(len(lv))])
            for i, lv in enumerate(levels)]


@pytest.mark.parametrize("k, height", [(2, 4), (3, 3), (2, 1)])
def test_hay_consistency_equals_least_squares(k, height):
    rng = np.random.default_rng(k * 10 + height)
    levels = [rng.normal(0, 3, k ** (height - 1 - i)) + 10 * k ** i for i in range(height)]
    got = hay_consistency(levels, k=k)
    want = _least_squares_tree(levels, k)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-9)
    for i in range(1, height):  # parent = Σ children
        assert got[i] == pytest.approx(got[i - 1].reshape(-1, k).sum(axis=1))


def test_hay_consistency_reduces_leaf_error():
    # For a binary tree of height 3 the consistent leaf has variance
    # (from the least-squares formula) below the raw leaf's; with 20,000 trees
    # the sample variance is within 2 % of its mean, so a 10 % margin is safe.
    rng = np.random.default_rng(5)
    n = 20_000
    noisy = [rng.laplace(0, 1, (4, n)), rng.laplace(0, 1, (2, n)), rng.laplace(0, 1, (1, n))]
    out = hay_consistency(noisy, k=2)
    assert out[0].var() < 0.9 * noisy[0].var()


def test_hay_consistency_validates_shapes():
    with pytest.raises(ValueError, match="levels\\[1\\]"):
        hay_consistency([[1.0, 2.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="k"):
        hay_consistency([[1.0]], k=1)
