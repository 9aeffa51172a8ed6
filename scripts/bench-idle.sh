#!/usr/bin/env bash
# Idle RSS of edged: a fresh `edged run` with the exactly-once pipeline of
# the whole-process benchmarks (JSON readings, key by sensor, 1 s tumbling
# count+avg, write-ahead MQTT sink, checkpoints every 1 s), no traffic.
# Samples VmRSS (and its anonymous and file-backed parts) every 100 ms from
# exec and prints the peak over -secs seconds, for each binary given, in
# turn, -rounds times (alternating, so that binaries share the machine's
# conditions).
#
#   scripts/bench-idle.sh                         this tree's edged built as `make edged` builds it, embedded broker, 20 s
#   scripts/bench-idle.sh -build plain            built with a plain `go build` (what `go run` runs)
#   scripts/bench-idle.sh -broker external        against a Mosquitto it starts on 127.0.0.1
#   scripts/bench-idle.sh -secs 30 -rounds 3 old=/tmp/edged-old new=/tmp/edged-new
#
# RssFile is the pages of the binary (and libc) mapped into the process:
# clean page cache the kernel can reclaim, and shared with every other
# process running the same binary; RssAnon is the process's own memory.
# How many pages one fault maps depends on the kernel (fault-around, 64 KiB
# by default) and on the size of the page-cache folios holding the file,
# which depends on how the file got into the cache (the linker's writes,
# cp, readahead): identical bytes measured up to 1.5 MB apart. So every
# binary is first copied (cp) into the run's directory and run from there.
set -euo pipefail
cd "$(dirname "$0")/.."

broker=embedded secs=20 rounds=1 build=make bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    -broker) broker=$2; shift 2 ;;
    -secs) secs=$2; shift 2 ;;
    -build) build=$2; shift 2 ;;
    -rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *=*) bins+=("$1"); shift ;;
    *) echo "unknown argument $1 (-h for help)" >&2; exit 2 ;;
  esac
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/edged-idle-XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM HUP

if [ ${#bins[@]} -eq 0 ]; then
  case "$build" in
    make) make -s EDGED="$tmp/edged" edged ;;
    plain) go build -o "$tmp/edged" ./cmd/edged ;;
    *) echo "-build $build: make or plain" >&2; exit 2 ;;
  esac
  bins=("this=$tmp/edged")
fi
# Same page-cache state for every binary (see above).
for i in "${!bins[@]}"; do
  b=${bins[$i]}
  cp "${b#*=}" "$tmp/bin-$i"
  bins[$i]="${b%%=*}=$tmp/bin-$i"
done

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

mq=""
if [ "$broker" = external ]; then
  mosq=$(command -v mosquitto || echo /usr/sbin/mosquitto)
  mport=$(freeport)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$mport" > "$tmp/mq.conf"
  "$mosq" -c "$tmp/mq.conf" > "$tmp/mq.log" 2>&1 &
  mq=$!
  pids+=("$mq")
  sleep 0.5
fi

# run <name> <binary>: one fresh edged, sampled for $secs seconds.
run() {
  local name=$1 bin=$2 d
  d=$(mktemp -d "$tmp/run-XXXX")
  {
    echo "node:"
    echo "  data_dir: $d/data"
    echo "  listen: 127.0.0.1:$(freeport)"
    if [ "$broker" = embedded ]; then
      echo "  broker: 127.0.0.1:$(freeport)"
    fi
    echo "pipelines:"
    echo "  - name: idle"
    echo "    source:"
    echo "      mqtt:"
    if [ "$broker" = external ]; then
      echo "        broker: tcp://127.0.0.1:$mport"
      echo "        client_id: bench-idle-$RANDOM"
      echo "        qos: 1"
    fi
    cat <<EOF
        topics: ["bench/#"]
        format: json
        fields:
          id: {type: string, path: \$.sensor}
          temp: {type: float, path: \$.t}
          ts: {type: time, path: \$.ts, unit: ms}
    event_time: {field: ts, max_out_of_orderness: 2s}
    key: id
    window:
      type: tumbling
      size: 1s
      aggregates: [{name: count, fn: count}, {name: avg, fn: avg, field: temp}]
    sinks:
      - mqtt: {topic: "agg/{id}", qos: 1}
    checkpoint: {dir: $d/data/checkpoints, interval: 1s, mode: exactly_once}
EOF
  } > "$d/edged.yaml"
  "$bin" run -c "$d/edged.yaml" > "$d/log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local start=$SECONDS peak=0 panon=0 pfile=0 rss anon file key val rest
  local end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    rss=0 anon=0 file=0
    while read -r key val rest; do
      case "$key" in
        VmRSS:) rss=$val ;;
        RssAnon:) anon=$val ;;
        RssFile:) file=$val ;;
      esac
    done < "/proc/$pid/status" || { echo "$name: edged exited" >&2; tail -20 "$d/log" >&2; return 1; }
    if [ "$rss" -gt "$peak" ]; then peak=$rss panon=$anon pfile=$file; fi
    sleep 0.1
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  printf '| %s | %s | %d s | %.1f MB | %.1f MB | %.1f MB | %.1f MB |\n' "$name" "$broker" "$secs" \
    "$(echo "$peak/1024" | bc -l)" "$(echo "$panon/1024" | bc -l)" "$(echo "$pfile/1024" | bc -l)" "$(echo "$rss/1024" | bc -l)"
  rm -rf "$d"
}

echo "| binary | broker | sampled | peak VmRSS | RssAnon at peak | RssFile at peak | VmRSS at the end |"
echo "|---|---|---|---|---|---|---|"
for _ in $(seq 1 "$rounds"); do
  for b in "${bins[@]}"; do
    run "${b%%=*}" "${b#*=}"
  done
done
