"""``CombineAccounting``: one privacy report for all transforms of a pipeline.

At construction it composes the plans the transforms attached to their
``.accounting`` outputs and raises ``ValueError`` when the plan exceeds the
budget, before anything runs. At run time it merges the ledger entries the
streams actually charged into a report per privacy unit, re-emitted
(accumulating) whenever a new stream starts, so a streaming pipeline's report
follows its activity; the last report of a batch run is the final one.
"""

import apache_beam as beam
from apache_beam.transforms import trigger
from apache_beam.transforms.window import GlobalWindows

from dp_beam.accounting import Budget, check_budget, compose
from dp_beam.transforms.continual import PLAN_ATTRIBUTE


def _inputs(pcolls):
    if isinstance(pcolls, beam.PCollection):
        return [pcolls]
    if isinstance(pcolls, dict):
        return list(pcolls.values())
    if isinstance(pcolls, (list, tuple)):
        return list(pcolls)
    raise ValueError("CombineAccounting takes a PCollection, a tuple/list or a dict of "
                     f"the .accounting outputs of dp_beam transforms, got {type(pcolls)!r}")


def plan_entries(pcolls):
    """The planned ledger entries attached to ``.accounting`` outputs."""
    entries = []
    for pc in _inputs(pcolls):
        plan = getattr(pc, PLAN_ATTRIBUTE, None)
        if plan is None:
            raise ValueError(f"{pc} carries no privacy plan: pass the .accounting output of a "
                             "dp_beam transform itself, not a derived PCollection")
        entries.extend(plan)
    return entries


def plan(pcolls, budget=None):
    """The per-unit report of the planned costs, computed without running anything.

    Raises ``ValueError`` naming the transforms when ``budget`` is exceeded.
    """
    entries = plan_entries(pcolls)
    if budget is None:
        return compose(entries)
    return check_budget(entries, budget)


class _ComposeLedger(beam.CombineFn):

    def __init__(self, budget):
        self._budget = budget

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
        return compose(entries, self._budget)


class CombineAccounting(beam.PTransform):
    """Merges the ``.accounting`` outputs of transforms into reports per privacy unit.

    Composition (spec withhold_release_and_composition.md §4): sequential
    across transforms, parallel across the keys of one transform, and an
    event-level total that counts user-level charges too. The planned report
    is available as ``.planned`` after application, or from :func:`plan`.

    >>> import dp_beam as dpb
    >>> dpb.CombineAccounting(dpb.Budget(epsilon=1.0)).budget
    Budget(epsilon=1.0, delta=0.0)
    """

    def __init__(self, budget, label=None):
        super().__init__(label)
        if not isinstance(budget, Budget):
            raise ValueError(f"budget must be a dp_beam.Budget, got {budget!r}")
        self.budget = budget
        self.planned = None

    def plan(self, pcolls):
        return plan(pcolls, self.budget)

    def expand(self, pcolls):
        self.planned = self.plan(pcolls)
        inputs = _inputs(pcolls)
        return (tuple(inputs)
                | "Flatten" >> beam.Flatten()
                | "Global" >> beam.WindowInto(
                    GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                | "Compose" >> beam.CombineGlobally(_ComposeLedger(self.budget)).without_defaults()
                | "PerUnit" >> beam.FlatMap(lambda reports: reports))
