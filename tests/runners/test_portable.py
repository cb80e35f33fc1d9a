"""ContinualCount, ContinualSum, ContinualMean and ContinualERM on Beam's portable path (local job service +
external SDK worker pool, how Flink and Dataflow run Python) give exactly the
releases of the in-process FnApiRunner when the noise is fixed.

Each case writes JSON lines (workers are other processes, so results travel
through files); more transforms are added as entries of CASES.
"""

import json
import os
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from tests.servers import free_port, server

pytestmark = pytest.mark.slow

EVENTS = [{"ts": t, "k": "ab"[t % 2], "v": (t % 7) - 2.5} for t in range(0, 400, 3)]
STEP = 50
# The public schedule: steps 0..7 (the first step not released is 400 s = step 8).
START, END = 0, 400
STEPS = list(range(START // STEP, END // STEP))


def _ts(e):
    return e["ts"]


def _key(e):
    return e["k"]


def _value(e):
    return e["v"]


def _user(e):
    return f"u{e['ts'] % 17}"


def _features(e):
    return [e["v"] / 4.0, (e["ts"] % 10) / 10.0]


def _label(e):
    return int(e["v"] > 0)


# name -> transform factory; int seeds derive the noise per key and step, so
# two runners must agree exactly.
CASES = {
    "count_zero_noise": lambda: dpb.ContinualCount(
        epsilon=1.0, step=STEP, start=START, end=END, timestamp_fn=_ts,
        rng=dpb.mechanisms.ZeroNoise()),
    "count_keyed_seed": lambda: dpb.ContinualCount(
        epsilon=1.0, step=STEP, start=START, end=END, timestamp_fn=_ts, key_fn=_key,
        keys=["a", "b"], rng=11),
    "sum_seed": lambda: dpb.ContinualSum(
        value_fn=_value, lower=-2, upper=3, epsilon=1.0, step=STEP, start=START, end=END,
        timestamp_fn=_ts, rng=5),
    "mean_seed": lambda: dpb.ContinualMean(
        user_fn=_user, value_fn=_value, lower=-3, upper=4, max_samples_per_user=8,
        epsilon=1.0, step=STEP, start=START, end=END, timestamp_fn=_ts, neighbours="values",
        rng=13),
    "erm_seed": lambda: dpb.ContinualERM(
        features_fn=_features, label_fn=_label, classes=(0, 1), n_features=2,
        feature_bound=1.0, lam=0.1, epsilon=1.0, block_size=8, base_size=16, step=STEP,
        start=START, end=END, timestamp_fn=_ts, rng=17),
}


def run(options, out_dir):
    with beam.Pipeline(options=options) as p:
        events = p | beam.Create(EVENTS)
        for name, make in CASES.items():
            result = events | name >> make()
            (result.releases
             | f"{name} write" >> dpb.io.WriteReleases(os.path.join(out_dir, f"{name}.jsonl")))
    out = {}
    for name in CASES:
        with open(os.path.join(out_dir, f"{name}.jsonl")) as fh:
            recs = [json.loads(l) for l in fh if l.strip()]
        out[name] = sorted(recs, key=lambda r: (json.dumps(r["key"]), r["step"]))
    return out


@pytest.fixture(scope="module")
def portable_endpoints(tmp_path_factory):
    logs = tmp_path_factory.mktemp("portable")
    job_port, pool_port = free_port(), free_port()
    job = [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
           f"--port={job_port}"]
    pool = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
            f"--service_port={pool_port}"]
    with server(job, job_port, logs / "job_service.log"), \
            server(pool, pool_port, logs / "worker_pool.log"):
        yield f"localhost:{job_port}", f"localhost:{pool_port}"


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    return run(PipelineOptions(flags=[], runner="FnApiRunner"),
               str(tmp_path_factory.mktemp("fnapi")))


@pytest.fixture(scope="module")
def portable(portable_endpoints, tmp_path_factory):
    job, pool = portable_endpoints
    options = PipelineOptions(flags=[], runner="PortableRunner", job_endpoint=job,
                              environment_type="EXTERNAL", environment_config=pool)
    start = time.perf_counter()
    out = run(options, str(tmp_path_factory.mktemp("portable_out")))
    print(f"portable run: {time.perf_counter() - start:.1f} s")
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_portable_matches_in_process(case, portable, in_process):
    assert portable[case], "no releases from the portable run"
    assert portable[case] == in_process[case]
    # Every stream releases every step of the public schedule (once per step; ERM
    # releases a model per complete block, so several per step here), on both runners.
    per_key = {}
    for r in portable[case]:
        per_key.setdefault(json.dumps(r["key"]), []).append(r["step"])
    expected_keys = {'"a"', '"b"'} if case == "count_keyed_seed" else {"null"}
    assert set(per_key) == expected_keys
    for steps in per_key.values():
        assert sorted(set(steps)) == STEPS, per_key
        if not case.startswith("erm"):
            assert sorted(steps) == STEPS, per_key
