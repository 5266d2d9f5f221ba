#!/usr/bin/env bash
# The cost of observing: nanolet joined to the test API server with 30 pods.
#
# - idle: CPU time of the agent, its 30 pod monitors and their launcher over WINDOW seconds
#   with nothing asked of them (percent of one core), and their wakeups
#   per second (times a thread was scheduled in), both from
#   /proc/PID/task/*/schedstat (nanoseconds on the CPU, timeslices);
# - one scrape: the agent's CPU time per `/stats/summary` and per
#   `/metrics/resource` request, as the median of 5 rounds of 10 requests
#   each through the API server's node proxy (how metrics-server reads).
# There is no peer here: no upstream kubelet (or cAdvisor) runs on these
# machines, and a runtime without an agent has nothing to compare.
#
# Ends with:
#   BENCH idle-cpu-30-pods <percent> %
#   BENCH idle-wakeups-30-pods <n>/s
#   BENCH summary-scrape-cpu <ms> ms
#   BENCH resource-scrape-cpu <ms> ms
# Usage: scripts/bench/idle.sh [WINDOW_SECONDS]   (default 300)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
window=${1:-300}
pods=30

bench_cluster_prepare idle.sh
bench_join_cluster "$work" bench-node "$nanolet" "$apiserver" "$registry" "$cgroup_root"
for i in $(seq 1 "$pods"); do
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p%s}\nspec:\n  automountServiceAccountToken: false\n  containers:\n  - name: main\n    image: %s\n    command: [sleep, "100000"]\n---\n' \
    "$i" "$registry/bench/busybox:1"
done | kubectl apply -f - >/dev/null
kubectl wait --for=condition=Ready pod --all --timeout=300s >/dev/null
sleep 20   # first status reports settle

# CPU nanoseconds and timeslices of every thread of the given processes.
schedstat() {
  local pid
  for pid in "$@"; do cat /proc/"$pid"/task/*/schedstat; done |
    awk '{ns += $1; slices += $3} END {printf "%d %d\n", ns, slices}'
}
monitors=()
for pidfile in "$work"/state/pods/*/monitor.pid; do monitors+=("$(cat "$pidfile")"); done
((${#monitors[@]} == pods)) || { echo "idle.sh: ${#monitors[@]} monitors, not $pods" >&2; exit 1; }
# The monitor launcher, a fork of the agent that forks the monitors, counts
# with them.
launcher=$(pgrep -P "$agent" -x nanolet-launch) || { echo "idle.sh: no monitor launcher" >&2; exit 1; }
monitors+=("$launcher")

read -r agent_ns0 agent_sl0 < <(schedstat "$agent")
read -r mon_ns0 mon_sl0 < <(schedstat "${monitors[@]}")
sleep "$window"
read -r agent_ns1 agent_sl1 < <(schedstat "$agent")
read -r mon_ns1 mon_sl1 < <(schedstat "${monitors[@]}")

scrape_rounds() {
  local path=$1 round i ns0 ns1 _
  for round in 1 2 3 4 5; do
    read -r ns0 _ < <(schedstat "$agent")
    for i in $(seq 1 10); do
      kubectl get --raw "/api/v1/nodes/bench-node/proxy$path" >/dev/null
    done
    read -r ns1 _ < <(schedstat "$agent")
    echo $(((ns1 - ns0) / 10))
  done
}
# The first request of each kind fills the authorization cache.
kubectl get --raw /api/v1/nodes/bench-node/proxy/stats/summary >/dev/null
kubectl get --raw /api/v1/nodes/bench-node/proxy/metrics/resource >/dev/null
summary=$(scrape_rounds /stats/summary | tr '\n' ' ')
resource=$(scrape_rounds /metrics/resource | tr '\n' ' ')

python3 - "$window" "$agent_ns0" "$agent_ns1" "$agent_sl0" "$agent_sl1" \
  "$mon_ns0" "$mon_ns1" "$mon_sl0" "$mon_sl1" "$summary" "$resource" <<'PY'
import statistics, sys
window = float(sys.argv[1])
a0, a1, as0, as1, m0, m1, ms0, ms1 = map(int, sys.argv[2:10])
summary = [int(x) for x in sys.argv[10].split()]
resource = [int(x) for x in sys.argv[11].split()]
agent_cpu = (a1 - a0) / 1e9 / window * 100
monitor_cpu = (m1 - m0) / 1e9 / window * 100
print(f"idle over {window:.0f} s: agent {agent_cpu:.4f} % ({(as1 - as0) / window:.2f} wakeups/s), "
      f"30 monitors and their launcher {monitor_cpu:.4f} % ({(ms1 - ms0) / window:.2f} wakeups/s)")
print(f"per scrape (ms, 5 rounds of 10): summary {[round(x / 1e6, 2) for x in summary]}, "
      f"resource {[round(x / 1e6, 2) for x in resource]}")
print(f"BENCH idle-cpu-30-pods {agent_cpu + monitor_cpu:.4f} %")
print(f"BENCH idle-wakeups-30-pods {(as1 - as0 + ms1 - ms0) / window:.2f}/s")
print(f"BENCH summary-scrape-cpu {statistics.median(summary) / 1e6:.2f} ms")
print(f"BENCH resource-scrape-cpu {statistics.median(resource) / 1e6:.2f} ms")
PY
