"""``CombineAccounting``: one privacy report for all transforms of a pipeline.

At construction it composes the plans the transforms attached to their
``.accounting`` outputs and raises ``ValueError`` when the plan exceeds the
budget, before anything runs. At run time it merges the ledger entries the
streams actually charged into a report per privacy unit and neighbour
relation (``AccountingReport.relation``; one relation unless the plan mixes
them, see :func:`dp_beam.accounting.compose`), re-emitted
(accumulating) whenever a new stream starts, so a streaming pipeline's report
follows its activity; the last report of a batch run is the final one.
"""

import warnings
from typing import Dict, List, Optional, Sequence, Union

import apache_beam as beam
from apache_beam.transforms import trigger
from apache_beam.transforms.window import GlobalWindows

from dp_beam.accounting import Budget, check_budget, compose
from dp_beam.accounting.compose import group_size, per_transform
from dp_beam.accounting.costs import scale
from dp_beam.records import AccountingReport, LedgerEntry
from dp_beam.transforms.release_spec import PLAN_ATTRIBUTE

__all__ = ["CombineAccounting", "plan", "plan_entries", "scale_entry", "Stability",
           "UnboundedUserLevelWarning"]

#: What the accounting functions take: the ``.accounting`` output of one transform, or a
#: tuple, list or dict of them.
_PCollections = Union[beam.PCollection, Sequence[beam.PCollection], Dict[str, beam.PCollection]]


def _inputs(pcolls):
    if isinstance(pcolls, beam.PCollection):
        return [pcolls]
    if isinstance(pcolls, dict):
        return list(pcolls.values())
    if isinstance(pcolls, (list, tuple)):
        return list(pcolls)
    raise ValueError("CombineAccounting takes a PCollection, a tuple/list or a dict of "
                     f"the .accounting outputs of dp_beam transforms, got {type(pcolls)!r}")


def plan_entries(pcolls: _PCollections) -> List[LedgerEntry]:
    """The planned ledger entries attached to ``.accounting`` outputs."""
    entries = []
    for pc in _inputs(pcolls):
        plan = getattr(pc, PLAN_ATTRIBUTE, None)
        if plan is None:
            raise ValueError(f"{pc} carries no privacy plan: pass the .accounting output of a "
                             "dp_beam transform itself, not a derived PCollection")
        entries.extend(plan)
    return entries


def plan(pcolls: _PCollections, budget: Optional[Budget] = None,
         events_per_user: Optional[int] = None) -> List[AccountingReport]:
    """The per-unit reports of the planned costs, computed without running anything.

    Each report states the neighbour relation of its total (``relation``): a
    plan whose transforms share one relation gets one report per unit; a plan
    that mixes them gets the add/remove totals and those of every other
    relation present (charges converted or, where no conversion holds, the
    total unbounded with a note). Raises ``ValueError`` naming the transforms
    when ``budget`` is exceeded under its relation, or when the plan has no
    bound under it (e.g. a ``neighbours="values"`` mean beside an add/remove
    count under an add/remove budget).
    ``events_per_user`` declares how many events a user may have in the input
    of event-level transforms, for the user-level total (group privacy);
    without it, the largest per-user cap of the user-level transforms
    (``max_contributions``, a mean's ``max_samples_per_user``) is taken.
    A plan whose user-level total stays unbounded is refused with a budget
    (``ValueError`` naming the transforms and ``events_per_user``) and
    warned about without one (:class:`UnboundedUserLevelWarning`).
    """
    entries = plan_entries(pcolls)
    if budget is None:
        reports = compose(entries, events_per_user=events_per_user)
        unbounded = [r for r in reports if r.unit == "user" and r.epsilon is None
                     and group_size(per_transform(entries).values(), events_per_user) is None]
        if unbounded:
            warnings.warn(f"{unbounded[0].note}: the plan states no user-level guarantee. "
                          "Declare events_per_user=N (the most events one user has) to bound "
                          "it", UnboundedUserLevelWarning, stacklevel=2)
        return reports
    return check_budget(entries, budget, events_per_user)


class UnboundedUserLevelWarning(UserWarning):
    """A plan mixes user-level and event-level transforms with no per-user event bound."""


def scale_entry(entry: LedgerEntry, k: int) -> LedgerEntry:
    """A ledger entry of a mechanism whose input went through a k-stable transformation."""
    eps, delta, rho = scale(entry.epsilon, entry.delta, entry.rho, k)
    return entry._replace(
        epsilon=eps, delta=delta, rho=rho, group=entry.group * k,
        neighbours=f"{entry.neighbours}; input {k}-stable (one record changes up to {k})")


class Stability(beam.PTransform):
    """Re-states a transform's charges when its input went through a k-stable transformation.

    ``docs/privacy/accounting.md`` AC-6: if one record of the protected data can change up to ``k``
    records of the transform's input (a tweet split into k words, a trip into
    k legs), an ε-DP mechanism on that input is kε-DP for the original records
    (δ becomes ``k·e^{(k−1)ε}·δ``, ρ becomes ``k²ρ``). Apply it to the
    ``.accounting`` output; the plan attached to it is scaled the same way.

    >>> import dp_beam as dpb
    >>> dpb.Stability(3).k
    3
    """

    def __init__(self, k: int, label: Optional[str] = None) -> None:
        super().__init__(label)
        scale(0.0, 0.0, 0.0, k)  # validates k, naming it
        self.k = k

    def expand(self, accounting):
        entries = plan_entries(accounting)
        out = accounting | "Scale" >> beam.Map(scale_entry, self.k)
        setattr(out, PLAN_ATTRIBUTE, tuple(scale_entry(e, self.k) for e in entries))
        return out


class _ComposeLedger(beam.CombineFn):

    def __init__(self, budget, events_per_user=None):
        self._budget = budget
        self._events_per_user = events_per_user

    def create_accumulator(self):
        return set()

    def add_input(self, acc, entry):
        acc.add(entry)
        return acc

    def merge_accumulators(self, accs):
        out = set()
        for a in accs:
            out |= a
        return out

    def extract_output(self, acc):
        entries = sorted(acc, key=lambda e: (e.transform, repr(e.key)))
        return compose(entries, self._budget, self._events_per_user)


class CombineAccounting(beam.PTransform):
    """Merges the ``.accounting`` outputs of transforms into reports per privacy unit.

    Composition (``docs/privacy/accounting.md`` AC-2 to AC-5): sequential
    across transforms, parallel across the keys of one transform, and an
    event-level total that counts user-level charges too; each report names
    the neighbour relation of its total (``relation``), and the budget is
    checked under its own relation (``Budget(relation=...)``). The planned
    reports are available as ``.planned`` after application, or from
    :func:`plan`.

    The budget applies to every privacy unit of the plan. A plan with
    user-level and event-level transforms counts the event-level ones by
    group privacy over ``events_per_user`` events per user (default: the
    largest per-user cap of the user-level transforms, ``max_contributions``
    or a mean's ``max_samples_per_user``); a plan where neither bounds it is
    refused at construction (``ValueError`` naming the transforms and
    ``events_per_user``) instead of running with an unbounded user-level total.

    >>> import dp_beam as dpb
    >>> dpb.CombineAccounting(dpb.Budget(epsilon=1.0)).budget
    Budget(epsilon=1.0, delta=0.0)
    """

    def __init__(self, budget: Budget, events_per_user: Optional[int] = None,
                 label: Optional[str] = None) -> None:
        super().__init__(label)
        if not isinstance(budget, Budget):
            raise ValueError(f"budget must be a dp_beam.Budget, got {budget!r}")
        if events_per_user is not None and (isinstance(events_per_user, bool) or not isinstance(
                events_per_user, int) or events_per_user < 1):
            raise ValueError(f"events_per_user must be an integer >= 1, got {events_per_user!r}")
        self.budget = budget
        self.events_per_user = events_per_user
        self.planned = None

    def plan(self, pcolls: _PCollections) -> List[AccountingReport]:
        return plan(pcolls, self.budget, self.events_per_user)

    def expand(self, pcolls):
        self.planned = self.plan(pcolls)
        inputs = _inputs(pcolls)
        return (tuple(inputs)
                | "Flatten" >> beam.Flatten()
                | "Global" >> beam.WindowInto(
                    GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                | "Compose" >> beam.CombineGlobally(
                    _ComposeLedger(self.budget, self.events_per_user)).without_defaults()
                | "PerUnit" >> beam.FlatMap(lambda reports: reports))
