#!/usr/bin/env bash
# The standalone smoke test on an ARM kernel: the shipped static aarch64
# binary, in the Debian arm64 VM of scripts/arm-vm.sh, with that system's
# runc (and crun), pulls an image from a multi-platform index (amd64,
# arm64 and arm/v7 busybox, from a registry on this host's loopback), runs a pod, shows
# its logs, adopts it after a `kill -9` of the agent, deletes it and leaves
# nothing behind (scripts/arm-smoke.sh). Then, booted with systemd, the
# release tarball installed there and the unit running the agent
# (scripts/arm-install.sh). With --armhf, the smoke test alone with the
# armv7 binary in the Debian armhf VM, pulling the arm/v7 image
# (scripts/test-armv7.sh).
# Usage: scripts/test-arm.sh [--armhf] [RUNTIME...]   (default: runc crun)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
debarch=arm64 build=aarch64 machine=aarch64
if [[ ${1:-} == --armhf ]]; then
  debarch=armhf build=armv7 machine=armv7l
  shift
fi
runtimes=("$@")
((${#runtimes[@]} > 0)) || runtimes=(runc crun)

binary=$(scripts/build-cross.sh "$build" | awk '{print $2}')
scripts/arm-vm.sh --arch "$debarch" --build >/dev/null

work=$(mktemp -d /tmp/nanolet-test-arm.XXXXXX)
cleanup() {
  scripts/registry.sh stop "$work/registry" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
images=$(scripts/arm-images.sh "$work")
read -r port arm64_digest armv7_digest <<<"$images"
digest=$arm64_digest
[[ $debarch == armhf ]] && digest=$armv7_digest

for runtime in "${runtimes[@]}"; do
  echo "== the $debarch VM: standalone smoke test with $runtime"
  scripts/arm-vm.sh --arch "$debarch" --timeout 900 -- bash scripts/arm-smoke.sh "$binary" "10.0.2.2:$port" "$digest" "$runtime" "$machine"
done
[[ $debarch == arm64 ]] || exit 0

echo "== the ARM VM under systemd: the release tarball installed, the unit running the agent"
tarball=$(scripts/release.sh --out "$PWD/target/release-tarballs" aarch64)
scripts/arm-vm.sh --systemd --timeout 900 -- bash scripts/arm-install.sh "$tarball" "10.0.2.2:$port"
