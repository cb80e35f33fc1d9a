"""Stand-ins for Beam's state cells, timer and metrics counter, to drive a release DoFn as a
runner would.

A runner commits a firing's state writes only when its bundle succeeds; tests
copy these objects to model a committed state and a discarded attempt. Each
stand-in also counts what a test may want to bound (writes, reads, clears).
"""


class Cell:
    """A ``ReadModifyWriteState`` that counts its writes."""

    def __init__(self, value=None):
        self.value = value
        self.writes = 0

    def read(self):
        return self.value

    def write(self, value):
        self.value = value
        self.writes += 1

    def clear(self):
        self.value = None


class Bag:
    """A ``BagState`` that counts its reads and clears."""

    def __init__(self):
        self.items = []
        self.reads = 0
        self.clears = 0

    def read(self):
        self.reads += 1
        return list(self.items)

    def add(self, item):
        self.items.append(item)

    def clear(self):
        self.items = []
        self.clears += 1


class Timer:
    """A timer: remembers where it was last set (``at``) and every setting (``set_at``)."""

    def __init__(self):
        self.at = None
        self.set_at = []

    def set(self, ts):
        self.at = ts
        self.set_at.append(float(ts))


class Counter:
    """A Beam metrics counter."""

    def __init__(self):
        self.n = 0

    def inc(self, n=1):
        self.n += n
