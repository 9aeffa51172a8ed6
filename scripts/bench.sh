#!/usr/bin/env bash
# Runs the whole-process benchmarks (cmd/edged-bench): builds edged and
# edged-bench into a temporary directory and runs the bench against a
# Mosquitto it starts on 127.0.0.1 (and edged's embedded broker).
#
#   scripts/bench.sh                          every scenario, full size
#   scripts/bench.sh -quick                   every count divided by 10
#   scripts/bench.sh -scenarios external      one scenario: external,
#                                             embedded, memory, restart,
#                                             cluster, replication
#   scripts/bench.sh -json out.jsonl          also write one JSON line per figure
#   scripts/bench.sh -scenarios external -pub-qos 0 -subjects eo -edged-cpuprofile DIR
#                                             CPU profile of edged (DIR/<pipeline>.cpu)
#   scripts/bench.sh -h                       every flag
#
# The Markdown tables and the JSON lines go to stdout, progress to stderr.
# Every process the bench starts is killed when it ends or is interrupted.
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
# In the background so that a SIGTERM or SIGINT to this script reaches the
# bench at once (it kills what it started) instead of waiting for it.
"$bin/edged-bench" -edged "$bin/edged" "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM HUP
status=0
wait "$pid" || status=$?
# A trapped signal ends the first wait early: wait for the bench itself.
if kill -0 "$pid" 2>/dev/null; then wait "$pid" || status=$?; fi
exit "$status"
