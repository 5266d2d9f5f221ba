#!/usr/bin/env bash
# Installs what the suite needs, then runs all of it: formatting and lints,
# unit and integration tests (real registry, runc, overlayfs, kubectl against
# the test API server, CNI in a network namespace of the tests' own; as
# root), the static aarch64 build with its unit tests under qemu, and the
# cgroup v2 part in a qemu VM (scripts/test-vm.sh).
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

echo "== cgroup v2 VM: cgroup v2 tests with crun and runc, standalone tests with crun"
scripts/test-vm.sh
