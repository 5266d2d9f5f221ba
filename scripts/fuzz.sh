#!/usr/bin/env bash
# Fuzzes every parser of untrusted bytes (tests/fuzz, cargo fuzz with
# libFuzzer), SECONDS each (default 60): the layer unpacker, the kubelet
# API's query parsing, SPDY header blocks and sessions, WebSocket frames,
# what registries send (manifests, indexes, configs, challenges),
# certificates (what clients show, what the API server issues), and the API
# server's protobuf answers (a Lease renewal's, a Status).
# Each starts from its corpus in tests/fuzz/corpus/<target> (copied: what a
# run finds stays out of the repo); the unpacker's also from real layers
# made here (busybox's, in gzip and zstd). A crash fails the run and leaves
# its input under tests/fuzz/artifacts/<target>/.
# Needs root (the unpacker chowns and makes overlay whiteouts) and a
# nightly toolchain; installs cargo-fuzz if missing. scripts/test.sh runs
# it for a bounded time where the machine has a nightly toolchain. Built
# with the dev profile: three times faster to build than release here, and
# with overflow checks, which turn an overflow into the panic we look for.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
#        scripts/fuzz.sh --build    only build the targets (scripts/test.sh
#                                   does it beside the integration tests)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
build_only=false
if [[ ${1:-} == --build ]]; then
  build_only=true
  shift
fi
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]} > 0)) || targets=(unpack kubelet_query spdy_headers spdy_session websocket registry x509 kube_protobuf device_plugin)
[[ $(id -u) == 0 ]] || { echo "fuzz.sh: run as root" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

work="$(mktemp -d /tmp/nanolet-fuzz.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export NANOLET_FUZZ_DIR=/dev/shm
build() {
  if ! cargo +nightly fuzz build --dev --fuzz-dir tests/fuzz >"$work/build.log" 2>&1; then
    tail -30 "$work/build.log"
    exit 1
  fi
}
if $build_only; then
  build
  exit 0
fi
corpus=$work/corpus-unpack
mkdir -p "$corpus"
cp tests/fuzz/corpus/unpack/* "$corpus/"

# Real layers: busybox's, as the suite's images carry it.
scripts/build-image.sh "$work/oci" >/dev/null
scripts/build-image.sh "$work/oci-zstd" --compression zstd >/dev/null
for layout in "$work/oci" "$work/oci-zstd"; do
  manifest=$(jq -r '.manifests[0].digest' "$layout/index.json" | cut -d: -f2)
  layer=$(jq -r '.layers[0].digest' "$layout/blobs/sha256/$manifest" | cut -d: -f2)
  cp "$layout/blobs/sha256/$layer" "$corpus/busybox-$(basename "$layout")"
done

build
status=0
for target in "${targets[@]}"; do
  if [[ $target != unpack ]]; then
    rm -rf "$work/corpus-$target"
    cp -r "tests/fuzz/corpus/$target" "$work/corpus-$target"
  fi
  echo "== fuzz $target: ${seconds}s"
  if ! cargo +nightly fuzz run --dev --fuzz-dir tests/fuzz "$target" "$work/corpus-$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=262144 >"$work/$target.log" 2>&1; then
    status=1
    grep -v "^ *[0-9]*: \|^ *at " "$work/$target.log" | head -60
  fi
  grep -E '^(Done|SUMMARY)' "$work/$target.log" || tail -2 "$work/$target.log"
done
rm -rf /dev/shm/nanolet-fuzz-*
exit "$status"
