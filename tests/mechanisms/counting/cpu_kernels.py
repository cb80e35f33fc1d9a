"""Helpers of the same-bits tests: a keyed stream's releases and their fingerprint, and a
snippet run under every numeric kernel this CPU can run.

OpenBLAS picks a kernel per CPU (``OPENBLAS_CORETYPE`` forces one that this CPU can run)
and NumPy its SIMD loops (``NPY_DISABLE_CPU_FEATURES`` turns the dispatched ones off): a
release that depends on either would differ on another worker's CPU.
"""

import hashlib
import os
import subprocess
import sys

import numpy as np

# The snippet imports the test modules as the package they are in (they import each other).
_PRELUDE = "import sys\nsys.path.insert(0, {root!r})\n"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def outputs_under_kernels(snippet):
    """The set of what ``snippet`` prints under the default kernels, OpenBLAS's Nehalem,
    Sandy Bridge and Haswell kernels, and Haswell with NumPy's dispatched loops off. The
    snippet can import the test modules as ``tests.mechanisms.counting.…``."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    dispatched = " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))
    script = _PRELUDE.format(root=_ROOT) + snippet
    outputs = set()
    for env in ({}, {"OPENBLAS_CORETYPE": "Nehalem"}, {"OPENBLAS_CORETYPE": "Sandybridge"},
                {"OPENBLAS_CORETYPE": "Haswell", "NPY_DISABLE_CPU_FEATURES": dispatched}):
        run = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env},
                             capture_output=True, text=True, check=True)
        outputs.add(run.stdout)
    return outputs


def fingerprint(values):
    """SHA-256 of the exact bits (``float.hex``) of a list of floats."""
    return hashlib.sha256(repr([float(v).hex() for v in values]).encode()).hexdigest()


def stream_releases(mech, dim, steps):
    """The releases (floats) of ``steps`` steps of ``mech`` on fixed inputs in [-3, 3]."""
    data = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        x = data.uniform(-3, 3, size=dim) if dim > 1 else float(data.uniform(-3, 3))
        out.extend(np.atleast_1d(mech.step(x)).tolist())
    return out
