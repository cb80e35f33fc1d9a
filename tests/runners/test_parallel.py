"""The sharded ContinualCount, ContinualMean and ContinualERM give the same releases, bit for
bit, on 1 and on 2 SDK workers, with the in-process runner's multi_processing mode and on the
portable path (local job service + external worker pool), and with 2 workers both workers
release. The releases depend on the noise key and the data only: not on which worker, process
or thread drew a stream's noise, broke its ties or solved its models.

Beam's stock job service always runs one worker per environment, so the portable
case uses the job service of benchmarks/parallel.py, whose jobs honour
``--direct_num_workers``. Each release is written with the pid of the process that
released it (workers are other processes, so results travel through files).
"""

import collections
import json
import os
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import dp_beam as dpb
from tests.servers import free_port, server

pytestmark = pytest.mark.slow

HOUR = 3600.0
KEYS = [f"k{k}" for k in range(200)]    # 3 shards of the default 64 keys each
STEPS = 6
# (key, time, value, slot): a key's three events of a step share their time, so the ERM release
# orders them by their keyed tie-breakers, and ERM's blocks of 4 points cut some of these groups:
# which of their points go to which model depends on that order. The mean has one user per key,
# and its cap of 4 samples cuts the second step's group: which of those events it keeps depends
# on the per-user stage's order of ties (the 4th sample completes a level, so it is released).
EVENTS = [(key, s * HOUR + 60.0, float(j + s % 3), j) for key in KEYS for s in range(STEPS)
          for j in range(3)]
NOISE_KEY = dpb.NoiseKey.from_bytes(bytes(range(32)))
JOB_SERVICE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmarks", "parallel.py")


def _key(e):
    return e[0]


def _stamp(e):
    return beam.window.TimestampedValue(e, e[1])


def _user(e):
    return e[0]


def _value(e):
    return e[2]


def _features(e):
    return [e[2] / 4.0, e[3] / 2.0]


def _label(e):
    return int(e[2]) % 2


def _tagged(transform, release):
    # repr gives every float's shortest round-trip digits: equal rows are equal bits.
    return json.dumps([transform, repr(release), os.getpid()])


def run(options, path):
    """(sorted (transform, release repr) rows, set of pids that released)."""
    common = dict(epsilon=1.0, step=HOUR, start=0, end=STEPS * HOUR, key_fn=_key, keys=KEYS,
                  noise_key=NOISE_KEY)
    with beam.Pipeline(options=options) as p:
        events = p | beam.Create(EVENTS, reshuffle=False) | beam.Map(_stamp)
        outputs = {
            "count": events | "Count" >> dpb.ContinualCount(**common),
            "mean": events | "Mean" >> dpb.ContinualMean(
                user_fn=_user, value_fn=_value, lower=0.0, upper=4.0, max_users=1,
                max_samples_per_user=4, **common),
            "erm": events | "ERM" >> dpb.ContinualERM(
                features_fn=_features, label_fn=_label, classes=(0, 1), n_features=2,
                feature_bound=1.0, lam=0.1, block_size=4, base_size=8, **common),
        }
        tagged = [out.releases | f"Tag {name}" >> beam.Map(lambda r, name=name: _tagged(name, r))
                  for name, out in outputs.items()]
        _ = tagged | beam.Flatten() | beam.io.WriteToText(path, shard_name_template="")
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return sorted((t, r) for t, r, _ in rows), {pid for *_, pid in rows}


def multi_processing(workers):
    return PipelineOptions(flags=["--direct_num_workers", str(workers),
                                  "--direct_running_mode", "multi_processing"],
                           runner="FnApiRunner")


@pytest.fixture(scope="module")
def portable_endpoints(tmp_path_factory):
    logs = tmp_path_factory.mktemp("parallel")
    job_port, pool_port = free_port(), free_port()
    job = [sys.executable, JOB_SERVICE, "--serve-jobs", str(job_port)]
    pool = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
            f"--service_port={pool_port}"]
    with server(job, job_port, logs / "job_service.log", timeout=60.0), \
            server(pool, pool_port, logs / "worker_pool.log"):
        yield f"localhost:{job_port}", f"localhost:{pool_port}"


@pytest.mark.timeout(300)
def test_one_and_two_workers_release_the_same(portable_endpoints, tmp_path):
    job, pool = portable_endpoints
    portable = PipelineOptions(flags=["--direct_num_workers", "2"], runner="PortableRunner",
                               job_endpoint=job, environment_type="EXTERNAL",
                               environment_config=pool)
    one, one_pids = run(multi_processing(1), str(tmp_path / "mp1"))
    two, two_pids = run(multi_processing(2), str(tmp_path / "mp2"))
    ported, ported_pids = run(portable, str(tmp_path / "portable2"))
    assert one == two == ported
    # Every key releases every step, once, and three models from its 18 points: the base model
    # of the first 8 (base_size), then one for each further block of 4.
    counts = collections.Counter(t for t, _ in one)
    assert counts == {"count": len(KEYS) * STEPS, "mean": len(KEYS) * STEPS, "erm": len(KEYS) * 3}
    # The shards are split between the workers: with 2 workers both release.
    assert len(one_pids) == 1
    assert len(two_pids) == 2 and len(ported_pids) == 2
    assert os.getpid() not in one_pids | two_pids
