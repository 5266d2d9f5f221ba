#!/usr/bin/env bash
# Builds the static aarch64 release binary and, with --test, runs the unit
# tests for that target under qemu-aarch64-static.
# Usage: scripts/build-cross.sh [--test]
# Prints the binary's path and size.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

target=aarch64-unknown-linux-musl
config=cross/aarch64.toml

cargo --config "$config" build --release --locked --bin nanolet
binary="target/$target/release/nanolet"
if ! file "$binary" | grep -q "ARM aarch64.*statically linked"; then
  echo "build-cross.sh: $binary is not a static aarch64 executable: $(file -b "$binary")" >&2
  exit 1
fi
# The binary must start on the target architecture, not just link.
qemu-aarch64-static "$binary" version >/dev/null
echo "$binary $(stat -c %s "$binary") bytes"

if [[ ${1:-} == --test ]]; then
  # The library holds the unit tests (the binary has none of its own).
  cargo --config "$config" test --locked --lib --bin nanolet
fi
