"""Machinery shared by the private-ERM streams: configuration, blocks, state.

``docs/privacy/erm.md`` E-1, E-5 to E-7, E-9 and design D1.3 (seed 004:
Watson et al., *Continual and Sliding Window Release for Private ERM*).
Time is record count: a stream's ``t`` is the number of points consumed and
intervals ``(a, b]`` are half-open record ranges. A stream buffers points
into blocks, keeps complete blocks in a :class:`~.log.BlockLog`, asks its
subclass which models the new block triggers, and serialises a small state
(:meth:`ERMStream.to_state`) apart from the log.
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike

from ...accounting.cost import Cost
from ..calibration import rho_from_eps_delta
from ..noise import RngLike, make_noise
from ..state import OMITTED, StateRecord, state_field
from .log import BlockLog, MemoryBlockLog
from .perturbation import OutputPerturbation
from .record import ModelRelease

if TYPE_CHECKING:  # the config module imports this one (is_pow2)
    from .config import ERMConfig

__all__ = ["ERMBlockState", "ERMStream", "ERMStreamState", "is_pow2"]


@dataclasses.dataclass(frozen=True)
class ERMBlockState(StateRecord):
    """Points and labels: the partial block of a stream's state, or one retained block."""

    X: Any
    y: Any


def _blocks_from_state(blocks: Dict[str, Any]) -> Dict[str, ERMBlockState]:
    return {b: ERMBlockState.from_state(v) for b, v in blocks.items()}


@dataclasses.dataclass(frozen=True)
class ERMStreamState(StateRecord):
    """The state of an :class:`ERMStream` (see :meth:`ERMStream.to_state`).

    ``keep`` is optional (states written before it existed); exactly one of
    ``blocks`` (the retained blocks by index, a self-contained state) and
    ``log`` (``"external"``: the blocks stay in an engine's log) is written.
    """

    mechanism: str
    version: int
    config: Dict[str, Any]
    count: int
    keep: Any = state_field(default=OMITTED, kw_only=True)
    buffer: ERMBlockState = state_field(decode=ERMBlockState.from_state, kw_only=True)
    dynamic: Dict[str, Any] = state_field(kw_only=True)
    blocks: Any = state_field(decode=_blocks_from_state, default=OMITTED, kw_only=True)
    log: Any = state_field(default=OMITTED, kw_only=True)


def is_pow2(n: int) -> bool:
    """Whether ``n`` is a power of two (block and window counts of the bucket schedules)."""
    return n >= 1 and n & (n - 1) == 0


def _merge(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


class ERMStream:
    """Shared machinery: configuration, block buffering, retained blocks, state.

    A subclass names its :attr:`config_cls` (a :class:`~.config.ERMConfig`),
    builds that config from its keyword arguments and hands it to
    :meth:`_setup`, which every parameter check has already passed;
    :meth:`from_config` builds a stream from a config directly.
    """

    name = None
    STATE_VERSION = 1
    #: The :class:`~.config.ERMConfig` subclass holding the family's parameters.
    config_cls: type = None

    @classmethod
    def from_config(cls, config: "ERMConfig", rng: RngLike = None,
                    log: Optional[BlockLog] = None) -> "ERMStream":
        """The stream of a validated ``config`` (an instance of :attr:`config_cls`);
        ``rng`` and ``log`` as in the constructor."""
        if not isinstance(config, cls.config_cls):
            raise ValueError(f"config must be a {cls.config_cls.__name__}, got {config!r}")
        stream = cls.__new__(cls)
        stream._setup(config, rng, log)
        return stream

    def _setup(self, config: "ERMConfig", rng: RngLike, log: Optional[BlockLog]) -> None:
        if log is not None and not all(callable(getattr(log, m, None)) for m in ("append", "read", "release_before")):
            raise ValueError(f"log must be a BlockLog (append, read, release_before) or None, got {log!r}")
        #: The validated parameters (:class:`~.config.ERMConfig`); the attributes below mirror them.
        self.config = config
        self.block_size = config.block_size
        self.loss = config.loss()
        self.epsilon = config.epsilon
        self.lam = config.lam
        self.noise = config.noise
        self.delta = config.delta
        self.tol_fraction = config.tol_fraction
        self._source = make_noise(rng)
        # Complete blocks: index (1-based count) -> (X clipped, class indices).
        self._log = MemoryBlockLog() if log is None else log
        self._keep = 1             # first block a future training may read
        self._buffer_X, self._buffer_y = [], []
        self._count = 0            # complete blocks consumed
        self._trained = []         # models trained by the last block, in training order
        self._ops = []             # the components of _component, which draw from _source

    def _component(self, share):
        """Output perturbation with ``share`` of the budget (ε·share, or ρ·share for Gaussian)."""
        if self.noise == "gaussian":
            # ρ(ε, δ)·share as a ρ-budget: build with the total and scale ρ.
            op = OutputPerturbation(self.loss, self.lam, self.epsilon, self.noise, self.delta,
                                    rng=self._source, tol_fraction=self.tol_fraction)
            op.rho = op.rho * share
        else:
            op = OutputPerturbation(self.loss, self.lam, self.epsilon * share, self.noise, None,
                                    rng=self._source, tol_fraction=self.tol_fraction)
        self._ops.append(op)
        return op

    def set_noise_source(self, rng: RngLike) -> None:
        """Draw all later noise from ``rng`` (resolved like the constructor's).

        The state is unchanged, so this equals ``from_state(to_state(), rng, log)``
        with the stream's own log, without the round trip that a release DoFn
        would otherwise pay at every step to give the step its own keyed
        source (design D1.3).
        """
        self._source = make_noise(rng)
        for op in self._ops:
            op.source = self._source   # as the constructor's make_noise(rng=self._source) leaves it

    @property
    def t(self) -> int:
        """Number of points consumed in complete blocks."""
        return self._count * self.block_size

    def _config(self):
        return self.config.to_dict()

    def privacy_cost(self) -> Cost:
        """The cost of the whole release sequence, per record (E-5 to E-7, E-9)."""
        if self.noise == "gaussian":
            return Cost.gaussian(rho_from_eps_delta(self.epsilon, self.delta), self.delta,
                                 epsilon=self.epsilon)
        return Cost.laplace(self.epsilon)

    # -- input --------------------------------------------------------------------

    def push(self, x: ArrayLike, y: Any) -> List[ModelRelease]:
        """Buffer one point; when a block completes, run :meth:`step` and return its releases."""
        # The single-point forms: for one row, the batch forms' set-up costs more than the work.
        return self._take(self.loss.clip_point(x), self.loss.label_index(y))

    def _take(self, row, index):
        """Buffer one clipped row and its class index; consume the block they complete."""
        self._buffer_X.append(row)
        self._buffer_y.append(index)
        if len(self._buffer_y) < self.block_size:
            return []
        Xb, yb = np.array(self._buffer_X), np.array(self._buffer_y, dtype=np.int64)
        self._buffer_X, self._buffer_y = [], []
        return self._consume(Xb, yb)

    def extend(self, X: ArrayLike, y: ArrayLike) -> List[ModelRelease]:
        """Push many points in order; returns all releases they complete.

        The same releases and state as :meth:`push` per point, but checked first, all of
        them: a bad row or label, or ``X`` and ``y`` of different lengths, raises
        ValueError before any point is taken (pushing point by point would have consumed
        the points before it, and maybe drawn noise). The rows are clipped as one array,
        whose rows have :meth:`~.loss.LogisticLoss.clip_point`'s bits.
        """
        labels = list(y)
        X = np.asarray(X, dtype=np.float64)
        if not labels and X.size == 0:
            return []
        X = self.loss.clip(X)
        if X.shape[0] != len(labels):
            raise ValueError(f"X and y must hold the same number of points, got {X.shape[0]} "
                             f"and {len(labels)}")
        indices = [self.loss.label_index(v) for v in labels]
        out = []
        for row, index in zip(X, indices):
            out.extend(self._take(row, index))
        return out

    def step(self, X: ArrayLike, y: ArrayLike) -> List[ModelRelease]:
        """Consume one block of exactly ``block_size`` points; returns its releases (maybe none)."""
        if self._buffer_y:
            raise ValueError("step needs an empty point buffer; finish the block with push()")
        X = self.loss.clip(X)
        yi = self.loss.labels(y)
        if X.shape[0] != self.block_size or yi.shape[0] != self.block_size:
            raise ValueError(f"X and y must hold exactly block_size={self.block_size} points, "
                             f"got {X.shape[0]} and {yi.shape[0]}")
        return self._consume(X, yi)

    @property
    def trained_last_step(self) -> List[ModelRelease]:
        """Models trained (noise drawn) by the last block, in training order.

        Each costs its ``fraction`` of the budget for every record of its
        ``trained_on``; a release of an older model costs nothing. Summing
        these per record is the exact privacy accounting of E-5 to E-7, E-9.
        """
        return list(self._trained)

    def _consume(self, X, yi):
        self._count += 1
        self._trained = []
        self._log.append(self._count, (X, yi))
        releases = self._schedule(self._count)
        self._keep = max(self._keep, self._retain_from(self._count))
        self._log.release_before(self._keep)
        return releases

    @property
    def log(self) -> BlockLog:
        """The :class:`BlockLog` holding the complete blocks."""
        return self._log

    @property
    def retained_blocks(self) -> Tuple[int, int]:
        """``(first, last)``: the blocks a future training may read (empty if first > last)."""
        return self._keep, self._count

    def _data(self, lo, hi):
        """Points of blocks lo+1..hi (block interval (lo, hi]), read from the log."""
        blocks = self._log.read(lo, hi)
        return np.vstack([X for X, _ in blocks]), np.concatenate([y for _, y in blocks])

    def _release(self, op, kind, level, blocks, ref, fraction, depends_on, window):
        """Train on block interval ``blocks`` regularised toward release ``ref``; wrap the result."""
        X, yi = self._data(*blocks)
        theta_ref = None if ref is None else ref.params
        theta, noise = op.train(X, yi, theta_ref, fraction)
        bs = self.block_size
        rec = lambda iv: (iv[0] * bs, iv[1] * bs)  # noqa: E731
        release = ModelRelease(
            t=self.t, kind=kind, level=level, trained_on=rec(blocks),
            regulariser=None if ref is None else ref.trained_on,
            depends_on=_merge([rec(iv) for iv in depends_on]), window=rec(window),
            params=theta, classes=self.loss.classes, n_features=self.loss.n_features,
            fit_intercept=self.loss.fit_intercept, noise=self.noise,
            noise_scale=noise["scale"], noise_std=noise["std"], fraction=fraction,
            call_epsilon=fraction * op.epsilon if self.noise != "gaussian" else None,
            call_rho=fraction * op.rho,
        )
        self._trained.append(release)
        return release

    # -- state ------------------------------------------------------------------------

    def to_state(self) -> dict:
        """Plain dict (JSON-friendly): configuration, buffer, models, counters — and the blocks
        if the stream keeps them in memory.

        With the default :class:`MemoryBlockLog` the state is self-contained:
        it includes the retained blocks. With an engine's log (``log=`` at
        construction) it is only the *small state* — the partial block
        (< block_size points), the models (the class docstrings bound their
        number by O(log t)) and counters — and the blocks stay in that log; the
        state then says ``"log": "external"`` and :meth:`from_state` needs the
        same log. The noise source is not included; :meth:`from_state` takes
        its own. The state (like the log) holds raw clipped points and must be
        stored like the data.
        """
        blocks, log = OMITTED, "external"
        if isinstance(self._log, MemoryBlockLog):
            blocks = {str(b): ERMBlockState(X, y) for b, (X, y) in sorted(self._log.blocks.items())}
            log = OMITTED
        return ERMStreamState(
            self.name, self.STATE_VERSION, self._config(), self._count, keep=self._keep,
            buffer=ERMBlockState([np.asarray(r, dtype=np.float64) for r in self._buffer_X],
                                 list(self._buffer_y)),
            dynamic=self._dynamic_state(), blocks=blocks, log=log).to_state()

    @classmethod
    def from_state(cls, state: dict, rng: RngLike = None,
                   log: Optional[BlockLog] = None) -> "ERMStream":
        """Rebuild a stream from :meth:`to_state`; ``rng`` as in the constructor.

        ``log``: the :class:`BlockLog` that holds the blocks of a small state
        (``"log": "external"``); required for such a state. Given with a
        self-contained state, the state's blocks are appended to it (moving a
        stream's history into a durable log).
        """
        if not isinstance(state, dict) or state.get("mechanism") != cls.name:
            raise ValueError(f"state is not a {cls.name!r} state")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        record = ERMStreamState.from_state(state)
        external = record.log == "external"
        if external and log is None:
            raise ValueError("log is required: this state keeps its blocks in an external log")
        if not external and record.blocks is OMITTED:
            raise ValueError("state is missing field 'blocks'")
        try:
            obj = cls(**record.config, rng=rng, log=log)
            obj._count = int(record.count)
            obj._buffer_X = [np.asarray(r, dtype=np.float64) for r in record.buffer.X]
            obj._buffer_y = [int(v) for v in record.buffer.y]
            if not external:
                blocks = {int(b): (np.asarray(v.X, dtype=np.float64).reshape(-1, obj.loss.n_features),
                                   np.asarray(v.y, dtype=np.int64)) for b, v in record.blocks.items()}
                for b in sorted(blocks):
                    obj._log.append(b, blocks[b])
            default_keep = min(blocks, default=obj._count + 1) if not external else 1
            obj._keep = int(default_keep if record.keep is OMITTED else record.keep)
            obj._log.release_before(obj._keep)
            obj._load_dynamic(record.dynamic)
        except KeyError as err:
            raise ValueError(f"state is missing field {err.args[0]!r}") from None
        return obj

    def state_size(self) -> int:
        """``(points held, models held)``: the quantities the class docstring bounds.

        Points are the partial block plus the retained blocks
        (:attr:`retained_blocks`), wherever the log keeps them.
        """
        first, last = self.retained_blocks
        points = len(self._buffer_y) + max(0, last - first + 1) * self.block_size
        return points, self._model_count()
