"""Private continual cumulative ERM release: Algorithms 2 + 4 of seed 004.

``docs/privacy/erm.md`` E-6 and E-5 to E-7, E-9 (seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*): base
models from scratch at t = 2^k·B and PBERM updates toward them in between,
one release per block.
"""

import dataclasses
from typing import Any, Dict, Optional, Sequence, Tuple

from ..noise import RngLike
from ..state import StateRecord
from .config import ContinualERMConfig
from .log import BlockLog
from .record import model_from_state, model_to_state
from .stream import ERMStream, is_pow2

__all__ = ["ContinualERMMechanism", "ContinualERMState"]


@dataclasses.dataclass(frozen=True)
class ContinualERMState(StateRecord):
    """The ``dynamic`` part of a :class:`ContinualERMMechanism`'s state: the global and the
    current model (their dicts, None before the first) and the block the global model covers."""

    fg: Optional[Dict[str, Any]]
    fc: Optional[Dict[str, Any]]
    tg: Any

# The signature's defaults are the config's, so the two cannot drift.
_DEFAULT = ContinualERMConfig


class ContinualERMMechanism(ERMStream):
    """Private continual cumulative release: Algorithm 4 with Alg. 2 base models (erm.md E-6).

    ``block_size`` is b0, ``base_size`` is B (a multiple of b0, E-6). The
    budget ε is split (our choice, erm.md E-6, E-9: Alg. 2 and Alg. 4 get ε/2 each): the base
    models (Alg. 2's cumulative q = 1 outputs) get ε/2 and the Alg. 4 updates
    ε/2. Releases start at t = B, one per block of b0 points:

    * t = 2^k·B (base): from scratch on (0, t], ``b = 4L/(λB·ε/2)``, per-call
      ε/2 · 2^{−(k+1)}; becomes f_g and f_c.
    * t = t_g + 2^j·b0 (doubling): PBERM toward f_g on (t_g, t], normalised by
      its 2^j·b0 points (E-6), ``b = 4L/(λ b0·ε/2)``, per-call ε/2 · 2^{−(j+1)};
      becomes f_c.
    * otherwise (single): PBERM toward f_c on (t − b0, t], same b, per-call ε/2 · 1/2.

    Per record: the bases sum to < ε/2 (geometric series); a b0-batch enters at
    most one single step and doubling steps of distinct j, < ε/2 (Thm 4). So
    the release sequence is ε-DP (:meth:`privacy_cost`); with Gaussian noise
    ρ(ε, δ) is split the same way.

    Lineage: a base or doubling release depends on (0, t]; a single release on
    (0, t_c] ∪ (t − b0, t] (t_c = the last base/doubling time).

    State (design D1.3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< b0 points), at most 2 models (f_g, f_c) and the
    counters t, t_g — O(b0·d + p) numbers whatever t. The :class:`BlockLog`
    retains the whole history of blocks (inherent: the base at 2^k·B trains on
    (0, t]); only base and doubling releases read old blocks back (single
    steps train on the block just completed).

    Example (``ZeroNoise`` switches noise off to show the schedule; it is not
    private, and production code leaves ``rng=None``). b0 = 2, B = 4 and L = 1:

    >>> import numpy as np
    >>> from dp_beam.mechanisms import ZeroNoise
    >>> s = ContinualERMMechanism(epsilon=1.0, block_size=2, base_size=4, n_features=1, classes=[0, 1],
    ...                  feature_bound=1.0, lam=1.0, fit_intercept=False, rng=ZeroNoise())
    >>> for r in s.extend(np.array([[1.0], [-1.0]] * 7), [1, 0] * 7):
    ...     print(r.t, r.kind, r.level, r.trained_on, r.regulariser, r.fraction)
    4 base 0 (0, 4) None 0.5
    6 doubling 0 (4, 6) (0, 4) 0.5
    8 base 1 (0, 8) None 0.25
    10 doubling 0 (8, 10) (0, 8) 0.5
    12 doubling 1 (8, 12) (0, 8) 0.25
    14 single 0 (12, 14) (8, 12) 0.5
    >>> round(s.base_noise_scale(), 6), round(s.update_noise_scale(), 6)    # 4L/(λB·ε/2), 4L/(λb0·ε/2)
    (2.0, 4.0)
    >>> s.privacy_cost()
    Cost(epsilon=1.0, delta=0.0, rho=0.5)
    """

    name = "erm_continual"
    config_cls = ContinualERMConfig

    def __init__(self, epsilon: float, block_size: int, base_size: int, n_features: int,
                 classes: Sequence, feature_bound: float, lam: float,
                 fit_intercept: bool = _DEFAULT.fit_intercept, noise: str = _DEFAULT.noise,
                 delta: Optional[float] = _DEFAULT.delta, rng: RngLike = None,
                 tol_fraction: float = _DEFAULT.tol_fraction, log: Optional[BlockLog] = None) -> None:
        # The parameters are ContinualERMConfig's: checked there, once, for the transform too.
        config = ContinualERMConfig(
            epsilon=epsilon, block_size=block_size, base_size=base_size, n_features=n_features,
            classes=classes, feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept,
            noise=noise, delta=delta, tol_fraction=tol_fraction)
        self._setup(config, rng, log)

    def _setup(self, config, rng, log):
        super()._setup(config, rng, log)
        self.base_size = config.base_size
        self.base_blocks = config.base_size // self.block_size
        self._base_op = self._component(0.5)
        self._update_op = self._component(0.5)
        self._fg = self._fc = None
        self._tg = None

    def base_noise_scale(self) -> float:
        """``4L/(λB·ε/2)`` (Laplace kinds; every base)."""
        return self._base_op.call_noise(self.base_size, 0.5)["scale"]

    def update_noise_scale(self) -> float:
        """``4L/(λ b0·ε/2)`` (Laplace kinds; every doubling and single step)."""
        return self._update_op.call_noise(self.block_size, 0.5)["scale"]

    @staticmethod
    def schedule(c: int, base_blocks: int, tg: Optional[int]) -> Optional[Tuple[str, int]]:
        """Kind of the release after block c: ``("base", k)``, ``("doubling", j)``,
        ``("single", 0)`` or None before the first base. ``tg`` is the last base block."""
        if c < base_blocks:
            return None
        if c % base_blocks == 0 and is_pow2(c // base_blocks):
            return ("base", (c // base_blocks).bit_length() - 1)
        i = c - tg
        if is_pow2(i):
            return ("doubling", i.bit_length() - 1)
        return ("single", 0)

    def _schedule(self, c):
        kind = self.schedule(c, self.base_blocks, self._tg)
        if kind is None:
            return []
        what, level = kind
        if what == "base":
            rel = self._release(self._base_op, "base", level, (0, c), None, 2.0 ** -(level + 1),
                                [(0, c)], (0, c))
            self._fg = self._fc = rel
            self._tg = c
        elif what == "doubling":
            rel = self._release(self._update_op, "doubling", level, (self._tg, c), self._fg,
                                2.0 ** -(level + 1), [(0, c)], (0, c))
            self._fc = rel
        else:
            lineage = [(a // self.block_size, b // self.block_size) for a, b in self._fc.depends_on]
            rel = self._release(self._update_op, "single", 0, (c - 1, c), self._fc, 0.5,
                                lineage + [(c - 1, c)], (0, c))
        return [rel]

    def _retain_from(self, c):
        return 1

    def _dynamic_state(self):
        return ContinualERMState(model_to_state(self._fg), model_to_state(self._fc), self._tg).to_state()

    def _load_dynamic(self, d):
        record = ContinualERMState.from_state(d)
        self._fg, self._fc, self._tg = model_from_state(record.fg), model_from_state(record.fc), record.tg

    def _model_count(self):
        return len({id(m) for m in (self._fg, self._fc) if m is not None})
