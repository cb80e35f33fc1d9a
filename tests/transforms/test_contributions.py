"""Per-user contribution bounding (dp_beam.transforms.contributions)."""

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.utils.timestamp import Timestamp

from dp_beam.transforms.contributions import BoundContributions, CountCapped
from dp_beam.transforms.events import CAPPED
from tests.beam_util import batch_options, collect
from tests.fake_state import Cell

STEP_MICROS = 10_000_000


def _run(dofn, events):
    """Feeds ``(user, (key, value), seconds)`` events to one DoFn with per-user cells."""
    cells = {}
    kept, capped, units = [], [], []
    for user, kv, seconds in events:
        count, keys = cells.setdefault(user, (Cell(), Cell()))
        for out in dofn.process((user, kv), Timestamp.of(seconds), count, keys):
            if isinstance(out, pvalue.TaggedOutput) and out.tag == CAPPED:
                capped.append(out.value.value)
            elif isinstance(out, pvalue.TaggedOutput):
                units.append(out.value)
            else:
                kept.append(out)
    return kept, capped, units


def test_a_user_keeps_at_most_max_contributions_events_over_all_keys():
    dofn = BoundContributions("t", max_contributions=2, step_micros=STEP_MICROS)
    events = [("u", ("a", 1.0), 1.0), ("u", ("b", 2.0), 2.0), ("u", ("a", 3.0), 12.0),
              ("v", ("a", 4.0), 3.0)]
    kept, capped, units = _run(dofn, events)
    assert kept == [("a", 1.0), ("b", 2.0), ("a", 4.0)] and units == []
    ((reason, user, step, by_key, key), (ts, example)), = capped
    assert (reason, user, step, by_key, key) == (
        "max_contributions (2) exceeded for user", "u", 1, False, None)
    assert ts == 12.0 and example == {"key": "a", "value": 3.0}


def test_max_keys_keeps_a_users_first_keys_and_signals_each_first_contribution():
    dofn = BoundContributions("t", max_contributions=10, max_keys=1, step_micros=STEP_MICROS)
    kept, capped, units = _run(dofn, [("u", ("a", 1.0), 1.0), ("u", ("b", 2.0), 2.0),
                                      ("u", ("a", 3.0), 3.0)])
    assert kept == [("a", 1.0), ("a", 3.0)] and units == [("a", 1.0)]
    ((reason, _, _, by_key, key), _), = capped
    assert reason == "max_keys_per_unit (1) exceeded for user" and (by_key, key) == (True, "b")


def test_count_capped_gives_one_dead_letter_per_reason_user_and_step():
    dofn = BoundContributions("t", max_contributions=1, step_micros=STEP_MICROS)
    _, capped, _ = _run(dofn, [("u", ("a", 1.0), 1.0), ("u", ("a", 2.0), 2.0),
                               ("u", ("a", 3.0), 3.0), ("u", ("a", 4.0), 14.0)])
    out = collect(batch_options(), lambda p: {"invalid": (
        p | beam.Create(capped)
        | beam.Map(lambda kv: beam.window.TimestampedValue(kv, kv[1][0]))
        | CountCapped("t", 10.0))})["invalid"]
    assert sorted((r.count, r.reason) for r in out) == [
        (1, "max_contributions (1) exceeded for user"),
        (2, "max_contributions (1) exceeded for user")]
