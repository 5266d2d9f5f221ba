#!/usr/bin/env bash
# For the ARM VM's tests and benchmarks: starts a registry on this host's
# loopback, with its state in DIR/registry, and pushes test/busybox:1 to it
# as a two-platform index (amd64: this host's busybox; arm64: Debian's
# static busybox, as the VM's system has it). Stop it with
# `scripts/registry.sh stop DIR/registry`.
# Usage: scripts/arm-images.sh DIR
# Prints "PORT ARM64_MANIFEST_DIGEST".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
work=$1
registry=$(scripts/registry.sh start "$work/registry")
deb=$(scripts/apt-foreign.sh arm64 target/arm-vm/debs busybox-static)
rm -rf "$work/busybox-arm64"
dpkg-deb -x "$deb" "$work/busybox-arm64"
scripts/build-image.sh "$work/amd64" --arch amd64 --tag 1 >/dev/null
arm_digest=$(scripts/build-image.sh "$work/arm64" --arch arm64 --busybox "$work/busybox-arm64/bin/busybox" --tag 1)
scripts/push-image.sh --index "$registry" test/busybox:1 "$work/amd64" "$work/arm64" >/dev/null
echo "${registry##*:} $arm_digest"
