#!/usr/bin/env bash
# Runs the end-to-end tests in test/, each in a process of its own, a few
# at once. They spend most of their time waiting on edged processes,
# brokers and kills, so two at a time take less time than one after
# another (506 s against 741 s for 57 tests in CI, on two CPUs). Each runner gets its own part of
# the ports the tests pick from (EDGED_TEST_PORTS), so two tests running
# side by side never pick the same port. With -j above 1, the few tests
# that mostly sit in a deliberate wait run in a runner of their own
# beside the others (see waiting below).
#
#   scripts/e2e.sh              # every test, two at a time
#   scripts/e2e.sh -j 1         # one at a time
#   scripts/e2e.sh -run Cluster # the tests whose names match a regexp
#
# Prints one line per test (ok, skip or FAIL, its time, and the CPU time
# its processes used: the test's, edged's, the brokers' and the burners')
# and the whole output of a test that failed or skipped; exits non-zero
# when one failed.
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
# Tests that spend most of their time in a deliberate wait (a broker
# stopped, hung or kept down, a peer that cannot be reached, a full card),
# which is what they are about, with little for the CPU to do: they use
# 0.1-0.4 CPU-s per second where the others use 0.6-1.2 (the cpu column).
# They run one after another in a runner of their own beside the others,
# instead of holding one of their slots.
waiting="TestMosquittoBrokerHungExactlyOnce TestMosquittoSinkBrokerDownResultsKept
  TestMosquittoSIGTERMWhileTheSinkBrokerStaysDown TestMosquittoBrokerDownWhileEdgedStarts
  TestClusterWrongPeerTransportAddressIsNamed TestMosquittoSinkBrokerKilledBeforeAQuietStretch
  TestMosquittoSinkBrokerKilledThenEdgedStoppedAfterAQuietStretch
  TestMosquittoSinkBrokerKilledThenEdgedKilledAfterAQuietStretch TestCardFullStopDoesNotWaitForSpace"
declare -A listed=()
mapfile -t all < <(cd test && "$work/e2e.test" -test.list "$run" | grep '^Test' || true)
for n in "${all[@]}"; do listed[$n]=1; done
waiters=()
if [ "$jobs" -gt 1 ]; then
  for n in $waiting; do
    if [ -n "${listed[$n]:-}" ]; then waiters+=("$n"); unset "listed[$n]"; fi
  done
fi
names=()
for n in $long; do
  if [ -n "${listed[$n]:-}" ]; then names+=("$n"); unset "listed[$n]"; fi
done
for n in "${all[@]}"; do
  if [ -n "${listed[$n]:-}" ]; then names+=("$n"); fi
done
if [ $((${#names[@]} + ${#waiters[@]})) -eq 0 ]; then
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

# cpu_of prints the CPU seconds (user and system) of the children in the
# output of bash's times written to file $1 (its second line).
cpu_of() {
  [ -s "$1" ] || { echo 0; return; }
  sed -n 2p "$1" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); s += p[1] * 60 + p[2] } printf "%.1f", s }'
}

# The ports of [20000, 32000) in one part per runner.
slots=$jobs
[ ${#waiters[@]} -gt 0 ] && slots=$((jobs + 1))
span=$(( (32000 - 20000) / slots ))
# runner SLOT runs the tests of names in turn with the other runners;
# runner SLOT waiting runs those of waiters, one after another.
runner() {
  local slot=$1 lo=$((20000 + $1 * span)) i name start secs status w=0
  while :; do
    if [ "${2:-}" = waiting ]; then
      [ "$w" -lt ${#waiters[@]} ] || break
      name=${waiters[$w]}
      w=$((w + 1))
    else
      i=$(next) && [ "$i" -lt ${#names[@]} ] || break
      name=${names[$i]}
    fi
    start=$(date +%s%N)
    # The subshell's times: what the test's processes (edged, brokers,
    # burners) used of the CPU, user and system, once they have ended.
    if (cd test && EDGED_TEST_PORTS="$lo-$((lo + span))" EDGED_E2E_EDGED="$work/edged" \
      "$work/e2e.test" -test.run "^${name}\$" -test.count=1 -test.timeout 10m -test.v >"$work/$name.log" 2>&1
      rc=$?; times >"$work/$name.cpu"; exit $rc); then
      status=ok
      grep -q -- "^--- SKIP: $name " "$work/$name.log" && status=skip
    else
      status=FAIL
      echo "$name" >>"$work/failed"
    fi
    secs=$(( ($(date +%s%N) - start) / 1000000 ))
    cpu=$(cpu_of "$work/$name.cpu")
    (
      flock 9
      printf '%-4s %-58s %4d.%01ds  cpu %5.1fs\n' "$status" "$name" $((secs / 1000)) $((secs % 1000 / 100)) "$cpu"
      [ "$status" = ok ] || sed 's/^/    /' "$work/$name.log"
    ) 9>"$work/print.lock"
  done
}

begin=$(date +%s)
echo "== test/: $((${#names[@]} + ${#waiters[@]})) tests, $jobs at a time (and ${#waiters[@]} that mostly wait, one after another beside them)"
for ((s = 0; s < jobs; s++)); do runner "$s" & done
[ ${#waiters[@]} -gt 0 ] && runner "$jobs" waiting &
wait
failed=$(cat "$work/failed")
echo "== test/: $(( $(date +%s) - begin ))s"
if [ -n "$failed" ]; then
  echo "FAIL:" $failed
  exit 1
fi
