"""Private key (partition) selection for continual release.

When the set of keys is not public, a key seen in the data may only be
released (as a key with its own statistic stream) once it is *admitted*: its
noisy running count of distinct privacy units reaches a public threshold.
This package is the engine-free part: :class:`KeySelection` holds the public
parameters (thresholds, cost) and makes one per-key object per candidate key,
by one of two methods:

* ``method="counter"``: each key runs a binary-tree continual counter
  (:class:`KeyCounter`, claims 1–9 in :mod:`.counter`);
* ``method="sparse_vector"``: each key runs AboveThreshold, the sparse
  vector technique with a single positive answer (:class:`KeySparseVector`,
  claims 10–17 in :mod:`.sparse_vector`). Its threshold does not pay for the
  tree's depth, and only logarithmically for the number of steps: on the
  flights benchmark (``docs/key_selection.md``; ε = 1, δ = 1e-6, m = 1, 365
  daily steps) τ is 46.1 instead of 184–330.

Both per-key objects answer ``step(new_units) -> bool`` and have ``t``,
``admitted`` and ``to_state()``; :meth:`KeySelection.restore` rebuilds either.
The threshold computations (claims 3, 5, 13, 14) are in :mod:`.thresholds`.
``docs/privacy/key_selection.md`` restates the claims as K-1 … K-9.

Example (``ZeroNoise`` switches noise off to show the mechanics; it is not
private, and production code leaves ``rng=None``):

>>> from dp_beam.mechanisms import KeySelection, ZeroNoise
>>> sel = KeySelection(epsilon=1.0, delta=1e-6, horizon=365)
>>> round(sel.threshold(1), 1), round(sel.threshold(255), 1)   # 1 node vs 8 nodes of Lap(9)
(184.0, 329.5)
>>> round(sel.threshold(3), 1), round(sel.threshold(4), 1)     # 2 nodes vs 1
(243.2, 184.0)
>>> c = sel.new_counter(3, rng=ZeroNoise())   # first data at step 3: skips 2 steps
>>> c.t, c.step(200), c.step(0), c.admitted   # admitted at a step without new units
(2, False, True, 4)
>>> svt = KeySelection(epsilon=1.0, delta=1e-6, horizon=365, method="sparse_vector")
>>> round(svt.threshold(1), 1), round(svt.threshold(365), 1)   # one τ for the whole horizon
(46.1, 46.1)
>>> k = svt.new_counter(3, rng=ZeroNoise())
>>> k.t, k.step(40), k.step(7), k.admitted          # 47 >= 46.1
(2, False, True, 4)
"""

from .base import KeyTest
from .counter import KeyCounter
from .selection import METHODS, KeySelection
from .sparse_vector import KeySparseVector
from .thresholds import (
    SVT_CELLS_PER_SCALE,
    SVT_EXACT_EPOCHS,
    SVT_ROUNDING_MARGIN,
    SVT_TAIL_FRACTION,
    laplace_tail_quantile,
    sparse_vector_admission_bounds,
    sparse_vector_excess,
)

__all__ = ["KeySelection", "KeyCounter", "KeySparseVector", "laplace_tail_quantile",
           "sparse_vector_admission_bounds", "METHODS", "KeyTest", "sparse_vector_excess",
           "SVT_CELLS_PER_SCALE", "SVT_EXACT_EPOCHS", "SVT_ROUNDING_MARGIN", "SVT_TAIL_FRACTION"]
