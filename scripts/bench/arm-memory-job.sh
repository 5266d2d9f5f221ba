#!/usr/bin/env bash
# The VM's side of scripts/bench/arm-memory.sh: prints "arm-memory: rss-idle
# KIB" and "arm-memory: pss-30 KIB".
# Usage: scripts/bench/arm-memory-job.sh BINARY REGISTRY PODS
set -euo pipefail
binary=$1 registry=$2 pods=$3
work=/var/lib/nanolet-bench
mkdir -p "$work/manifests"
"$binary" run --static-pod-path "$work/manifests" --state-dir "$work/state" --device-plugins-dir "$work/device-plugins" --pod-logs-dir "$work/logs" \
  --insecure-registry "$registry" --healthz-port 0 >"$work/agent.log" 2>&1 &
agent=$!
fail() { echo "arm-memory: FAIL: $*" >&2; tail -30 "$work/agent.log" >&2; exit 1; }
pod() {
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: %s/test/busybox:1\n    command: [sleep, "3600"]\n' "$1" "$registry" >"$work/manifests/.$1.tmp"
  mv "$work/manifests/.$1.tmp" "$work/manifests/$1.yaml"
}
running_pods() {
  cat "$work"/state/pods/*/status.json 2>/dev/null |
    jq -s '[.[] | select(.status.containerStatuses != null and (.status.containerStatuses | all(.state.running != null)))] | length'
}
wait_running() {
  local want=$1 deadline=$((SECONDS + 900))
  until [[ $(running_pods) -ge $want ]]; do
    ((SECONDS < deadline)) || fail "timed out waiting for $want pods"
    sleep 1
  done
}
kib() { awk -v key="$2" '$1 == key {print $2}' "/proc/$1/$3" 2>/dev/null || echo 0; }
# The agent, its monitor launcher and the pods' monitors: how many, and
# their PSS in KiB.
pss_all() {
  local total=0 count=0 pid file pids
  pids=("$agent" $(pgrep -P "$agent" -x nanolet-launch))
  # One pid a file, without a newline: read each on its own.
  for file in "$work"/state/pods/*/monitor.pid; do
    pids+=("$(cat "$file")")
  done
  for pid in "${pids[@]}"; do
    total=$((total + $(kib "$pid" Pss: smaps_rollup)))
    count=$((count + 1))
  done
  echo "$count $total"
}

# Warm-up: the pull and a pod, gone again; then the agent idle.
pod warmup
wait_running 1
rm "$work/manifests/warmup.yaml"
until ! compgen -G "$work/state/pods/*" >/dev/null; do sleep 1; done
sleep 5
echo "arm-memory: rss-idle $(kib "$agent" VmRSS: status)"
for ((i = 0; i < pods; i++)); do
  pod "bench-$i"
  wait_running $((i + 1))
done
sleep 5
read -r processes pss <<<"$(pss_all)"
((processes == pods + 2)) || fail "$processes processes measured, not the agent, its launcher and $pods monitors"
echo "arm-memory: pss-30 $pss"
rm -f "$work"/manifests/*.yaml
