#!/usr/bin/env bash
# Image pull + unpack: nanolet against `skopeo copy` + `umoci unpack` of the
# same multi-layer image from the same loopback registry, in one run.
#
# - The image: busybox plus four layers, two of random bytes (which do not
#   compress) and two of base64 text (which compresses as code and text
#   do), 8 MiB each; built here by build-image.sh, pushed to a loopback
#   docker-registry.
# - nanolet: a running agent (standalone, no pods) is given a pod with the
#   image; the time is the agent's own measure of the pull (manifest request
#   to image recorded, layers verified and unpacked), from its log. Each run
#   starts from an empty image store.
# - peer: `skopeo copy docker://… oci:DIR` then `umoci unpack` of it into a
#   fresh bundle, timed together, from nothing each run.
# - Alternating runs, RUNS each (default 5); medians.
# - Peak RSS: the agent's VmHWM after the pull (its whole life: start-up and
#   one pull). Loop lag: the agent samples it every 10 ms while a pull runs,
#   into its nanolet_event_loop_lag_seconds histogram; the bench reads that
#   from the read-only port just before each pull and just after, and pools
#   every run's samples: the share over 5 ms (the budget: p99 ≤ 5 ms) and
#   the p99 interpolated within its bucket, as Prometheus'
#   histogram_quantile does. Also the median over the runs of each run's
#   worst sample (from the agent's log).
#
# Ends with:
#   BENCH pull-vs-skopeo-umoci <ratio>   (nanolet median / peer median)
#   BENCH pull-peak-rss <KiB> KiB
#   BENCH pull-loop-lag-p99 <ms> ms
#   BENCH pull-loop-lag-over-5ms <percent> %
#   BENCH pull-max-loop-lag <ms> ms
# Usage: scripts/bench/pull.sh [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
runs=${1:-5}

[[ $(id -u) == 0 ]] || { echo "pull.sh: run as root" >&2; exit 1; }
scripts/install-deps.sh
bench_build_agent

work="$(mktemp -d /tmp/nanolet-bench-pull.XXXXXX)"
cgroup_root="/nanolet-bench-pull-$$"
agent=""
stop_agent() {
  if [[ -n $agent ]]; then
    kill "$agent" 2>/dev/null
    wait "$agent" 2>/dev/null || true
    agent=""
  fi
  bench_cleanup_pods "$work" "$work/state/runtime"
}
cleanup() {
  set +e
  stop_agent
  bench_cleanup "$work" "$cgroup_root" "$work/state/runtime"
}
trap cleanup EXIT

registry="$(scripts/registry.sh start "$work/registry")"
layers=()
for i in 0 1; do
  mkdir -p "$work/layer-random-$i" "$work/layer-text-$i"
  head -c 8M /dev/urandom >"$work/layer-random-$i/random-$i"
  head -c 6M /dev/urandom | base64 >"$work/layer-text-$i/text-$i"
  for kind in random text; do
    tar -C "$work/layer-$kind-$i" -cf "$work/layer-$kind-$i.tar" .
    layers+=(--layer "$work/layer-$kind-$i.tar")
  done
done
scripts/build-image.sh "$work/image" --tag 1 "${layers[@]}" >/dev/null
scripts/push-image.sh "$work/image" 1 "$registry" bench/layers:1 >/dev/null
image="$registry/bench/layers:1"
compressed=$(skopeo inspect --raw --tls-verify=false "docker://$image" |
  python3 -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["layers"]))')
echo "image: $image, 5 layers, $((compressed / 1024)) KiB compressed" >&2

now_ms() { date +%s%3N; }

peer_run() {
  rm -rf "$work/oci" "$work/bundle"
  local t0 t1
  t0=$(now_ms)
  skopeo copy -q --src-tls-verify=false "docker://$image" "oci:$work/oci:1" >/dev/null
  umoci unpack --image "$work/oci:1" "$work/bundle" >/dev/null
  t1=$(now_ms)
  echo $((t1 - t0))
}

read_only_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# The loop-lag histogram's buckets, one "le count" line each.
lag_buckets() {
  curl -sf "http://127.0.0.1:$read_only_port/metrics" |
    sed -n 's/^nanolet_event_loop_lag_seconds_bucket{le="\([^"]*\)"} \([0-9]*\)$/\1 \2/p'
}

# Prints "<pull ms> <worst lag ms> <VmHWM KiB>"; the lag histogram's
# buckets before the pull and after go to $work/lag-before.$1, lag-after.$1.
nanolet_run() {
  rm -rf "$work/state" "$work/manifests" "$work/logs"
  mkdir -p "$work/manifests" "$work/no-cni"
  "$nanolet" run --state-dir "$work/state" --device-plugins-dir "$work/device-plugins" --static-pod-path "$work/manifests" \
    --pod-logs-dir "$work/logs" --cgroup-root "$cgroup_root" \
    --cni-conf-dir "$work/no-cni" --insecure-registry "$registry" \
    --address 127.0.0.1 --read-only-port "$read_only_port" \
    >"$work/agent.log" 2>&1 &
  agent=$!
  local i
  for ((i = 0; i < 200; i++)); do
    lag_buckets >"$work/lag-before.$1" 2>/dev/null && break
    sleep 0.05
  done
  [[ -s $work/lag-before.$1 ]] || { cat "$work/agent.log" >&2; echo "pull.sh: no /metrics on the read-only port" >&2; exit 1; }
  cat >"$work/manifests/.pod.tmp" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pull}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: "$image", command: [sleep, "3600"]}]
EOF
  mv "$work/manifests/.pod.tmp" "$work/manifests/pod.yaml"
  local line=""
  for ((i = 0; i < 1200; i++)); do
    line=$(grep -m1 "pulled $image" "$work/agent.log" || true)
    [[ -n $line ]] && break
    sleep 0.05
  done
  [[ -n $line ]] || { cat "$work/agent.log" >&2; echo "pull.sh: nanolet did not pull" >&2; exit 1; }
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$agent/status")
  lag_buckets >"$work/lag-after.$1"
  # Stopped once its container runs: an agent stopped between `runc
  # create` and `runc start` would leave a container half made for the
  # cleanup to race with.
  for ((i = 0; i < 200; i++)); do
    runc --root "$work/state/runtime" list 2>/dev/null | grep -q running && break
    sleep 0.05
  done
  stop_agent
  python3 - "$line" "$hwm" <<'EOF'
import re, sys
line, hwm = sys.argv[1], sys.argv[2]
def ms(text):
    value, unit = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text).groups()
    return float(value) * {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1, "s": 1000}[unit]
m = re.search(r"in (\S+); event loop lag at most (\S+)$", line)
print(f"{ms(m.group(1)):.0f} {ms(m.group(2)):.2f} {hwm}")
EOF
}

: >"$work/results"
for ((r = 0; r < runs; r++)); do
  n=$(nanolet_run "$r")
  p=$(peer_run)
  echo "run $r: nanolet ${n%% *} ms (lag, KiB: ${n#* }), skopeo+umoci $p ms" >&2
  echo "$n $p" >>"$work/results"
done

python3 - "$work/results" "$work" "$runs" <<'EOF'
import math, statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
pull, lag, hwm, peer = (statistics.median(c) for c in zip(*rows))

def buckets(path):
    return {float(le): int(n) for le, n in (l.split() for l in open(path) if l.strip())}

# The pulls' samples, pooled: cumulative counts per upper bound (seconds).
pooled = {}
for r in range(int(sys.argv[3])):
    before, after = buckets(f"{sys.argv[2]}/lag-before.{r}"), buckets(f"{sys.argv[2]}/lag-after.{r}")
    for le, n in after.items():
        pooled[le] = pooled.get(le, 0) + n - before.get(le, 0)
bounds = sorted(pooled)
total = pooled[math.inf]
over_5ms = 100 * (total - pooled[0.005]) / total
# histogram_quantile: linear within the bucket holding the rank.
rank, lower, below, p99 = 0.99 * total, 0.0, 0, None
for le in bounds:
    if pooled[le] >= rank:
        p99 = lower if le == math.inf else lower + (le - lower) * (rank - below) / max(pooled[le] - below, 1)
        break
    lower, below = le, pooled[le]
print(f"loop lag during the pulls: {total} samples pooled, {over_5ms:.1f} % over 5 ms, p99 {p99 * 1000:.2f} ms (in its bucket)")
print(f"nanolet pull+unpack median {pull:.0f} ms; skopeo copy + umoci unpack median {peer:.0f} ms")
print(f"nanolet peak RSS {hwm:.0f} KiB (median of runs), worst loop lag {lag:.2f} ms (median of runs' worst; max {max(r[1] for r in rows):.2f})")
print(f"BENCH pull-vs-skopeo-umoci {pull / peer:.2f}")
print(f"BENCH pull-peak-rss {hwm:.0f} KiB")
print(f"BENCH pull-loop-lag-p99 {p99 * 1000:.2f} ms")
print(f"BENCH pull-loop-lag-over-5ms {over_5ms:.1f} %")
print(f"BENCH pull-max-loop-lag {lag:.2f} ms")
EOF
