#!/usr/bin/env bash
# Regenerates the dashboard's screenshots in docs/ (dashboard-job.png,
# dashboard-checkpoints.png, dashboard-ingest.png and
# dashboard-cluster.png): runs the MQTT demo on free loopback ports, with
# a fake cluster of four devices for the cluster view, and captures the
# views in headless chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && [ -z "${EDGED_CHROMIUM:-}" ]; then
  echo "chromium is not installed (apt-get install chromium, or set EDGED_CHROMIUM)" >&2
  exit 1
fi
mkdir -p docs
EDGED_SCREENSHOTS="$PWD/docs" go test ./dashboard -run '^TestScreenshots$' -count=1 -v
ls -l docs/dashboard-*.png
