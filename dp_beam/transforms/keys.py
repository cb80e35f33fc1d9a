"""Private key selection over an unbounded stream: ``keys=dpb.PrivateKeys(...)``.

A key seen in the data is not public (``docs/design.md`` D4): one event of a
new key would create a stream. When the key set cannot be declared, it is
selected privately, as PipelineDP and Privacy on Beam do for batch partitions,
but continually: each candidate key runs a continual counter over the number
of *distinct privacy units* that have contributed to it, and is **admitted**
at the first step where that noisy running count reaches a public threshold
(:class:`dp_beam.mechanisms.key_selection.KeySelection` states the threshold,
its derivation and the cost).

Shape: the transform's per-unit stage (contribution bounding) emits one
``(key, event time)`` signal the first time a unit contributes to a key, and
bounds every unit to its first ``max_keys_per_unit`` keys (the rest go to
``.invalid``); the signals are counted per (key, step) and fed to an ordered
release DoFn per candidate key that opens at the key's first step with data
(the counter is aligned to the public start: it starts as if it had counted
zeros since then) and stops at admission. An admission is a release: it goes
to ``.releases`` as a :class:`~dp_beam.records.KeyAdmitted` record and opens
the key's statistic stream at that step, whose first release aggregates all
of the key's earlier events (so its sensitivity is unchanged). The
selection's own cost is one ledger entry on ``.accounting`` and composes
sequentially with the statistic's.

A candidate key that is never admitted releases nothing. With a declared
``end`` its events go to ``.invalid`` ("key not admitted") when the stream
ends; streaming without ``end`` keeps them in state for as long as the key
may still be admitted.
"""

import math
from typing import Optional, Tuple, Union

import apache_beam as beam
from apache_beam import pvalue

from dp_beam.mechanisms.key_selection import KeySelection
from dp_beam.mechanisms.noise import NoiseSource
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import KeyAdmitted, LedgerEntry
from dp_beam.transforms.release import OrderedReleaseDoFn
from dp_beam.transforms.release_spec import ACCOUNTING, ReleaseSpec
from dp_beam.transforms.events import INVALID
from dp_beam.transforms.schedule import NotAdmitted, Schedule, StreamStart
from dp_beam.transforms.stream_keys import KV

__all__ = ["PrivateKeys", "UNITS", "select_keys"]

#: Tag of the per-unit stages' "first contribution of a unit to a key" signals.
UNITS = "units"
_NOT_ADMITTED = "not_admitted"


class PrivateKeys:
    """Select the keys of a continual transform privately, continually (``keys=PrivateKeys(...)``).

    Privacy cost: (ε, δ)-DP for the privacy unit of the transform it is given
    to, over the whole (unbounded) stream, under add/remove of one unit; each
    unit counts towards at most ``max_keys_per_unit`` keys (its first ones;
    its events under further keys go to ``.invalid``). It composes sequentially with the
    statistic's own cost; ``dpb.plan`` and ``CombineAccounting`` show both.
    Which keys of a unit count is decided from that unit's own events only
    (``ContinualMean`` in batch: event-time order; ``ContinualCount`` and
    ``ContinualSum``: the order the runner delivers them), which the privacy
    argument allows: any rule that depends on the unit alone keeps the bound.

    Args:
      epsilon: ε of the selection (> 0).
      delta: δ of the selection, in (0, 1): bounds the probability that a key
        only one unit contributed to is ever admitted.
      max_keys_per_unit: m, the keys one unit may contribute to.
      noise: ``"laplace"`` (default) or ``"gaussian"``; Gaussian noise needs
        ``method="counter"``.
      method: ``"sparse_vector"`` (default): each key runs AboveThreshold,
        an exact count of distinct units against a noisy threshold, with
        fresh noise every step. ``"counter"``: each key runs a binary-tree
        continual counter against a threshold. Both are (ε, δ)-DP with the
        same δ accounting (module docstring of
        :mod:`dp_beam.mechanisms.key_selection`). The default is the one that
        admits more keys: on the flights benchmark (``docs/key_selection.md``:
        aircraft as the unit, routes as keys, 365 daily steps, δ = 1e-6,
        m = 1, ε = 1) the sparse vector's threshold is 46.1 distinct units,
        the Laplace counter's 184–330 (its count carries the tree's
        log-depth noise), and the sparse vector admits about 40 of 180
        routes where the Laplace counter admits 1 and the Gaussian counter
        5.5 (PipelineDP's batch selection keeps 75, once, at the end of the
        year).

    >>> import dp_beam as dpb
    >>> keys = dpb.PrivateKeys(epsilon=0.5, delta=1e-6)
    >>> keys.max_keys_per_unit, round(keys.selection(365).threshold(1), 1) > 1
    (1, True)
    >>> keys.method, keys.ledger_entry("count", "user", 365).mechanism
    ('sparse_vector', 'key_selection+sparse_vector(laplace)')
    """

    def __init__(self, epsilon: float, delta: float, max_keys_per_unit: int = 1,
                 noise: str = "laplace", method: str = "sparse_vector") -> None:
        # Validated now, naming the parameter; the horizon is known only once
        # the transform's schedule is.
        KeySelection(epsilon, delta, max_keys_per_unit=max_keys_per_unit, noise=noise, method=method)
        self.epsilon, self.delta = float(epsilon), float(delta)
        self.max_keys_per_unit = int(max_keys_per_unit)
        self.noise = noise
        self.method = method

    def selection(self, horizon: Optional[int] = None) -> KeySelection:
        """The engine-free selection for streams of ``horizon`` steps (``None``: unbounded)."""
        return KeySelection(self.epsilon, self.delta, max_keys_per_unit=self.max_keys_per_unit,
                            noise=self.noise, horizon=horizon, method=self.method)

    def ledger_entry(self, transform: str, unit: str, horizon: Optional[int] = None) -> LedgerEntry:
        """The selection's one charge (``scope="stream"``: all keys together)."""
        selection = self.selection(horizon)
        cost = selection.privacy_cost()
        return LedgerEntry(
            transform=f"{transform}/keys", unit=unit,
            neighbours=(f"add/remove one {unit} (contributing to at most "
                        f"{self.max_keys_per_unit} key(s))"),
            epsilon=cost.epsilon, delta=cost.delta,
            # Thresholding adds a δ that no zCDP bound covers: no ρ is claimed.
            rho=math.inf, mechanism=selection.mechanism, scope="stream",
            key=None, sensitivity=1.0, noise="threshold", relation="add/remove")

    def __repr__(self) -> str:
        return (f"PrivateKeys(epsilon={self.epsilon!r}, delta={self.delta!r}, "
                f"max_keys_per_unit={self.max_keys_per_unit!r}, noise={self.noise!r}, "
                f"method={self.method!r})")


class _SelectionSpec(ReleaseSpec):
    """Feeds each candidate key's per-step count of new units to its :class:`KeyCounter`."""

    def __init__(self, transform, schedule: Schedule, selection: KeySelection):
        self.transform = transform
        self.step_seconds = schedule.step_seconds
        self.horizon = None
        self._start = schedule.start_step
        self._end = schedule.end_step
        self._selection = selection

    def zero(self):
        return 0

    def merge(self, a, b):
        return a + b

    def events(self, aggregate):
        # Unit signals are derived counts, not input events: nothing here is
        # ever an invalid element (the events themselves are accounted for by
        # the statistic's release).
        return 0

    def new_mechanism(self, rng, first=None):
        return self._selection.new_counter(first - self._start + 1, rng=rng)

    def restore(self, state, rng):
        return self._selection.restore(state, rng=rng)

    def release(self, mechanism, key, step, aggregate):
        if mechanism.step(int(aggregate)):
            start, end = step * self.step_seconds, (step + 1) * self.step_seconds
            yield KeyAdmitted(key=key, step=step, window_start=start, window_end=end,
                              threshold=float(self._selection.threshold(mechanism.t)),
                              mechanism=self._selection.mechanism,
                              transform=self.transform)
        elif self._end is not None and step == self._end - 1:
            # Internal only (never released): lets the statistic's release
            # dead-letter the events it held for this key.
            yield pvalue.TaggedOutput(_NOT_ADMITTED, (key, (self._end - 1, NotAdmitted())))

    def done(self, mechanism):
        return mechanism.admitted is not None

    def ledger(self, key):
        return []


class _StepCount(beam.DoFn):
    """``(key, event time)`` → ``((key, step), 1)`` on the schedule's grid."""

    def __init__(self, schedule):
        self._schedule = schedule

    def process(self, element):
        key, ts = element
        yield (key, self._schedule.step_of(ts)), 1


def select_keys(units: beam.PCollection, private_keys: PrivateKeys, schedule: Schedule,
                transform: str, unit: str, bounded: bool,
                seed: Union[None, int, NoiseSource] = None, noise_key: Optional[NoiseKey] = None,
                ) -> Tuple[beam.PCollection, beam.PCollection, LedgerEntry, beam.PCollection]:
    """The selection branch: unit signals → admissions.

    ``units`` holds ``(key, event time)``, one per (unit, key) pair, at most
    ``max_keys_per_unit`` per unit. Returns ``(admissions, seeds,
    ledger_entry, accounting)``: the :class:`KeyAdmitted` records (public
    releases), the elements that open (``StreamStart``) or dead-letter
    (``NotAdmitted``) the statistic's streams, the planned entry and the
    PCollection that charges it.
    """
    schedule.require_end(bounded, transform)
    selection = private_keys.selection(schedule.steps)
    spec = _SelectionSpec(f"{transform}/keys", schedule, selection)
    counts = (units
              | "KeyUnitWindow" >> beam.WindowInto(beam.window.GlobalWindows())
              | "KeyUnitStep" >> beam.ParDo(_StepCount(schedule)))
    if bounded:
        # Batch: one element per (key, step) instead of one per unit.
        counts = counts | "KeyUnitsPerStep" >> beam.CombinePerKey(sum)
    per_step = counts | "KeyCounts" >> beam.Map(
        lambda kv: (kv[0][0], (kv[0][1], kv[1]))).with_output_types(KV)
    decided = per_step | "SelectKeys" >> beam.ParDo(OrderedReleaseDoFn(
        spec, bounded=bounded, late="defer", seed=seed, end_step=schedule.end_step,
        opens="data", noise_key=noise_key)).with_outputs(_NOT_ADMITTED, ACCOUNTING, INVALID, main="admitted")
    admitted = decided.admitted
    opened = admitted | "OpenAdmitted" >> beam.Map(lambda r: (r.key, (r.step, StreamStart())))
    seeds = (opened, decided[_NOT_ADMITTED]) | "AdmissionSeeds" >> beam.Flatten()
    entry = private_keys.ledger_entry(transform, unit, schedule.steps)
    accounting = units.pipeline | "KeySelectionLedger" >> beam.Create([entry])
    return admitted, seeds, entry, accounting


@beam.typehints.with_output_types(KV)
class EventUnits(beam.DoFn):
    """Event-level selection: every valid event is its own unit → ``(key, event time)``."""

    def process(self, element, windowed=beam.DoFn.WindowedValueParam):
        key, _ = element
        yield key, windowed.timestamp_micros / 1e6

