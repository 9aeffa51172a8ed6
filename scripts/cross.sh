#!/usr/bin/env bash
# Builds edged for the boards people run it on and runs the pure packages'
# tests as a 32-bit program. The 32-bit run is linux/arm (v7) under
# qemu-user: it is what most 32-bit boards are, and it runs on any x86-64
# kernel (a linux/386 binary needs the kernel's IA-32 emulation, which CI
# machines may not have).
set -euo pipefail
cd "$(dirname "$0")/.."

PURE_PKGS="keygroup codec watermark snapshot state"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== cross-build cmd/edged"
for target in arm64: arm:7; do
  arch=${target%%:*}; arm=${target#*:}
  GOOS=linux GOARCH=$arch GOARM=$arm CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/edged-$arch" ./cmd/edged
  printf '   linux/%s%s: %s bytes (stripped)\n' "$arch" "${arm:+ v$arm}" "$(stat -c %s "$out/edged-$arch")"
done

if ! command -v qemu-arm >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing qemu-user"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null
  fi
fi
if ! command -v qemu-arm >/dev/null 2>&1; then
  echo "== qemu-arm is not installed and cannot be: the 32-bit tests do not run"
  exit 0
fi

echo "== 32-bit tests (linux/arm v7 under qemu-arm): $PURE_PKGS"
pids=()
for p in $PURE_PKGS; do
  GOOS=linux GOARCH=arm GOARM=7 go test -c -o "$out/$p.test" "./$p"
  ( cd "$p" && qemu-arm "$out/$p.test" -test.short -test.count=1 >"$out/$p.log" 2>&1 \
      && echo "ok   $p (32-bit)" || { echo "FAIL $p (32-bit)"; tail -40 "$out/$p.log"; exit 1; } ) &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
