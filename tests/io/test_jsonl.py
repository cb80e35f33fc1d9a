"""JSON-lines sinks in batch and streaming."""

import glob
import json
import os

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.records import InvalidElement, Release, to_json
from tests.beam_util import batch_options, streaming_options


def test_to_json_keeps_unserialisable_dead_letters():
    rec = InvalidElement("t", "value is NaN", {"x": float("nan"), "o": object()})
    line = dpb.io.dumps(rec)
    back = json.loads(line)
    assert back["record"] == "InvalidElement" and back["element"]["x"] == "nan"


def test_batch_writes_one_file_at_the_path(tmp_path):
    path = str(tmp_path / "releases.jsonl")
    recs = [Release("k", s, s * 10.0, s * 10.0 + 10, float(s), 1.0, 2.0, "tree", "t", s + 1)
            for s in range(5)]
    with beam.Pipeline(options=batch_options()) as p:
        _ = p | beam.Create(recs) | dpb.io.WriteReleases(path)
    lines = [json.loads(l) for l in open(path)]
    assert sorted(l["step"] for l in lines) == list(range(5))
    assert lines[0] == to_json(next(r for r in recs if r.step == lines[0]["step"]))


def test_streaming_writes_every_record_including_late_ones(tmp_path):
    path = str(tmp_path / "ledger.jsonl")
    stream = (_TestStream()
              .add_elements([TimestampedValue(Release(None, s, 0, 1, 1.0, 1.0, 1.0, "tree"), s)
                             for s in (1.0, 2.0)])
              .advance_watermark_to(4000)
              .add_elements([TimestampedValue(Release(None, 3, 0, 1, 1.0, 1.0, 1.0, "tree"),
                                              3700.0)])
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        _ = p | stream | dpb.io.WriteLedger(path)
    files = sorted(glob.glob(os.path.join(str(tmp_path), "ledger-*.jsonl")))
    assert files
    # Step 3's record is behind the watermark (late) when it arrives: still written.
    steps = sorted(json.loads(l)["step"] for f in files for l in open(f))
    assert steps == [1, 2, 3]
