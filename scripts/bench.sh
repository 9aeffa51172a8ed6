#!/usr/bin/env bash
# Runs the whole-process benchmarks (cmd/edged-bench): builds edged and
# edged-bench into a temporary directory and runs the bench against a
# Mosquitto it starts on 127.0.0.1. Arguments go to edged-bench
# (scripts/bench.sh -h lists them).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mosquitto >/dev/null 2>&1 && [ -x /usr/sbin/mosquitto ]; then
  export PATH="$PATH:/usr/sbin"
fi
if ! command -v mosquitto >/dev/null 2>&1; then
  echo "mosquitto is not installed (apt-get install mosquitto)" >&2
  exit 1
fi

bin="$(mktemp -d "${TMPDIR:-/tmp}/edged-bench-bin-XXXXXX")"
trap 'rm -rf "$bin"' EXIT
go build -o "$bin" ./cmd/edged ./cmd/edged-bench
"$bin/edged-bench" -edged "$bin/edged" "$@"
