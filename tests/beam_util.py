"""Helpers for pipeline tests: pinned runners and in-process output collection."""

import collections
import itertools
import types

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

# Module-level so that DoFns pickled by reference append to the same lists; the
# runners used in tests execute in this process.
_SINKS = collections.defaultdict(list)
_IDS = itertools.count()


def windowed_at(seconds=None):
    """What a DoFn's ``WindowedValueParam`` holds for an element at ``seconds``, for driving a
    validating DoFn directly (``None``: no Beam timestamp, for stages that read the event
    time with ``timestamp_fn``)."""
    if seconds is None:
        return types.SimpleNamespace(timestamp_micros=None)
    return WindowedValue(None, Timestamp.of(seconds), (GlobalWindow(),))


def batch_options():
    return PipelineOptions(flags=[], runner="FnApiRunner")


def streaming_options():
    opts = PipelineOptions(flags=[], runner="BundleBasedDirectRunner")
    opts.view_as(StandardOptions).streaming = True
    return opts


def _append(element, name):
    _SINKS[name].append(element)


class Collector:
    """``pcoll | collector.sink("releases")`` then ``collector["releases"]`` after the run."""

    def __init__(self):
        self._prefix = f"c{next(_IDS)}"

    def sink(self, name):
        key = f"{self._prefix}/{name}"
        _SINKS[key] = []
        return f"Collect {name}" >> beam.Map(_append, key)

    def __getitem__(self, name):
        return list(_SINKS[f"{self._prefix}/{name}"])


def collect(pipeline_options, build):
    """Runs ``build(p) -> {name: pcoll}`` and returns ``{name: [elements]}``."""
    c = Collector()
    with beam.Pipeline(options=pipeline_options) as p:
        names = []
        for name, pc in build(p).items():
            _ = pc | c.sink(name)
            names.append(name)
    return {name: c[name] for name in names}


def global_and_windowed(events, timestamp, window, make):
    """The records of ``make()`` over ``events`` (stamped by ``timestamp(event)``) in the global
    window and in fixed windows of ``window`` seconds, each as ``(sorted reprs of the releases,
    sorted reasons of the dead letters)``: a continual transform's schedule decides its steps,
    so the two must be equal."""
    def run(windowed):
        def build(p):
            pcoll = p | beam.Create(events) | beam.Map(
                lambda e: beam.window.TimestampedValue(e, timestamp(e)))
            if windowed:
                pcoll = pcoll | beam.WindowInto(beam.window.FixedWindows(window))
            res = pcoll | make()
            return {"releases": res.releases, "invalid": res.invalid}

        out = collect(batch_options(), build)
        return (sorted(repr(r) for r in out["releases"]),
                sorted(i.reason for i in out["invalid"]))

    return run(False), run(True)
