"""The interface between the ordered release DoFn and a mechanism, and the names they share.

A :class:`ReleaseSpec` says how to build and restore a stream's mechanism,
how to merge the per-step aggregates and what to emit at each step; the
release DoFn (:mod:`dp_beam.transforms.release`) knows nothing else about
it. :class:`ContinualResult` is what every continual transform returns, and
the constants name its tagged outputs, the ``next_step`` of a closed stream
and the planned ledger attached to its ``.accounting`` output.
"""

from typing import Any, Iterable, List, NamedTuple, Optional

import apache_beam as beam

from dp_beam.mechanisms.noise_key import encode_identity

__all__ = ["ACCOUNTING", "CLOSED", "ContinualResult", "key_label", "NOT_ADMITTED",
           "PLAN_ATTRIBUTE", "ReleaseSpec"]

ACCOUNTING = "accounting"
#: ``next_step`` of a stream that will release nothing more.
CLOSED = 2 ** 62
NOT_ADMITTED = "key not admitted by private key selection"
#: Attribute of an ``.accounting`` PCollection holding the transform's planned
#: ledger entries, read by ``CombineAccounting`` and ``dp_beam.plan``.
PLAN_ATTRIBUTE = "dp_beam_plan"


class ContinualResult(NamedTuple):
    """The outputs of a continual transform."""
    releases: beam.PCollection
    accounting: beam.PCollection
    invalid: beam.PCollection


class ReleaseSpec:
    """What the ordered release DoFn needs to know about a mechanism (engine-free).

    Subclasses implement :meth:`new_mechanism`, :meth:`restore`,
    :meth:`release` and :meth:`ledger`; aggregates are ``(value, events)``
    pairs by default (``zero``/``merge`` may be overridden). ``uses_log``
    (default False) asks for a per-key :class:`~dp_beam.transforms.bag_log.BagLog`.
    """

    #: Human-readable label of the transform (used in records and metrics).
    transform: str = ""
    #: Step length in seconds; step k covers [k·step, (k+1)·step).
    step_seconds: float = 1.0
    #: Number of steps a stream may release, or None for unbounded.
    horizon: Optional[int] = None
    #: True: the mechanism keeps data it may need again in an append-only per-key
    #: log (a :class:`~dp_beam.transforms.bag_log.BagLog` over a ``BagState``)
    #: instead of its own state, and :meth:`new_mechanism` / :meth:`restore`
    #: take it as ``log=``. The DoFn then
    #: rewrites only the mechanism's small state at each firing.
    uses_log: bool = False

    def zero(self) -> Any:
        return (0.0, 0)

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])

    def events(self, aggregate: Any) -> int:
        return int(aggregate[1])

    def new_mechanism(self, rng: Any, first: Optional[int] = None) -> Any:
        """A new mechanism for a stream opening at step ``first`` (with ``uses_log``, called with
        ``log=`` as well)."""
        raise NotImplementedError

    def restore(self, state: Any, rng: Any) -> Any:
        """The mechanism of ``state`` (with ``uses_log``, called with ``log=`` as well)."""
        raise NotImplementedError

    def reseed(self, mechanism: Any, rng: Any, **with_log: Any) -> Any:
        """``mechanism`` continuing with the noise source ``rng``: by default
        ``restore(mechanism.to_state(), rng)``; a spec whose mechanisms can swap
        their source in place may do that instead (the same releases, without
        the state round trip at every step)."""
        return self.restore(mechanism.to_state(), rng, **with_log)

    def release(self, mechanism: Any, key: Any, step: int, aggregate: Any) -> Iterable[Any]:
        """Feeds one step's aggregate to the mechanism; returns the records to emit."""
        raise NotImplementedError

    def ledger(self, key: Any) -> List[Any]:
        """Ledger entries charged when the stream of ``key`` opens."""
        raise NotImplementedError

    def lockstep(self, mechanisms: List[Any]) -> Optional[Any]:
        """An object that steps these streams' mechanisms together, or ``None`` (the default)
        for each to step on its own. Offered only for streams that release the same
        steps, each from its own source per step; a spec that returns one must release
        every one of those steps (:meth:`done` stays False) and give in
        :meth:`release_lockstep` exactly the records of :meth:`release`."""
        return None

    def release_lockstep(self, lockstep: Any, keys: List[Any], step: int,
                         aggregates: List[Any], sources: List[Any]) -> Iterable[Any]:
        """:meth:`release` of every stream of ``lockstep`` (key ``keys[j]``, aggregate
        ``aggregates[j]``, noise source ``sources[j]``) at one step."""
        raise NotImplementedError

    def done(self, mechanism: Any) -> bool:
        """True when the stream will release nothing more (key selection after admission)."""
        return False

    def window_end(self, step: int) -> float:
        return (step + 1) * self.step_seconds


def key_label(key: Any) -> Any:
    """A stream key as a noise identity label: itself when it has a canonical encoding
    (str, int, float, bytes, None, tuples of those), else its type and ``repr``."""
    if key is None or type(key) in (str, int, float, bytes):
        return key
    try:
        encode_identity((key,))
        return key
    except ValueError:
        return ("repr", type(key).__module__, type(key).__qualname__, repr(key))
