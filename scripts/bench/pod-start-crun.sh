#!/usr/bin/env bash
# scripts/bench/pod-start.sh with crun as well as runc: crun refuses this
# hybrid cgroup host, so the whole run (nanolet with each runtime, podman
# with the same runtime, bare runc) happens in the pure cgroup v2 VM of
# scripts/vm.sh. That VM emulates its CPUs: absolute times there are many
# times the host's, so read the ratios, which compare runs made side by
# side in it. Installs and builds on the host first (the VM's root is the
# host's, read-only). Ends with pod-start.sh's BENCH lines, crun's first.
# Usage: scripts/bench/pod-start-crun.sh [PODS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
[[ $(id -u) == 0 ]] || { echo "pod-start-crun.sh: run as root" >&2; exit 1; }
scripts/install-deps.sh
bench_install_podman
cargo build --release --locked --bin nanolet >&2
exec scripts/vm.sh --mem 3072 -- scripts/bench/pod-start.sh "$@"
