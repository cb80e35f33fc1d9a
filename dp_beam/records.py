"""Output records of every dp_beam transform.

Records are ``NamedTuple``s: Beam encodes them with a deterministic row coder,
and ``to_json`` gives the JSON-lines form written by :mod:`dp_beam.io`. Times
are epoch seconds. The schemas are part of the public contract
(``docs/design.md`` D1); ``SCHEMA_VERSION`` changes whenever a field is added or its
meaning changes.
"""

import hashlib
import json
import math
import re
from typing import Any, NamedTuple, Optional

__all__ = ["AccountingReport", "invalid_id", "InvalidElement", "KeyAdmitted", "LedgerEntry",
           "RELATIONS", "Release", "SCHEMA_VERSION", "to_json"]

SCHEMA_VERSION = 2

#: The neighbour relations a ledger entry can be stated for (``LedgerEntry.relation``).
RELATIONS = ("add/remove", "replace", "values")


class Release(NamedTuple):
    """One private release of one stream at one time step.

    ``value`` is the noisy running total from the stream's first step through
    ``step`` (or the per-step difference when the transform was built with
    ``output="per_step"``). ``noise_std`` is the public standard deviation of the
    noise in ``value`` and ``ci95`` the half-width of its exact 95 % interval:
    both are functions of public parameters only.

    >>> r = Release("AA", 3, 10800.0, 14400.0, 41.5, 2.83, 5.54, "tree", "hourly", 4)
    >>> to_json(r)["value"], r.value - r.ci95 < 41.5 < r.value + r.ci95
    (41.5, True)
    """
    key: Any
    step: int
    window_start: float
    window_end: float
    value: float
    noise_std: float
    ci95: float
    mechanism: str
    transform: str = ""
    t: int = 0  # 1-based index of the step within its stream


class KeyAdmitted(NamedTuple):
    """A key admitted by private key selection (``keys=dpb.PrivateKeys(...)``): a release.

    From ``step`` on, the key's statistic stream releases every step; its
    first release covers all of the key's events before. ``threshold`` is the
    public threshold the noisy count of distinct privacy units reached.

    >>> a = KeyAdmitted("JFK-LAX", 12, 1036800.0, 1123200.0, 31.4, "key_selection+tree(laplace)",
    ...                 "flights/keys")
    >>> to_json(a)["record"], a.step
    ('KeyAdmitted', 12)
    """
    key: Any
    step: int
    window_start: float
    window_end: float
    threshold: float
    mechanism: str
    transform: str = ""


class LedgerEntry(NamedTuple):
    """A privacy charge, emitted on a transform's ``.accounting`` output.

    ``unit`` is the privacy unit (``"event"`` or ``"user"``), ``neighbours``
    the neighbour relation the guarantee is stated for, in words, and
    ``relation`` the same relation as one of :data:`RELATIONS`, which is what
    composition reads:

    * ``"add/remove"``: neighbouring inputs differ by adding or removing one
      unit (an event, or all events of a user);
    * ``"replace"``: they differ in one unit's data, the number of units being
      public (the ERM transforms: replace one event, count-triggered blocks);
    * ``"values"``: they differ in one user's values, the arrival pattern (who
      sends a sample, when, and under which key) being public
      (``ContinualMean(neighbours="values")``).

    ``scope`` names the
    partition the charge applies to: ``"stream"`` for an unkeyed stream and
    ``"key"`` for one stream per key, in which case ``key`` says which and the
    charges of different keys of one transform compose in parallel (each event,
    and after contribution bounding each user's budget, is split over disjoint
    keys). ``rho`` is the zCDP cost the same mechanism satisfies.
    ``max_contributions`` is the declared per-user event bound of a user-level
    transform (``None`` at the event level). ``group`` is the factor by which
    a stability or group-privacy step scaled the mechanism's own cost (1 when
    none did).

    >>> e = LedgerEntry("hourly", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree",
    ...                 "stream")
    >>> to_json(e)["version"], e.group, e.relation
    (2, 1, 'add/remove')
    """
    transform: str
    unit: str
    neighbours: str
    epsilon: float
    delta: float
    rho: float
    mechanism: str
    scope: str
    key: Any = None
    sensitivity: float = 0.0
    noise: str = ""
    calibration: str = ""
    max_contributions: Optional[int] = None
    group: int = 1
    version: int = SCHEMA_VERSION
    relation: str = "add/remove"  # one of RELATIONS (schema version 2)


class InvalidElement(NamedTuple):
    """An input element the transform could not use, with the reason.

    ``count`` is the number of input events the record stands for: 1 for a
    rejected element; more for a late aggregate dropped under ``late="drop"``
    (its events were already combined when the lateness became known) and
    for the events of one user beyond a contribution cap, which are
    aggregated into one record per user, reason and step (``element`` then
    holds the user, the step, and one of the events as an example). Over a
    whole run, input events = events used + sum of ``count`` over ``.invalid``.

    ``id`` identifies the dead letter for de-duplication (a sink retried
    after a failure writes its records again): a hash of the transform
    label, the reason, a canonical encoding of ``element``, its event time
    and ``count``, so a retried or replayed bundle gives the same id. Build
    records with :meth:`of` to get it. Two identical elements with the same
    event time rejected by one transform share an id: keep duplicates of an
    id when counting, de-duplicate only lines written twice.

    >>> bad = InvalidElement.of("delay", "value is NaN", {"dep_delay": float("nan")}, 3600.0)
    >>> to_json(bad)["element"], bad.count, len(bad.id)
    ({'dep_delay': 'nan'}, 1, 32)
    >>> bad.id == InvalidElement.of("delay", "value is NaN", {"dep_delay": float("nan")}, 3600.0).id
    True
    """
    transform: str
    reason: str
    element: Any
    count: int = 1
    id: str = ""

    @classmethod
    def of(cls, transform: str, reason: str, element: Any, timestamp: Optional[float] = None,
           count: int = 1) -> "InvalidElement":
        """The record with its stable :attr:`id` (``timestamp``: event time in seconds or ``None``)."""
        return cls(transform, reason, element, count,
                   invalid_id(transform, reason, element, timestamp, count))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _canonical(value, depth=0):
    """A JSON-serialisable form of ``value`` that is the same in every process: dicts and
    sets sorted, no memory addresses, floats as exact strings (for :func:`invalid_id`)."""
    if depth > 32:
        return "<deep>"
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, dict):
        items = [[_canonical(k, depth + 1), _canonical(v, depth + 1)] for k, v in value.items()]
        return {"dict": sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if isinstance(value, (set, frozenset)):
        items = [_canonical(v, depth + 1) for v in value]
        return {"set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, depth + 1) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _canonical(value.tolist(), depth + 1)
    text = repr(value)
    if _ADDRESS.search(text):
        # A default repr: the object's fields say what it is, its address nothing.
        t = type(value)
        fields = getattr(value, "__dict__", None)
        if fields is None:
            slots = [s for c in t.__mro__ for s in getattr(c, "__slots__", ())]
            fields = {s: getattr(value, s) for s in slots if hasattr(value, s)}
        return {"object": f"{t.__module__}.{t.__qualname__}",
                "fields": _canonical(dict(fields), depth + 1)}
    return {"repr": f"{type(value).__qualname__}:{text}"}


def invalid_id(transform: str, reason: str, element: Any, timestamp: Optional[float] = None,
               count: int = 1) -> str:
    """The stable id of a dead letter (:attr:`InvalidElement.id`): 32 hex digits."""
    payload = json.dumps([transform, reason, _canonical(element),
                          None if timestamp is None else repr(float(timestamp)), count],
                         sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(payload.encode("ascii")).hexdigest()[:32]


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _jsonable(value.tolist())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def to_json(record: Any) -> dict:
    """A JSON-serialisable dict of a record, with ``record`` naming its type.

    Values JSON cannot hold (NaN, infinities, arbitrary objects in an invalid
    element) are written as their ``repr`` so a dead letter is never lost to a
    serialisation error.
    """
    out = {"record": type(record).__name__}
    out.update({k: _jsonable(v) for k, v in record._asdict().items()})
    return out


class AccountingReport(NamedTuple):
    """The composed privacy cost of a set of transforms for one privacy unit.

    ``relation`` is the neighbour relation the total is stated for (one of
    :data:`RELATIONS`): charges stated for another relation enter converted
    where a conversion holds (an add/remove charge counts twice under
    ``"replace"`` and ``"values"``), and make the total unbounded where none
    does (see :func:`dp_beam.accounting.compose`).
    ``epsilon``/``delta`` are basic sequential composition across transforms
    (after parallel composition across the keys of each transform and group
    privacy where a unit spans several records); ``rho`` adds the zCDP costs.
    ``epsilon_at_delta`` is the smallest ε valid at δ = ``at_delta`` (the
    budget's δ) over basic composition, privacy loss distributions and the
    zCDP conversion; ``method`` names the route. ``None`` means no finite bound
    follows (see ``note``). ``remaining_*`` is the budget minus the cost,
    ``None`` where the budget does not constrain that quantity. ``lines`` are
    the ledger entries the report was composed from.

    >>> from dp_beam.accounting import Budget, compose
    >>> e = LedgerEntry("hourly", "event", "add/remove one event", 0.5, 0.0, 0.125, "tree",
    ...                 "stream")
    >>> (report,) = compose([e], Budget(epsilon=1.0))
    >>> report.unit, report.epsilon, report.remaining_epsilon, report.within_budget
    ('event', 0.5, 0.5, True)
    >>> report.relation, to_json(report)["version"]
    ('add/remove', 2)
    """
    unit: str
    epsilon: Optional[float]
    delta: Optional[float]
    rho: Optional[float]
    epsilon_at_delta: Optional[float]
    at_delta: Optional[float]
    method: str
    budget_epsilon: Optional[float]
    budget_delta: Optional[float]
    budget_rho: Optional[float]
    remaining_epsilon: Optional[float]
    remaining_delta: Optional[float]
    remaining_rho: Optional[float]
    within_budget: bool
    transforms: tuple
    lines: tuple
    note: str = ""
    version: int = SCHEMA_VERSION
    relation: str = "add/remove"  # one of RELATIONS (schema version 2)
