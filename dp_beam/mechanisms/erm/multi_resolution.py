"""Private multi-resolution ERM release: Algorithm 2 of seed 004.

``docs/privacy/erm.md`` E-5 (seed 004: Watson et al.,
*Continual and Sliding Window Release for Private ERM*): after every block,
models trained from scratch on the aligned intervals of 2^k blocks that end
there.
"""

from typing import List, Optional, Sequence, Tuple

from ..noise import RngLike
from .config import MultiResolutionERMConfig
from .log import BlockLog
from .stream import ERMStream

__all__ = ["MultiResolutionERMMechanism"]

# The signature's defaults are the config's, so the two cannot drift.
_DEFAULT = MultiResolutionERMConfig


class MultiResolutionERMMechanism(ERMStream):
    """Algorithm 2, private multi-resolution release (erm.md E-5).

    ``block_size`` is B. After the q-th block (t = q·B) it releases, for every
    scale k >= 0 with 2^k | q (and k <= ``max_scale`` if given), a model trained
    from scratch on the records (t − 2^k·B, t], with L2-Laplace scale
    ``b = 4L/(λBε)`` for every k: sensitivity 2L/(λ2^kB) over b gives a per-call
    cost of ε/2^{k+1}. At a fixed scale the intervals are aligned and disjoint,
    so each record pays Σ_k ε/2^{k+1} < ε (Thm 1; with a cap,
    ε(1 − 2^{−(max_scale+1)})). :meth:`privacy_cost` reports ε.

    State (design D1.3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< B points) and counters — no models, each is
    released at once — so O(B·d) numbers whatever t. The :class:`BlockLog`
    retains, with ``max_scale`` = K, only the blocks of the current aligned
    interval of 2^K blocks (< 2^K·B points; everything is released when the
    interval completes), and without a cap the whole history (inherent: the
    scale-k model at t = 2^k·B needs all of (0, t]). Every even block reads
    old blocks back (the scale-1 model and up).
    """

    name = "erm_multires"
    config_cls = MultiResolutionERMConfig

    def __init__(self, epsilon: float, block_size: int, n_features: int, classes: Sequence,
                 feature_bound: float, lam: float, fit_intercept: bool = _DEFAULT.fit_intercept,
                 noise: str = _DEFAULT.noise, delta: Optional[float] = _DEFAULT.delta,
                 max_scale: Optional[int] = _DEFAULT.max_scale, rng: RngLike = None,
                 tol_fraction: float = _DEFAULT.tol_fraction,
                 log: Optional[BlockLog] = None) -> None:
        # The parameters are MultiResolutionERMConfig's: checked there, once, for the transform too.
        config = MultiResolutionERMConfig(
            epsilon=epsilon, block_size=block_size, n_features=n_features, classes=classes,
            feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept, noise=noise,
            delta=delta, max_scale=max_scale, tol_fraction=tol_fraction)
        self._setup(config, rng, log)

    def _setup(self, config, rng, log):
        super()._setup(config, rng, log)
        self.max_scale = config.max_scale
        self._op = self._component(1.0)

    def noise_scale(self) -> float:
        """Laplace scale ``4L/(λBε)`` shared by every scale (for Gaussian noise σ
        varies with k: see :meth:`call_noise`)."""
        return self._op.call_noise(self.block_size, 0.5)["scale"]

    def call_noise(self, k: int) -> dict:
        """Noise of the scale-k call: n = 2^k·B, fraction 2^{−(k+1)}."""
        return self._op.call_noise((1 << k) * self.block_size, 2.0 ** -(k + 1))

    @staticmethod
    def schedule(q: int, max_scale: Optional[int] = None) -> List[Tuple[int, Tuple[int, int]]]:
        """Block intervals ``(k, (lo, hi])`` released after block q (public)."""
        out, k = [], 0
        while q % (1 << k) == 0 and (max_scale is None or k <= max_scale):
            out.append((k, (q - (1 << k), q)))
            k += 1
        return out

    def _schedule(self, q):
        releases = []
        for k, blocks in self.schedule(q, self.max_scale):
            releases.append(self._release(self._op, "scale", k, blocks, None, 2.0 ** -(k + 1),
                                          [blocks], blocks))
        return releases

    def _retain_from(self, q):
        if self.max_scale is None:
            return 1
        span = 1 << self.max_scale
        return (q // span) * span + 1

    def _dynamic_state(self):
        return {}

    def _load_dynamic(self, d):
        pass

    def _model_count(self):
        return 0
