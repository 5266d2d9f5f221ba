#!/usr/bin/env bash
# The standalone smoke test on an ARM kernel: the shipped static aarch64
# binary, in the Debian arm64 VM of scripts/arm-vm.sh, with that system's
# runc (and crun), pulls an image from a two-platform index (amd64 and
# arm64 busybox, from a registry on this host's loopback), runs a pod, shows
# its logs, adopts it after a `kill -9` of the agent, deletes it and leaves
# nothing behind (scripts/arm-smoke.sh). Then, booted with systemd, the
# release tarball installed there and the unit running the agent
# (scripts/arm-install.sh).
# Usage: scripts/test-arm.sh [RUNTIME...]   (default: runc crun)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runtimes=("$@")
((${#runtimes[@]} > 0)) || runtimes=(runc crun)

binary=$(scripts/build-cross.sh aarch64 | awk '{print $2}')
scripts/arm-vm.sh --build >/dev/null

work=$(mktemp -d /tmp/nanolet-test-arm.XXXXXX)
cleanup() {
  scripts/registry.sh stop "$work/registry" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
images=$(scripts/arm-images.sh "$work")
read -r port arm_digest _ <<<"$images"

for runtime in "${runtimes[@]}"; do
  echo "== the ARM VM: standalone smoke test with $runtime"
  scripts/arm-vm.sh --timeout 900 -- bash scripts/arm-smoke.sh "$binary" "10.0.2.2:$port" "$arm_digest" "$runtime"
done

echo "== the ARM VM under systemd: the release tarball installed, the unit running the agent"
tarball=$(scripts/release.sh --out "$PWD/target/release-tarballs" aarch64)
scripts/arm-vm.sh --systemd --timeout 900 -- bash scripts/arm-install.sh "$tarball" "10.0.2.2:$port"
