#!/usr/bin/env bash
# Build and push the images that nanolet's bundled example manifests refer to,
# so a demo or test only needs a local registry, not Docker Hub.
# Usage: scripts/demo-image.sh REGISTRY      (e.g. 127.0.0.1:5000)
# Prints each pushed reference as REGISTRY/NAME:TAG@sha256:... on stdout.
set -euo pipefail

(($# == 1)) || {
  echo "usage: $0 REGISTRY" >&2
  exit 2
}
registry=$1
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The image reuses the host's static busybox, so label it with the host's
# architecture; anything else would be a lie the runtime would trip over.
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "demo-image.sh: unsupported host architecture $(uname -m)" >&2; exit 1 ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Single quotes are deliberate: $(hostname) and $(date) must run inside the
# container on every loop iteration, not here.
# shellcheck disable=SC2016
demo_script='while true; do echo hello from $(hostname) at $(date); sleep 5; done'
demo_cmd="$(jq -cn --arg s "$demo_script" '["sh", "-c", $s]')"

"$here/build-image.sh" "$work/demo" --arch "$arch" --tag 1 --cmd "$demo_cmd" >/dev/null
"$here/push-image.sh" "$work/demo" 1 "$registry" nanolet/demo:1
