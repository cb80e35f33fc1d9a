"""Display rounding (display.py): float noise is never printed, real digits always are."""

import pytest

from dp_beam.accounting.display import DIGITS, fmt, rounded


@pytest.mark.parametrize("x, kw, expected", [
    (0.1 + 0.2, {}, 0.3),
    (1 - (0.5 + 0.25 + 0.2499999999999999), {"scale": 1.0}, 0.0),
    (1.1e-16, {}, 1.1e-16),  # without a scale a tiny number is its own magnitude
    (123456.78901234567, {}, 123456.789012),
    (-0.1 - 0.2, {}, -0.3),
    (2.345, {"digits": 2}, 2.3),
    (5, {}, 5.0),
])
def test_rounded(x, kw, expected):
    assert rounded(x, **kw) == expected


@pytest.mark.parametrize("x", [None, True, "x", float("inf"), 0.0])
def test_rounded_passes_through_what_is_no_finite_nonzero_number(x):
    assert rounded(x) is x or rounded(x) == x


def test_rounded_never_gives_negative_zero():
    assert str(rounded(-1e-17, scale=1.0)) == "0.0"


@pytest.mark.parametrize("x, kw, expected", [
    (0.1 + 0.5, {}, "0.6"), (2.0, {}, "2"), (None, {}, "-"), (None, {"none": "n/a"}, "n/a"),
    (float("inf"), {}, "inf"), (float("-inf"), {}, "-inf"), (float("nan"), {}, "nan"),
    (1e-6, {}, "1e-06"), (True, {}, "True"), ("ε", {}, "ε"),
    (1 - 0.9999999999999999, {"scale": 1.0}, "0"),
    (1 / 3, {}, "0." + "3" * DIGITS),
])
def test_fmt(x, kw, expected):
    assert fmt(x, **kw) == expected
