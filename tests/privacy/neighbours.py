"""Neighbouring inputs and the release structure they must share (the privacy-by-shape tests).

A neighbour is the base input with one record replaced (:func:`replaced`), added or removed;
:func:`release_structure` runs a transform on one input and returns what may not differ between
neighbours, and :func:`assert_same_structure` checks every neighbour of a table against the base.
"""

import apache_beam as beam
from apache_beam.testing import test_stream

from tests.beam_util import batch_options, collect

__all__ = ["replaced", "created", "event_stream", "release_structure", "assert_same_structure"]


def replaced(base, index, record):
    """``base`` with its record at ``index`` replaced by ``record`` (a replace-one neighbour)."""
    out = list(base)
    out[index] = record
    return out


def created(events=None, stream=None):
    """The input of a pipeline: ``stream`` (a ``TestStream``) if given, else ``events``."""
    return lambda p: p | (stream if stream is not None else beam.Create(events))


def event_stream(times, event):
    """A ``TestStream`` with ``event(ts)`` at each of ``times``, the watermark just past each."""
    stream = test_stream.TestStream().advance_watermark_to(0)
    for ts in times:
        stream = stream.add_elements([beam.window.TimestampedValue(event(ts), ts)])
        stream = stream.advance_watermark_to(ts + 1)
    return stream.advance_watermark_to_infinity()


def release_structure(make, source, shape, options=None):
    """``(shapes, ledger)`` of ``make()`` applied to ``source(p)``.

    ``shapes`` lists ``shape(release)`` per release and must hold no repeat: a release seen twice
    would hide a data-dependent one behind its copy. ``ledger`` is sorted by ``repr``.
    """
    def build(p):
        res = source(p) | make()
        return {"releases": res.releases, "ledger": res.accounting}
    out = collect(options or batch_options(), build)
    shapes = [shape(r) for r in out["releases"]]
    assert len(set(shapes)) == len(shapes), "a (key, step) was released twice"
    return shapes, sorted(out["ledger"], key=repr)


def assert_same_structure(structure, neighbours, expected):
    """Every input of ``neighbours`` (name → input) gives ``expected``, the base's
    ``(shape, ledger)``, under ``structure(input)``."""
    shape, ledger = expected
    for neighbour, inputs in neighbours.items():
        got_shape, got_ledger = structure(inputs)
        assert got_shape == shape, neighbour
        assert got_ledger == ledger, neighbour
