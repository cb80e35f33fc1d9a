"""Private sliding-window ERM release: Algorithm 5 of seed 004 with the bucket / chain rule.

``docs/privacy/erm.md`` E-7 (seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*): the
window is cut into a base and power-of-two buckets (:func:`sliding_buckets`),
each bucket's model regularised toward its predecessor in the chain.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..noise import RngLike
from ..state import StateRecord, state_field
from .config import WINDOW_POLICIES, SlidingWindowERMConfig
from .log import BlockLog
from .record import ModelRelease
from .stream import ERMStream

__all__ = ["WINDOW_POLICIES", "SlidingModelState", "SlidingWindowERMMechanism", "SlidingWindowState",
           "sliding_buckets"]


@dataclasses.dataclass(frozen=True)
class SlidingModelState(StateRecord):
    """One model a :class:`SlidingWindowERMMechanism` holds: its bucket key, the release (its
    dict), the key of the model it extends (None for a fresh one) and its expiry."""

    key: List[int]
    release: Dict[str, Any]
    parent: Optional[List[int]]
    expiry: Any


def _models_from_state(models: List[Any]) -> List[SlidingModelState]:
    return [SlidingModelState.from_state(m) for m in models]


@dataclasses.dataclass(frozen=True)
class SlidingWindowState(StateRecord):
    """The ``dynamic`` part of a :class:`SlidingWindowERMMechanism`'s state: its models."""

    models: List[SlidingModelState] = state_field(decode=_models_from_state)

# The signature's defaults are the config's, so the two cannot drift.
_DEFAULT = SlidingWindowERMConfig


#: A bucket ``(side, lo, hi, level)``: side ``"B"`` (base), ``"L"`` or ``"R"``,
#: inclusive block indices, and the level i of a bucket of 2^i blocks (None for the base).
Bucket = Tuple[str, int, int, Optional[int]]
#: A bucket without its level, ``(side, lo, hi)``: the key of its model.
BucketKey = Tuple[str, int, int]


def _right_buckets(b_e, r):
    out, start = [], b_e + 1
    for i in reversed(range(r.bit_length())):
        if r >> i & 1:
            out.append(("R", start, start + (1 << i) - 1, i))
            start += 1 << i
    return out


def _left_buckets(b_s, left):
    out, u = [], 0
    for i in reversed(range(left.bit_length())):
        if left >> i & 1:
            hi = b_s - 1 - u
            out.append(("L", hi - (1 << i) + 1, hi, i))
            u += 1 << i
    return out


def sliding_buckets(s: int, W: int, P: int) -> Tuple[int, int, int, List[Bucket]]:
    """Bucket decomposition of the window ending at block s (0-based blocks), erm.md E-7.

    Returns ``(j, r, ℓ, buckets)`` with buckets ``(side, lo, hi, level)`` over
    inclusive block indices: the base ``("B", b_s, b_e, None)``, RIGHT(r) and
    LEFT(ℓ). Requires s >= W − 1.
    """
    j = (s - (W - 1)) // P
    b_e = W - 1 + j * P
    b_s = b_e - P + 1
    r = s - b_e
    left = (W - P) - r
    return j, r, left, [("B", b_s, b_e, None)] + _right_buckets(b_e, r) + _left_buckets(b_s, left)


class SlidingWindowERMMechanism(ERMStream):
    """Private sliding-window ERM, Algorithm 5 with the bucket / chain rule of erm.md E-7.

    ``block_size`` is w0, ``window`` is w records, W = w/w0 blocks. Exact mode
    needs W = 2^k − 1 (base P = 2^{k−1} blocks); ``window_policy``:
    ``"exact"`` (default) rejects other W, ``"round_down"`` uses
    W′ = 2^{⌊log₂(W+1)⌋} − 1 (see :attr:`effective_window`), ``"general"``
    uses P = ⌊(W+1)/2⌋ with the expiry-ordered chain of E-7 (exact for any
    W ≥ 1 in privacy and coverage, not chain-consistent). A window that is not
    a multiple of w0 is rounded down to one (E-7), except in exact mode,
    where it is rejected.

    From the W-th block on (t >= w) every block yields one release. At step s
    (newest block) the window is LEFT(ℓ) ∪ base ∪ RIGHT(r) (:func:`sliding_buckets`).
    Models whose bucket left the window are discarded (all of them when r = 0,
    the refresh); the chain is the bucket set sorted by (expiry desc, size desc,
    base < left < right) — size-descending in exact mode — and every bucket
    without a model is trained in chain order:

    * base: from scratch, ``b = 6L/(λ ε P w0)``, per-call ε/3;
    * a bucket of 2^i blocks: PBERM toward its chain predecessor's released
      model, ``b = 12L/(λ w0 ε)``, per-call ε/(6·2^i) (the E-7 fix: 12, not 6).

    The release is the last model of the chain (size w0 in exact mode; the
    newest block when r is odd, the oldest when r is even). Per record:
    base ε/3, plus < ε/3 as a right bucket and < ε/3 as a left bucket, so the
    sequence is ε-DP (Thm 7; exact maxima e.g. 7/12·ε for W = 7).

    State (design D1.3): the small state (:meth:`to_state` with an engine's log)
    is the partial block (< w0 points) and one model per bucket (k =
    log₂(W + 1) models in exact mode; at most 1 + ⌈log₂P⌉ + ⌈log₂(ℓ_max+1)⌉
    in general mode) — O(w0·d + k·p) numbers whatever t. The
    :class:`BlockLog` retains the W − 1 newest blocks, the part of the next
    window already seen (< w points); releases at even offsets r and at
    refreshes read them back, at odd r the release trains on the new block only.
    """

    name = "erm_sliding"
    config_cls = SlidingWindowERMConfig

    def __init__(self, epsilon: float, block_size: int, window: int, n_features: int,
                 classes: Sequence, feature_bound: float, lam: float,
                 fit_intercept: bool = _DEFAULT.fit_intercept, noise: str = _DEFAULT.noise,
                 delta: Optional[float] = _DEFAULT.delta,
                 window_policy: str = _DEFAULT.window_policy, rng: RngLike = None,
                 tol_fraction: float = _DEFAULT.tol_fraction,
                 log: Optional[BlockLog] = None) -> None:
        # The parameters are SlidingWindowERMConfig's: checked there, once, for the transform too.
        config = SlidingWindowERMConfig(
            epsilon=epsilon, block_size=block_size, window=window, n_features=n_features,
            classes=classes, feature_bound=feature_bound, lam=lam, fit_intercept=fit_intercept,
            noise=noise, delta=delta, window_policy=window_policy, tol_fraction=tol_fraction)
        self._setup(config, rng, log)

    def _setup(self, config, rng, log):
        super()._setup(config, rng, log)
        self.window = config.window
        self.window_policy = config.window_policy
        self.W = config.window_blocks
        self.P = (self.W + 1) // 2
        self.left_capacity = self.W - self.P
        self._base_op = self._component(1.0)
        self._models = {}

    @property
    def effective_window(self) -> int:
        """Records in the window actually used (w rounded as the policy says); must be logged."""
        return self.W * self.block_size

    def base_noise_scale(self) -> float:
        return self._base_op.call_noise(self.P * self.block_size, 1.0 / 3.0)["scale"]

    def finetune_noise_scale(self, level: int = 0) -> float:
        return self._base_op.call_noise((1 << level) * self.block_size, 1.0 / (6.0 * (1 << level)))["scale"]

    def _expiry(self, side, lo, hi, i, b_s, b_e, r):
        P = self.P
        if side == "B":
            return b_e + P
        if side == "R":
            return b_e + min(((r >> (i + 1)) + 1) << (i + 1), P)
        a = b_s - 1 - hi
        return b_e + min(self.left_capacity - (a + (1 << i) - 1), P)

    def plan(self, s: int) -> Tuple[int, List[Tuple[BucketKey, Optional[int], int]], List[BucketKey]]:
        """Public schedule at step s: ``(r, chain, new)`` with chain keys ``(side, lo, hi)``
        ordered from the base (first) to the released bucket (last). Does not train."""
        _, r, _, buckets = sliding_buckets(s, self.W, self.P)
        b_e = buckets[0][2]
        b_s = buckets[0][1]
        models = {} if r == 0 else self._models
        items = []
        for side, lo, hi, i in buckets:
            key = (side, lo, hi)
            exp = models[key]["expiry"] if key in models else self._expiry(side, lo, hi, i, b_s, b_e, r)
            rank = {"B": 0, "L": 1, "R": 2}[side]
            items.append(((-exp, -(hi - lo + 1), rank), key, i, exp))
        items.sort()
        chain = [(key, i, exp) for _, key, i, exp in items]
        new = [key for key, _, _ in chain if key not in models]
        return r, chain, new

    def _schedule(self, c):
        s = c - 1
        if s < self.W - 1:
            return []
        r, chain, _ = self.plan(s)
        keys = {key for key, _, _ in chain}
        if r == 0:
            self._models = {}
        self._models = {k: v for k, v in self._models.items() if k in keys}
        window = (s - self.W + 1, s + 1)   # block interval (lo, hi] in 1-based counts
        prev = None
        for key, level, exp in chain:
            if key not in self._models:
                side, lo, hi = key
                blocks = (lo, hi + 1)
                if side == "B":
                    rel = self._release(self._base_op, "base", self.P.bit_length() - 1, blocks, None,
                                        1.0 / 3.0, [blocks], window)
                else:
                    parent = self._models[prev]["release"]
                    lineage = [(a // self.block_size, b // self.block_size) for a, b in parent.depends_on]
                    rel = self._release(self._base_op, "right" if side == "R" else "left", level, blocks,
                                        parent, 1.0 / (6.0 * (1 << level)), lineage + [blocks], window)
                self._models[key] = {"release": rel, "parent": prev, "expiry": exp}
            prev = key
        released = self._models[prev]["release"]
        if released.window != (window[0] * self.block_size, window[1] * self.block_size):
            # A reused model is released again for the new window: same
            # parameters and noise (post-processing), only the label changes.
            released = ModelRelease(**{**released.__dict__, "t": self.t,
                                       "window": (window[0] * self.block_size, window[1] * self.block_size)})
        return [released]

    def _retain_from(self, c):
        # Every bucket lies in its step's window (lineage closure, E-7), and
        # the next window is blocks c − W + 2 .. c + 1.
        return c - self.W + 2

    def _dynamic_state(self):
        models = [SlidingModelState(list(k), v["release"].to_dict(),
                                    None if v["parent"] is None else list(v["parent"]), v["expiry"])
                  for k, v in self._models.items()]
        return SlidingWindowState(models).to_state()

    def _load_dynamic(self, d):
        self._models = {tuple(m.key): {"release": ModelRelease.from_dict(m.release),
                                       "parent": None if m.parent is None else tuple(m.parent),
                                       "expiry": m.expiry}
                        for m in SlidingWindowState.from_state(d).models}

    def _model_count(self):
        return len(self._models)
