#!/usr/bin/env bash
# Installs what the suite needs, then runs all of it: formatting and lints,
# unit and integration tests (real registry, runc, overlayfs, kubectl against
# the test API server; as root), and the static aarch64 build with its unit
# tests under qemu.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if [[ $(id -u) != 0 ]]; then
  echo "test.sh: the suite runs containers and mounts: run it as root" >&2
  exit 1
fi
scripts/install-deps.sh

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings

echo "== aarch64: static release build, unit tests under qemu"
scripts/build-cross.sh --test

echo "== unit and integration tests (agent and test API server)"
cargo test --locked --workspace
