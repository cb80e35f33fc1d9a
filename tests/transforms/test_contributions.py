"""Per-user contribution bounding (dp_beam.transforms.contributions)."""

import apache_beam as beam
import pytest
from apache_beam import pvalue

from dp_beam.transforms.contributions import BoundContributions, CountCapped
from dp_beam.transforms.events import CAPPED
from tests.beam_util import batch_options, collect, windowed_at
from tests.fake_state import Cell

STEP_MICROS = 10_000_000


def _split(outs, over_tag):
    """(main outputs, values on ``over_tag``, values on ``units``)."""
    kept, over, units = [], [], []
    for out in outs:
        if isinstance(out, pvalue.TaggedOutput) and out.tag == over_tag:
            over.append(out.value)
        elif isinstance(out, pvalue.TaggedOutput):
            units.append(out.value)
        else:
            kept.append(out)
    return kept, over, units


def _run(dofn, events):
    """Feeds ``(user, (key, value), seconds)`` events to one DoFn with per-user cells."""
    cells, outs = {}, []
    for user, kv, seconds in events:
        count, keys = cells.setdefault(user, (Cell(), Cell()))
        outs += list(dofn.process((user, kv), windowed_at(seconds), count, keys))
    kept, capped, units = _split(outs, CAPPED)
    return kept, [tv.value for tv in capped], units


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


def _batch_run(dofn, users):
    """Feeds ``{user: [lists of (key, value, seconds)]}`` to the bounded stage, one element per
    user; returns (kept as (key, value, seconds), dead letters, units)."""
    from dp_beam.transforms.events import INVALID
    dofn.start_bundle()
    outs = []
    for user, lists in users.items():
        grouped = [[(k, v, int(s * 1_000_000)) for k, v, s in part] for part in lists]
        outs += list(dofn.process((user, grouped)))
    outs += list(dofn.finish_bundle())
    return _split(outs, INVALID)


def test_the_bounded_stage_keeps_a_users_earliest_events_whatever_the_grouping_order():
    from dp_beam.transforms.contributions import BoundContributionsBatch, capped_records
    # Events out of time order, in two lists; two ties in time (ordered by key, then value).
    lists = [[("b", 2.0, 12.0), ("a", 3.0, 1.0), ("c", 1.0, 30.0)],
             [("a", 1.0, 12.0), ("b", 5.0, 40.0), ("a", 0.5, 12.0)]]
    dofn = BoundContributionsBatch("t", max_contributions=3, max_keys=2, step_micros=STEP_MICROS)
    kept, dead, units = _batch_run(dofn, {"u": lists})
    assert [(wv.value, wv.timestamp.micros / 1e6) for wv in kept] == [
        (("a", 3.0), 1.0), (("a", 0.5), 12.0), (("a", 1.0), 12.0)]
    assert units == [("a", 1.0)]
    # The same events in time order through the streaming stage: the same kept events and
    # capped events, whose records CountCapped would make.
    stream = BoundContributions("t", max_contributions=3, max_keys=2, step_micros=STEP_MICROS)
    ordered = sorted((e for part in lists for e in part), key=lambda e: (e[2], e[0], e[1]))
    s_kept, s_capped, s_units = _run(stream, [("u", (k, v), s) for k, v, s in ordered])
    assert [wv.value for wv in kept] == s_kept and units == s_units
    outputs = [pvalue.TaggedOutput(CAPPED, beam.window.TimestampedValue(c, c[1][0]))
               for c in s_capped]
    assert dead == capped_records("t", outputs)
    assert sorted((r.reason, r.element["step"], r.count) for r in dead) == [
        ("max_contributions (3) exceeded for user", 1, 1),
        ("max_contributions (3) exceeded for user", 3, 1),
        ("max_contributions (3) exceeded for user", 4, 1)]
    # Reversed lists and reversed events within them: the same outputs.
    again = _batch_run(BoundContributionsBatch("t", max_contributions=3, max_keys=2,
                                               step_micros=STEP_MICROS),
                       {"u": [list(reversed(part)) for part in reversed(lists)]})
    assert [wv.value for wv in again[0]] == [wv.value for wv in kept] and again[1:] == (dead, units)


def test_the_bounded_stage_caps_keys_and_gathers_kept_events_per_bundle_by_shard():
    from dp_beam.transforms.continual import _CountSteps
    from dp_beam.transforms.contributions import BoundContributionsBatch
    dofn = BoundContributionsBatch("t", max_contributions=10, max_keys=1, step_micros=STEP_MICROS,
                                   combine_fn=_CountSteps(), shards=1)
    kept, dead, units = _batch_run(dofn, {"u": [[("a", 1.0, 1.0), ("b", 1.0, 2.0),
                                                 ("a", 1.0, 3.0)]],
                                          "v": [[("b", 1.0, 15.0)]]})
    assert units == [("a", 1.0), ("b", 15.0)]
    ((reason, count, element),) = [(r.reason, r.count, r.element) for r in dead]
    assert reason == "max_keys_per_unit (1) exceeded for user" and count == 1
    assert element == {"user": "u", "step": 0, "key": "b", "example": {"key": "b", "value": 1.0}}
    # One element for the bundle's one shard: the kept events' totals per (key, step).
    ((shard, totals),) = [wv.value for wv in kept]
    assert shard == 0 and sorted(totals) == [("a", 0, 2), ("b", 1, 1)]


@pytest.mark.parametrize("lifted", [False, True])
def test_the_bounded_stage_keeps_every_event_of_a_user_within_the_cap(lifted, monkeypatch):
    """A user with at most ``max_contributions`` events keeps them all; the stage then skips
    the sort (planted: it must not be called), and what it keeps is what the sorting path
    keeps with a cap one larger, up to the order of the kept elements."""
    from dp_beam.transforms import contributions
    from dp_beam.transforms.continual import _CountSteps
    lists = [[("b", 2.0, 12.0), ("a", 3.0, 1.0)], [("a", 1.0, 12.0), ("c", 5.0, 40.0)]]

    def stage(cap):
        extra = dict(combine_fn=_CountSteps(), shards=2) if lifted else {}
        return contributions.BoundContributionsBatch("t", max_contributions=cap,
                                                     step_micros=STEP_MICROS, **extra)

    def values(kept):
        if lifted:
            return sorted(t for wv in kept for t in wv.value[1])
        return sorted((wv.value, wv.timestamp.micros) for wv in kept)

    sorting = _batch_run(stage(5), {"u": lists})
    monkeypatch.setattr(contributions, "sorted", lambda *a, **k: pytest.fail("sorted"),
                        raising=False)
    kept, dead, units = _batch_run(stage(4), {"u": lists})
    assert dead == [] and units == [] and values(kept) == values(sorting[0])
    if lifted:
        assert values(kept) == [("a", 0, 1), ("a", 1, 1), ("b", 1, 1), ("c", 4, 1)]
    else:
        assert len(kept) == 4
    # One event over the cap takes the sorting path: the latest event is refused.
    monkeypatch.undo()
    kept, dead, _ = _batch_run(stage(3), {"u": lists})
    assert [r.reason for r in dead] == ["max_contributions (3) exceeded for user"]
    assert dead[0].element["example"]["key"] == "c"


def test_batch_validation_gathers_a_bundles_events_per_user(monkeypatch):
    from dp_beam.transforms import contributions
    from dp_beam.transforms.events import INVALID
    monkeypatch.setattr(contributions, "MAX_BUNDLE_EVENTS", 3)
    dofn = contributions.PrepareUserEventsBatch(
        "t", key_fn=lambda e: e["k"], user_fn=lambda e: e["u"], timestamp_fn=lambda e: e["ts"])
    dofn.start_bundle()
    events = [{"k": "a", "u": "x", "ts": 5.0}, {"k": "b", "u": "y", "ts": 2.5},
              {"k": "a", "u": None, "ts": 1.0}, {"k": "b", "u": "x", "ts": 7.0},
              {"k": "a", "u": "y", "ts": 9.0}]
    outs = [list(dofn.process(e, windowed=windowed_at())) for e in events]
    # The event without a user leaves at once; the third valid event sends the table on.
    assert outs[0] == outs[1] == outs[4] == [] and outs[2][0].tag == INVALID
    assert sorted(wv.value for wv in outs[3]) == [
        ("x", [("a", 1.0, 5_000_000), ("b", 1.0, 7_000_000)]), ("y", [("b", 1.0, 2_500_000)])]
    assert {wv.timestamp.micros for wv in outs[3]} == {2_500_000}
    (last,) = dofn.finish_bundle()
    assert last.value == ("y", [("a", 1.0, 9_000_000)]) and last.timestamp.micros == 9_000_000
    assert list(dofn.finish_bundle()) == []
