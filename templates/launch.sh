#!/usr/bin/env bash
# Build the Flex Template of pipelines/continual_count.py and run it on Dataflow.
#
#   PROJECT=my-project REGION=europe-west1 BUCKET=my-bucket templates/launch.sh build
#   PROJECT=my-project REGION=europe-west1 BUCKET=my-bucket templates/launch.sh run [DAYS]
#
# Needs gcloud (authenticated), Docker or Cloud Build, an Artifact Registry
# Docker repository REPO (default: dp-beam) in REGION, and a bucket.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${BUCKET:?set BUCKET}"
REPO="${REPO:-dp-beam}"
TAG="${TAG:-0.1.0}"
IMAGE="${REGION}-docker.pkg.dev/${PROJECT}/${REPO}/continual-count:${TAG}"
TEMPLATE="gs://${BUCKET}/templates/continual-count-${TAG}.json"

case "${1:-}" in
  build)
    # Cloud Build builds the image from the repository root with templates/Dockerfile.
    gcloud builds submit --project "${PROJECT}" --region "${REGION}" \
      --config /dev/stdin . <<YAML
steps:
- name: gcr.io/cloud-builders/docker
  args: [build, -f, templates/Dockerfile, -t, "${IMAGE}", .]
images: ["${IMAGE}"]
YAML
    gcloud dataflow flex-template build "${TEMPLATE}" \
      --project "${PROJECT}" \
      --image "${IMAGE}" \
      --sdk-language PYTHON \
      --metadata-file templates/metadata.json
    echo "template: ${TEMPLATE}"
    ;;
  run)
    DAYS="${2:-}"
    JOB="continual-count-$(date -u +%Y%m%d-%H%M%S)"
    PARAMS="output=gs://${BUCKET}/dp-beam/${JOB},epsilon=1.0,sdk_container_image=${IMAGE}"
    if [ -n "${DAYS}" ]; then PARAMS="${PARAMS},days=${DAYS}"; fi
    gcloud dataflow flex-template run "${JOB}" \
      --project "${PROJECT}" \
      --region "${REGION}" \
      --template-file-gcs-location "${TEMPLATE}" \
      --temp-location "gs://${BUCKET}/tmp" \
      --staging-location "gs://${BUCKET}/staging" \
      --parameters "${PARAMS}"
    echo "outputs: gs://${BUCKET}/dp-beam/${JOB}  (then: dp-beam report gs://${BUCKET}/dp-beam/${JOB} --dest report/)"
    ;;
  *)
    echo "usage: $0 build | run [DAYS]" >&2
    exit 2
    ;;
esac
