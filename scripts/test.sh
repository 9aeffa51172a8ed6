#!/usr/bin/env bash
# Runs the whole test suite: vet, the race detector on the packages where
# goroutines live, and every other test. Installs and starts what the tests
# need first.
set -euo pipefail
cd "$(dirname "$0")/.."

# Packages whose tests run with the race detector: the runtime and
# everything that runs on its goroutines.
RACE_PKGS="./actors/... ./stream/... ./operators/... ./state/... ./pipeline/... ./mqtt/... ./daemon/..."

echo "== go vet"
go vet ./...

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== tests with the race detector: $RACE_PKGS"
go test -race -count=1 $RACE_PKGS

echo "== all tests"
go test -count=1 ./...
