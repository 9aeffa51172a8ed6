#!/usr/bin/env bash
# Runs the end-to-end tests in test/, each in a process of its own, a few
# at once. They spend most of their time waiting on edged processes,
# brokers and kills, so two at a time take less time than one after
# another (506 s against 741 s for 57 tests in CI, on two CPUs). Each runner gets its own part of
# the ports the tests pick from (EDGED_TEST_PORTS), so two tests running
# side by side never pick the same port.
#
#   scripts/e2e.sh              # every test, two at a time
#   scripts/e2e.sh -j 1         # one at a time
#   scripts/e2e.sh -run Cluster # the tests whose names match a regexp
#
# Prints one line per test (ok, skip or FAIL, and its time) and the whole
# output of a test that failed or skipped; exits non-zero when one failed.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=2
run=.
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    -run) run=$2; shift 2 ;;
    *) echo "usage: $0 [-j N] [-run REGEXP]" >&2; exit 2 ;;
  esac
done
case "$jobs" in ''|*[!0-9]*|0) echo "-j wants a positive number, got '$jobs'" >&2; exit 2 ;; esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/edged" ./cmd/edged
go test -c -o "$work/e2e.test" ./test

# The longest tests first (about 35-80 s each when run alone): one started
# last would run alone at the end. Names missing here run after them, in
# the package's order.
long="TestClusterSessionWindowsFailover TestEmbeddedKillExactlyOnceQoS2 TestMosquittoSinkBrokerDownResultsKept
  TestMosquittoBrokerHungExactlyOnce TestSlidingAndSessionWindowsExactAcrossKills
  TestClusterTwoPipelinesKillsExact TestMosquittoTotals
  TestCLIStopWithSavepointAndResume TestClusterLeaderRestartsBeforeDetection
  TestMosquittoSIGTERMWhileTheSinkBrokerStaysDown TestClusterDrainOfTheSinkNodeAndRebalanceAskedTwiceAtOnce
  TestClusterSessionLateUpdatesAcrossRescale TestClusterLateUpdatesAcrossFailover"
declare -A listed=()
mapfile -t all < <(cd test && "$work/e2e.test" -test.list "$run" | grep '^Test' || true)
for n in "${all[@]}"; do listed[$n]=1; done
names=()
for n in $long; do
  if [ -n "${listed[$n]:-}" ]; then names+=("$n"); unset "listed[$n]"; fi
done
for n in "${all[@]}"; do
  if [ -n "${listed[$n]:-}" ]; then names+=("$n"); fi
done
if [ ${#names[@]} -eq 0 ]; then
  echo "no test in test/ matches '$run'" >&2
  exit 1
fi

echo 0 >"$work/next"
: >"$work/failed"
# next prints the index of the next test to run (a counter under a lock).
next() {
  (
    flock 8
    i=$(cat "$work/next")
    echo $((i + 1)) >"$work/next"
    echo "$i"
  ) 8>"$work/next.lock"
}

# The ports of [20000, 32000) in one part per runner.
span=$(( (32000 - 20000) / jobs ))
runner() {
  local slot=$1 lo=$((20000 + $1 * span)) i name start secs status
  while i=$(next) && [ "$i" -lt ${#names[@]} ]; do
    name=${names[$i]}
    start=$(date +%s%N)
    if (cd test && EDGED_TEST_PORTS="$lo-$((lo + span))" EDGED_E2E_EDGED="$work/edged" \
      "$work/e2e.test" -test.run "^${name}\$" -test.count=1 -test.timeout 10m -test.v) >"$work/$name.log" 2>&1; then
      status=ok
      grep -q -- "^--- SKIP: $name " "$work/$name.log" && status=skip
    else
      status=FAIL
      echo "$name" >>"$work/failed"
    fi
    secs=$(( ($(date +%s%N) - start) / 1000000 ))
    (
      flock 9
      printf '%-4s %-58s %4d.%01ds\n' "$status" "$name" $((secs / 1000)) $((secs % 1000 / 100))
      [ "$status" = ok ] || sed 's/^/    /' "$work/$name.log"
    ) 9>"$work/print.lock"
  done
}

begin=$(date +%s)
echo "== test/: ${#names[@]} tests, $jobs at a time"
for ((s = 0; s < jobs; s++)); do runner "$s" & done
wait
failed=$(cat "$work/failed")
echo "== test/: $(( $(date +%s) - begin ))s"
if [ -n "$failed" ]; then
  echo "FAIL:" $failed
  exit 1
fi
