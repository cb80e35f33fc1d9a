"""The two mixed-relation plans of the audit, built from the real transforms.

A `values` mean publishes who is present, so beside a count that protects
adding or removing a user it leaves no add/remove bound; an ERM stream's block
times publish the event count, so beside an add/remove count it leaves none
either, and under replace-one the count costs twice. The accountant must refuse
such plans under an add/remove budget (naming the transform) and convert them
under the relation that does hold. tests/accounting/test_compose.py checks the
same rules on hand-made ledger entries.
"""

import apache_beam as beam
import pytest

import dp_beam as dpb
from tests.beam_util import batch_options

SCHEDULE = dict(step=10, start=0, end=100, timestamp_fn=lambda e: e["ts"])


def _plans():
    p = beam.Pipeline(options=batch_options())
    events = p | beam.Create([{"ts": 1.0, "u": "a", "v": 0.5, "x": [0.1, 0.2], "y": 1}])
    values_mean = events | "mean" >> dpb.ContinualMean(
        user_fn=lambda e: e["u"], value_fn=lambda e: e["v"], lower=0, upper=1,
        max_samples_per_user=4, epsilon=0.5, neighbours="values", **SCHEDULE)
    user_count = events | "users" >> dpb.ContinualCount(
        epsilon=0.5, privacy_unit="user", user_fn=lambda e: e["u"], max_contributions=3,
        **SCHEDULE)
    erm = events | "erm" >> dpb.ContinualERM(
        features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1), n_features=2,
        feature_bound=1.0, lam=0.1, epsilon=0.5, block_size=2, base_size=4, **SCHEDULE)
    event_count = events | "count" >> dpb.ContinualCount(epsilon=0.5, **SCHEDULE)
    return ((values_mean.accounting, user_count.accounting),
            (erm.accounting, event_count.accounting))


def test_values_mean_beside_a_user_count_is_refused_then_converted():
    mixed, _ = _plans()
    with pytest.raises(ValueError) as err:
        dpb.CombineAccounting(dpb.Budget(epsilon=1.0)).plan(mixed)
    assert "'mean'" in str(err.value) and 'neighbours="participation"' in str(err.value)
    reports = dpb.plan(mixed, dpb.Budget(epsilon=1.5, relation="values"))
    totals = {(r.unit, r.relation): r.epsilon for r in reports}
    assert totals[("user", "add/remove")] is None
    assert totals[("user", "values")] == pytest.approx(0.5 + 2 * 0.5)


def test_erm_beside_an_event_count_is_refused_then_converted():
    _, mixed = _plans()
    with pytest.raises(ValueError) as err:
        dpb.CombineAccounting(dpb.Budget(epsilon=5.0)).plan(mixed)
    assert "'erm'" in str(err.value) and 'relation="replace"' in str(err.value)
    with pytest.raises(ValueError, match="budget exceeded"):
        dpb.plan(mixed, dpb.Budget(epsilon=1.0, relation="replace"))
    reports = dpb.plan(mixed, dpb.Budget(epsilon=1.5, relation="replace"))
    totals = {(r.unit, r.relation): r.epsilon for r in reports}
    assert totals[("event", "add/remove")] is None
    assert totals[("event", "replace")] == pytest.approx(0.5 + 2 * 0.5)
