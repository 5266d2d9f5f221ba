#!/usr/bin/env bash
# The standalone smoke test on a 32-bit ARM kernel: the shipped static
# armv7 binary, in the Debian armhf VM of `scripts/arm-vm.sh --arch armhf`
# (a Cortex-A15, Debian's armmp-lpae kernel), with that system's runc and
# crun, pulling the arm/v7 image of a three-platform index
# (scripts/arm-smoke.sh). Not part of scripts/test.sh, which has no time
# left for a second emulated system; run it by hand.
# Usage: scripts/test-armv7.sh [RUNTIME...]   (default: runc crun)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runtimes=("$@")
((${#runtimes[@]} > 0)) || runtimes=(runc crun)

binary=$(scripts/build-cross.sh armv7 | awk '{print $2}')
scripts/arm-vm.sh --arch armhf --build >/dev/null

work=$(mktemp -d /tmp/nanolet-test-armv7.XXXXXX)
cleanup() {
  scripts/registry.sh stop "$work/registry" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
images=$(scripts/arm-images.sh "$work")
read -r port _ armv7_digest <<<"$images"

for runtime in "${runtimes[@]}"; do
  echo "== the armhf VM: standalone smoke test with $runtime"
  scripts/arm-vm.sh --arch armhf --timeout 900 -- bash scripts/arm-smoke.sh "$binary" "10.0.2.2:$port" "$armv7_digest" "$runtime" armv7l
done
