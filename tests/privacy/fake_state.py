"""Stand-ins for Beam's state cells and timer, to drive a release DoFn as a runner would.

A runner commits a firing's state writes only when its bundle succeeds; tests
copy these objects to model a committed state and a discarded attempt.
"""


class Cell:
    """A ``ReadModifyWriteState``."""

    def __init__(self):
        self.value = None

    def read(self):
        return self.value

    def write(self, value):
        self.value = value

    def clear(self):
        self.value = None


class Bag:
    """A ``BagState``."""

    def __init__(self):
        self.items = []

    def read(self):
        return list(self.items)

    def add(self, item):
        self.items.append(item)

    def clear(self):
        self.items = []


class Timer:
    """A timer: remembers where it was last set."""

    def __init__(self):
        self.at = None

    def set(self, ts):
        self.at = ts
