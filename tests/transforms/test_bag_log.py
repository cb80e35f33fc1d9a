"""The per-key append-only log (bag_log.py) on in-memory stand-ins for its ``BagState`` and
meta cell: lazy reads, compaction, the release bound, meta writes."""

import pytest

from dp_beam.transforms.bag_log import BagLog
from tests.fake_state import Bag, Cell, Counter


def test_bag_log_reads_pending_entries_without_reading_the_bag():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2, 3):
        log.append(i, f"b{i}")
    assert log.read(0, 3) == ["b1", "b2", "b3"]
    assert bag.reads == 0 and log.bag_reads == 0
    log.flush()
    assert bag.items == [(1, "b1"), (2, "b2"), (3, "b3")]
    assert log.stored == 3
    assert meta.value == (3, 1, None)


def test_bag_log_reads_older_entries_once_per_firing_and_counts_them():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2, 3):
        log.append(i, i * 10)
    log.flush()
    reads = Counter()
    log = BagLog(bag, meta, reads=reads)
    log.append(4, 40)
    assert log.read(1, 4) == [20, 30, 40]
    assert log.read(0, 2) == [10, 20]
    assert bag.reads == 1 and log.bag_reads == 1
    assert reads.n == 3


def test_bag_log_compacts_once_released_entries_reach_the_live_ones():
    bag, meta = Bag(), Cell()
    compactions = Counter()
    log = BagLog(bag, meta, compactions=compactions)
    for i in range(1, 5):
        log.append(i, i)
    log.flush()
    # Releasing 1 of 4 leaves 1 released < 3 live: nothing is rewritten.
    log = BagLog(bag, meta, compactions=compactions)
    log.release_before(2)
    log.append(5, 5)
    log.flush()
    assert [i for i, _ in bag.items] == [1, 2, 3, 4, 5]
    assert bag.clears == 0 and compactions.n == 0
    # Released 1..3 (3) >= live 4..6 (3): the bag is rewritten with the live entries only.
    log = BagLog(bag, meta, compactions=compactions)
    log.release_before(4)
    log.append(6, 6)
    log.flush()
    assert bag.items == [(4, 4), (5, 5), (6, 6)]
    assert bag.clears == 1 and compactions.n == 1
    assert meta.value == (3, 4, 4)


def test_bag_log_clears_without_reading_when_everything_is_released():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2):
        log.append(i, i)
    log.flush()
    log = BagLog(bag, meta)
    log.release_before(3)
    log.flush()
    assert bag.items == [] and bag.reads == 0 and bag.clears == 1
    assert log.stored == 0


def test_bag_log_refuses_released_entries_and_keeps_the_release_bound_monotone():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in range(1, 5):
        log.append(i, i)
    log.release_before(3)
    log.release_before(2)  # a lower bound never lowers it
    log.flush()
    assert meta.value[2] == 3
    log = BagLog(bag, meta)
    with pytest.raises(KeyError, match="log entry 1"):
        log.read(0, 1)
    assert log.read(2, 4) == [3, 4]


def test_bag_log_writes_meta_only_when_it_changes():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    log.append(1, "x")
    log.flush()
    assert meta.writes == 1
    BagLog(bag, meta).flush()  # a firing that appends and releases nothing
    assert meta.writes == 1
