#!/usr/bin/env bash
# nanolet's memory on an ARM kernel: the shipped static aarch64 binary in
# the Debian arm64 VM of scripts/arm-vm.sh (software emulation: times mean
# nothing there, page counts are as on a board), with the system's runc.
# Each run boots the VM once: the agent idle after a pull and a pod (its
# RSS, as the x86 figure), then 30 one-container pods (PSS of the agent,
# its monitor launcher and the 30 monitors, as pod-start.sh measures on
# x86). No peer runs in the VM. Medians of RUNS runs (default 3).
# Usage: scripts/bench/arm-memory.sh [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
runs=${1:-3}

binary=$(scripts/build-cross.sh aarch64 | awk '{print $2}')
scripts/arm-vm.sh --build >/dev/null
work=$(mktemp -d /tmp/nanolet-arm-memory.XXXXXX)
trap 'scripts/registry.sh stop "$work/registry" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
images=$(scripts/arm-images.sh "$work")
read -r port _ _ <<<"$images"

idle=() thirty=()
for ((run = 1; run <= runs; run++)); do
  out=$(scripts/arm-vm.sh --mem 3072 --timeout 1500 -- bash scripts/bench/arm-memory-job.sh "$binary" "10.0.2.2:$port" 30) ||
    { echo "$out" >&2; exit 1; }
  grep '^arm-memory:' <<<"$out" >&2
  idle+=("$(sed -n 's/^arm-memory: rss-idle \([0-9]*\)$/\1/p' <<<"$out")")
  thirty+=("$(sed -n 's/^arm-memory: pss-30 \([0-9]*\)$/\1/p' <<<"$out")")
  [[ -n ${idle[-1]} && -n ${thirty[-1]} ]] || { echo "$out" >&2; exit 1; }
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo "runs: rss-idle ${idle[*]} KiB; memory-30-pods ${thirty[*]} KiB" >&2
echo "BENCH rss-idle-aarch64 $(median "${idle[@]}") KiB"
echo "BENCH memory-30-pods-aarch64 $(median "${thirty[@]}") KiB"
