#!/usr/bin/env bash
# Cluster mode at rest: nanolet joined to the test API server with 5 pods
# (each with its default service account token volume), measured over an
# idle window after the pods run.
#
# - API requests the node sent in the window (the API server's request
#   record), projected to an hour; the budget is 400. Renewals that happen
#   less often than the window (watches every 10-20 min, node status every
#   5 min, tokens every ~48 min) are added from their periods.
# - the agent's RSS at the end of the window and its CPU time over it
#   (percent of one core); the pods' monitors are reported separately.
# There is no peer here: no upstream kubelet runs on these machines.
#
# Ends with:
#   BENCH cluster-api-requests-per-hour <n>
#   BENCH cluster-rss-5-pods <KiB> KiB
#   BENCH cluster-idle-cpu <percent> %
# Usage: scripts/bench/cluster-idle.sh [WINDOW_SECONDS]   (default 120)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
window=${1:-120}

bench_cluster_prepare cluster-idle.sh
bench_join_cluster "$work" bench-node "$nanolet" "$apiserver" "$registry" "$cgroup_root"
for i in 1 2 3 4 5; do
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p%s}\nspec:\n  containers:\n  - name: main\n    image: %s\n    command: [sleep, "100000"]\n---\n' \
    "$i" "$registry/bench/busybox:1"
done | kubectl apply -f - >/dev/null
kubectl wait --for=condition=Ready pod --all --timeout=120s >/dev/null
sleep 15   # first status reports settle

curl -s -X DELETE "$admin/requests" >/dev/null
cpu_ticks() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
start_ticks=$(cpu_ticks)
sleep "$window"
end_ticks=$(cpu_ticks)
hz=$(getconf CLK_TCK)
requests=$(curl -s "$admin/requests" | python3 -c '
import json, sys
print(sum(1 for r in json.load(sys.stdin) if r["user"] == "system:node:bench-node"))')
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$agent/status")
monitors=0
for pidfile in "$work"/state/pods/*/monitor.pid; do
  monitors=$((monitors + $(awk '/^VmRSS/ {print $2}' "/proc/$(cat "$pidfile")/status")))
done
python3 - "$requests" "$window" "$rss" "$monitors" "$start_ticks" "$end_ticks" "$hz" <<'PY'
import sys
requests, window, rss, monitors, t0, t1, hz = map(float, sys.argv[1:])
# Periodic work a short window may miss: node status every 5 min, 2
# watches (pods; the kube-root-ca.crt ConfigMap the pods share) renewed
# at most 6 times an hour, 5 tokens renewed at 80 % of 3607 s.
per_hour = requests * 3600 / window + 12 + 2 * 6 + 5 * 3600 / (0.8 * 3607)
cpu = (t1 - t0) / hz / window * 100
print(f"node requests in {window:.0f} s: {requests:.0f}; monitors' RSS {monitors:.0f} KiB for 5 pods")
print(f"BENCH cluster-api-requests-per-hour {per_hour:.0f}")
print(f"BENCH cluster-rss-5-pods {rss:.0f} KiB")
print(f"BENCH cluster-idle-cpu {cpu:.3f} %")
PY
