#!/usr/bin/env bash
# The uplink of an idle node: bytes on the wire between nanolet and the
# test API server, as a link billed by the byte counts them. Two iptables
# rules on loopback count the IP packets to and from the API server's port
# (TLS records, TCP and IP headers included; nothing else uses that port
# during the window: kubectl is not run in it).
#
# An idle window (WINDOW seconds after the pods run and their first
# reports settle) with 5 pods, then with 30; each projected to a day. The
# service account tokens of the pods are renewed every ~48 min, which a
# window shorter than that misses: they are added from the TokenRequests
# the pods' start made (their bodies, from the API server's request record,
# plus the window's per-request overhead: headers, TLS, TCP). The bytes of
# one Lease renewal are its bodies plus that same overhead.
# There is no peer here: no upstream kubelet runs on these machines.
#
# Ends with:
#   BENCH idle-uplink-bytes-per-day <MB> MB           (5 pods; budget 5 MB)
#   BENCH idle-uplink-bytes-per-day-30-pods <MB> MB
#   BENCH lease-renewal-bytes <bytes> B
# Usage: scripts/bench/uplink.sh [WINDOW_SECONDS] [RUNS]   (default 300, 3;
# the figures are the medians of the runs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
window=${1:-300}
runs=${2:-3}

bench_cluster_prepare uplink.sh
rules=()
uplink_cleanup() {
  local rule
  for rule in "${rules[@]}"; do
    # shellcheck disable=SC2086
    iptables -D OUTPUT $rule 2>/dev/null
  done
  bench_cluster_cleanup
}
trap uplink_cleanup EXIT

wire_bytes() {
  iptables -L OUTPUT -v -x -n | awk -v tag="nanolet-uplink-$$" '$0 ~ tag {sum += $2} END {print sum + 0}'
}

pods() {
  local from=$1 to=$2 i
  for i in $(seq "$from" "$to"); do
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p%s}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: %s\n    command: [sleep, "100000"]\n---\n' \
      "$i" "$registry/bench/busybox:1"
  done | kubectl apply -f - >/dev/null
  kubectl wait --for=condition=Ready pod --all --timeout=300s >/dev/null
  sleep 20   # first status reports settle
}

# One idle window: prints the bytes on the wire; the API server's request
# record before and in it go to $run_dir.
measure() {
  local label=$1 before after
  curl -s "$admin/requests" >"$run_dir/start-$label.json"
  curl -s -X DELETE "$admin/requests" >/dev/null
  before=$(wire_bytes)
  sleep "$window"
  after=$(wire_bytes)
  curl -s "$admin/requests" >"$run_dir/window-$label.json"
  echo "$((after - before))"
}

results=()
for run in $(seq 1 "$runs"); do
  run_dir="$work/run$run"
  bench_join_cluster "$run_dir" "bench-node" "$nanolet" "$apiserver" "$registry" "$cgroup_root"
  port=$(sed -n 's#.*server: https://127.0.0.1:\([0-9]*\).*#\1#p' "$run_dir/node.kubeconfig" | head -1)
  for dir in --dport --sport; do
    rule="-o lo -p tcp $dir $port -m comment --comment nanolet-uplink-$$"
    # shellcheck disable=SC2086
    iptables -I OUTPUT $rule -j RETURN
    rules+=("$rule -j RETURN")
  done
  pods 1 5
  five=$(measure five)
  pods 6 30
  thirty=$(measure thirty)
  results+=("$(python3 - "$run_dir" "$window" "$five" "$thirty" <<'PY'
import json, sys
work, window, five, thirty = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
NODE = "system:node:bench-node"
def load(name):
    with open(f"{work}/{name}.json") as f:
        return [r for r in json.load(f) if r["user"] == NODE]
def body(r):
    return r["request_bytes"] + r["response_bytes"]
out = []
tokens_per_day = 86400 / (0.8 * 3607)
for label, wire, pods in (("five", five, 5), ("thirty", thirty, 30)):
    window_requests = load(f"window-{label}")
    overhead = (wire - sum(body(r) for r in window_requests)) / max(1, len(window_requests))
    started = [r for r in load(f"start-{label}") if r["path"].endswith("/token")]
    token = (sum(body(r) for r in started) / len(started) if started else 0) + overhead
    leases = [r for r in window_requests if "/leases/" in r["path"] and r["method"] in ("PUT", "PATCH")]
    lease = (sum(body(r) for r in leases) / len(leases) if leases else 0) + overhead
    per_day = wire * 86400 / window + pods * tokens_per_day * token
    kinds = {}
    for r in window_requests:
        path = r["path"].split("?")[0]
        watch = "watch=" in r["path"]
        key = (r["method"], ("watch " if watch else "") + "/".join(path.split("/")[:-1] if not watch else path.split("/")))
        count, size = kinds.get(key, (0, 0))
        kinds[key] = (count + 1, size + body(r))
    for (method, path), (count, size) in sorted(kinds.items()):
        print(f"  {label}: {count} x {method} {path}: {size} B of bodies", file=sys.stderr)
    print(f"  {label}: {wire} B on the wire, {overhead:.0f} B per request beyond its bodies", file=sys.stderr)
    out.append(f"{per_day:.0f} {lease:.0f} {len(window_requests)} {wire}")
print(" ".join(out))
PY
)")
  echo "run $run: ${results[-1]}  (bytes/day 5 pods, lease bytes, requests, window bytes; then 30 pods)" >&2
  kill -9 "$agent" 2>/dev/null; wait "$agent" 2>/dev/null || true
  kill "$api" 2>/dev/null; wait "$api" 2>/dev/null || true
  bench_cleanup_pods "$run_dir" "$run_dir/state/runtime"
  agent=""; api=""
  for rule in "${rules[@]}"; do
    # shellcheck disable=SC2086
    iptables -D OUTPUT $rule 2>/dev/null
  done
  rules=()
done

python3 - "${results[@]}" <<'PY'
import statistics, sys
runs = [list(map(float, r.split())) for r in sys.argv[1:]]
five = statistics.median(r[0] for r in runs)
lease = statistics.median(r[1] for r in runs)
thirty = statistics.median(r[4] for r in runs)
print(f"BENCH idle-uplink-bytes-per-day {five / 1e6:.2f} MB")
print(f"BENCH idle-uplink-bytes-per-day-30-pods {thirty / 1e6:.2f} MB")
print(f"BENCH lease-renewal-bytes {lease:.0f} B")
PY
