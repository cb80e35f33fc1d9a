#!/usr/bin/env bash
# Run pipelines/continual_count.py on a Flink cluster with Beam's FlinkRunner.
#
#   FLINK_MASTER=jobmanager:8081 STATE_DIR=hdfs:///dp-beam/state OUTPUT=/shared/out \
#     templates/flink/run_flink.sh
#
# FlinkRunner starts Beam's Flink job server (a jar it downloads once from
# Maven Central, matching --flink_version), which submits the job to
# FLINK_MASTER. Python user code runs in SDK workers: with
# --environment_type=EXTERNAL, start one worker pool per task manager first:
#   python -m apache_beam.runners.worker.worker_pool_main --service_port=50000
# (the same venv as this script, with `pip install '.[demo]'`, started from the
# repository root: the workers import the job's functions from pipelines/,
# which is not installed with the package); or use
# --environment_type=DOCKER --environment_config=apache/beam_python3.11_sdk:2.77.0
# with an image that also has this package installed (templates/Dockerfile).
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${FLINK_MASTER:?set FLINK_MASTER (host:port of the Flink REST endpoint)}"
: "${STATE_DIR:?set STATE_DIR (durable checkpoint storage, e.g. hdfs:// or s3://)}"
: "${OUTPUT:?set OUTPUT (an output folder every task manager can write)}"
WORKER_POOL="${WORKER_POOL:-localhost:50000}"
FLINK_VERSION="${FLINK_VERSION:-1.19}"
PYTHON="${PYTHON:-python}"

# Checkpointing settings: the tree's noise and running totals live in Beam
# state; exactly-once checkpoints restore them consistently with the input
# position, so a restarted task never redraws a stored noise value or
# double-counts an aggregate. RocksDB keeps large state off the heap and
# writes it to STATE_DIR; retained checkpoints let a cancelled job resume
# (--savepoint_path=...) instead of starting a fresh, separately charged run.
# --streaming: Flink checkpoints only in streaming mode (this bounded demo
# input runs there too; a Kafka or Pub/Sub source needs it anyway).
exec "${PYTHON}" -m pipelines.continual_count \
  --output="${OUTPUT}" \
  --epsilon=1.0 \
  --runner=FlinkRunner \
  --flink_master="${FLINK_MASTER}" \
  --flink_version="${FLINK_VERSION}" \
  --environment_type=EXTERNAL \
  --environment_config="${WORKER_POOL}" \
  --parallelism=4 \
  --streaming \
  --checkpointing_interval=60000 \
  --checkpointing_mode=EXACTLY_ONCE \
  --min_pause_between_checkpoints=30000 \
  --num_concurrent_checkpoints=1 \
  --state_backend=rocksdb \
  --state_backend_storage_path="${STATE_DIR}" \
  --externalized_checkpoints_enabled \
  --retain_externalized_checkpoints_on_cancellation \
  --number_of_execution_retries=3 \
  "$@"
