#!/usr/bin/env bash
# Installs what the suite needs, then runs all of it: formatting and lints,
# unit and integration tests (real registry, runc, overlayfs, kubectl against
# the test API server, CNI in a network namespace of the tests' own; as
# root), the boards' static builds with their size budget, the release
# tarball's install, the upgrade from the previous release, every fuzz target
# for a bounded time (scripts/fuzz.sh, with a nightly toolchain), the cgroup
# v2 part in a qemu VM (scripts/test-vm.sh), and the standalone smoke test
# on an ARM kernel (scripts/test-arm.sh).
#
# Usage: scripts/test.sh                    the whole suite
#        scripts/test.sh --repeat N TEST... the tests these filters match (as
#                                           cargo test takes them), N times in a row
#        scripts/test.sh --repeat N --vm [TEST...]
#                                           the cgroup v2 VM step, or only the
#                                           named tests in it, N times in one boot
# A repeated run stops at the first failure, so a flaky test shows before
# it lands.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if [[ $(id -u) != 0 ]]; then
  echo "test.sh: the suite runs containers and mounts: run it as root" >&2
  exit 1
fi
scripts/install-deps.sh

if [[ ${1:-} == --repeat ]]; then
  repeat=${2:-}
  shift 2 || true
  [[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: --repeat takes a count" >&2; exit 2; }
  if [[ ${1:-} == --vm ]]; then
    shift
    exec scripts/test-vm.sh --repeat "$repeat" ${1:+--only} "$@"
  fi
  (($# > 0)) || { echo "test.sh: --repeat needs test names (or --vm)" >&2; exit 2; }
  cargo test --locked --workspace --no-run
  out=$(mktemp /tmp/nanolet-test-repeat.XXXXXX)
  trap 'rm -f "$out"' EXIT
  for ((round = 1; round <= repeat; round++)); do
    echo "== round $round of $repeat: $*"
    cargo test --locked --workspace -q -- "$@" 2>&1 | tee "$out"
    # A name that matched nothing passes: count what ran.
    passed=$(grep -oE 'test result: ok\. [0-9]+ passed' "$out" | awk '{s += $4} END {print s + 0}')
    ((passed > 0)) || { echo "test.sh: no test matched: $*" >&2; exit 1; }
  done
  echo "== $repeat rounds passed"
  exit 0
fi

# Each step's time, so that a suite near its 30 minutes shows where they go.
step_start=$SECONDS
step() {
  echo "== took $((SECONDS - step_start)) s (suite so far $SECONDS s)"
  step_start=$SECONDS
  [[ -z ${1:-} ]] || echo "== $1"
}
trap step EXIT

step "format and lints"
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings

# The previous release's agent (for the upgrade test), the boards' static
# binaries and the ARM VM's system build at the lowest priority while the
# integration tests run: those mostly wait on containers and timers, and
# leave the cores idle. (The unit tests under qemu-aarch64 that ran here
# gave way to the ARM VM, which runs the shipped binary on an ARM kernel:
# scripts/build-cross.sh --test still runs them.)
step "in the background: the previous release's agent; static release builds for aarch64, armv7, armv6, riscv64 (size-checked); the ARM VM's system (once); the fuzz targets"
boards_log=$(mktemp /tmp/nanolet-boards.XXXXXX)
previous=$(mktemp /tmp/nanolet-previous.XXXXXX)
# A process group of its own, so that a failed suite stops its cargo too.
# Two lanes: an LTO build keeps about one core busy, and two of them both.
# The second has a target dir of its own (cargo would make it wait for the
# first's lock on target/release); the fuzz targets have theirs
# (tests/fuzz/target), and fuzzing later finds them built.
nightly=false
rustup toolchain list 2>/dev/null | grep -q '^nightly' && nightly=true
setsid nice -n 19 bash -c '
  (scripts/build-previous.sh >"$1" && CARGO_TARGET_DIR=target/lane-b scripts/build-cross.sh riscv64 armv6 &&
    { ! $2 || scripts/fuzz.sh --build; }) &
  lane_b=$!
  scripts/build-cross.sh aarch64 armv7 && scripts/arm-vm.sh --build && wait "$lane_b"' \
  sh "$previous" "$nightly" >"$boards_log" 2>&1 &
boards=$!
trap 'kill -- -$boards 2>/dev/null || true; rm -f "$boards_log" "$previous"; step' EXIT

step "unit and integration tests (agent and test API server)"
cargo test --locked --workspace

step "waiting for the boards' builds"
if ! wait "$boards"; then
  cat "$boards_log"
  echo "test.sh: the boards' builds or their checks failed" >&2
  exit 1
fi
grep -E '^(aarch64|armv7|armv6|riscv64) ' "$boards_log"

step "the release tarball's install; the agent upgraded under running pods"
scripts/test-install.sh aarch64
NANOLET_PREVIOUS_AGENT=$(cat "$previous") cargo test --locked --test upgrade -- --ignored

# Bounded: 9 s per parser of untrusted bytes (eight of them, in the
# suite's 30 minutes), from the corpus in the repo.
if $nightly; then
  step "fuzzing: every parser of untrusted bytes, 9 s each (nightly)"
  scripts/fuzz.sh 9
else
  echo "== fuzzing skipped: no nightly toolchain (rustup toolchain install nightly)"
fi

step "cgroup v2 VM: cgroup v2 tests with crun and runc, standalone tests with crun"
scripts/test-vm.sh

step "ARM VM: the aarch64 binary's standalone smoke test on Debian arm64 with runc and crun"
scripts/test-arm.sh
