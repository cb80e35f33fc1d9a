"""Helpers shared by the key-selection tests: noise sources that count or script their
draws, binomial confidence bounds, feeding counts to a per-key mechanism."""

import math

import numpy as np
from scipy import stats

from dp_beam.mechanisms import (
    KeySelection,
    NoiseSource,
)


class CountingNoise(NoiseSource):
    """Zero noise that counts its draws."""

    def __init__(self):
        self.draws = 0

    def laplace(self, scale, size):
        self.draws += 1
        return np.zeros(size)

    def gaussian(self, sigma, size):
        self.draws += 1
        return np.zeros(size)


def cp_lower(successes, n, alpha=1e-3):
    """One-sided (1 − alpha) Clopper–Pearson lower bound of a binomial rate."""
    if successes == 0:
        return 0.0
    return float(stats.beta.ppf(alpha, successes, n - successes + 1))


def admission(counter, counts, last):
    """Feed counts (then zeros) through step index ``last``; the admission t or None."""
    counts = list(counts)
    while counter.t < last:
        x = counts.pop(0) if counts else 0
        if counter.step(x):
            return counter.admitted
    return None


def admission_steps(counters, units, last):
    return [admission(c, [units], last) or 0 for c in counters]  # never = 0


def same_distribution_pvalue(a, b):
    """Two-sample chi-square p-value on discrete outcomes.

    Outcomes whose pooled count is below 20 are merged into one bin so that
    the asymptotic law holds. Under equal distributions the p-value is
    uniform, so a bound of 1e-3 is a 0.1 % false alarm rate (seeds fixed).
    """
    cats = sorted(set(a) | set(b))
    table = np.array([[arm.count(c) for c in cats] for arm in (a, b)])
    big = table.sum(axis=0) >= 20
    if (~big).any():
        table = np.column_stack([table[:, big], table[:, ~big].sum(axis=1)])
    assert table.shape[1] >= 4  # the admission step really varies
    return stats.chi2_contingency(table).pvalue


def svt(epsilon=1.0, delta=1e-6, **kw):
    return KeySelection(epsilon, delta, method="sparse_vector", **kw)


class ScriptedNoise(NoiseSource):
    """Returns the given Laplace values in order (and records the scales asked for)."""

    def __init__(self, values):
        self.values, self.scales = list(values), []

    def laplace(self, scale, size):
        self.scales.append(scale)
        return np.array([self.values.pop(0) for _ in range(size)], dtype=float)


def laplace_survival(y, b):
    return 0.5 * math.exp(-y / b) if y >= 0 else 1.0 - 0.5 * math.exp(y / b)


def laplace_log_below(y, b):
    """log P(Lap(b) < y), without cancellation."""
    return math.log1p(-0.5 * math.exp(-y / b)) if y >= 0 else y / b - math.log(2.0)


def cp_upper(successes, n, alpha=1e-3):
    if successes == n:
        return 1.0
    return float(stats.beta.isf(alpha, successes + 1, n - successes))
