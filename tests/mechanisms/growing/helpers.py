"""Shared helpers of the growing-database tests: exact comparison within a relative error."""

import math


REL = 1e-9


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
