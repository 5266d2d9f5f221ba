#!/usr/bin/env bash
# For the ARM VMs' tests and benchmarks: starts a registry on this host's
# loopback, with its state in DIR/registry, and pushes test/busybox:1 to it
# as a three-platform index (amd64: this host's busybox; arm64 and arm/v7:
# Debian's static busybox of arm64 and armhf, as the VMs' systems have it).
# Stop it with `scripts/registry.sh stop DIR/registry`.
# Usage: scripts/arm-images.sh DIR
# Prints "PORT ARM64_MANIFEST_DIGEST ARMV7_MANIFEST_DIGEST".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$1
registry=$(scripts/registry.sh start "$work/registry")
scripts/build-image.sh "$work/amd64" --arch amd64 --tag 1 >/dev/null
digests=()
for debarch in arm64 armhf; do
  deb=$(scripts/apt-foreign.sh "$debarch" "target/apt-$debarch/debs" busybox-static)
  rm -rf "$work/busybox-$debarch"
  dpkg-deb -x "$deb" "$work/busybox-$debarch"
  oci=arm64
  [[ $debarch == armhf ]] && oci=arm
  digests+=("$(scripts/build-image.sh "$work/$debarch" --arch "$oci" --busybox "$work/busybox-$debarch/bin/busybox" --tag 1)")
done
scripts/push-image.sh --index "$registry" test/busybox:1 "$work/amd64" "$work/arm64" "$work/armhf" >/dev/null
echo "${registry##*:} ${digests[*]}"
