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
#   one pull). Loop lag: the worst lag the agent sampled (every 10 ms) while
#   the pull ran, the median over the runs of each run's worst.
#
# Ends with:
#   BENCH pull-vs-skopeo-umoci <ratio>   (nanolet median / peer median)
#   BENCH pull-peak-rss <KiB> KiB
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

# Prints "<pull ms> <worst lag ms> <VmHWM KiB>".
nanolet_run() {
  rm -rf "$work/state" "$work/manifests" "$work/logs"
  mkdir -p "$work/manifests" "$work/no-cni"
  "$nanolet" run --state-dir "$work/state" --static-pod-path "$work/manifests" \
    --pod-logs-dir "$work/logs" --cgroup-root "$cgroup_root" \
    --cni-conf-dir "$work/no-cni" --insecure-registry "$registry" \
    >"$work/agent.log" 2>&1 &
  agent=$!
  cat >"$work/manifests/.pod.tmp" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pull}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: "$image", command: [sleep, "3600"]}]
EOF
  mv "$work/manifests/.pod.tmp" "$work/manifests/pod.yaml"
  local line="" i
  for ((i = 0; i < 1200; i++)); do
    line=$(grep -m1 "pulled $image" "$work/agent.log" || true)
    [[ -n $line ]] && break
    sleep 0.05
  done
  [[ -n $line ]] || { cat "$work/agent.log" >&2; echo "pull.sh: nanolet did not pull" >&2; exit 1; }
  local hwm
  hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$agent/status")
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
  n=$(nanolet_run)
  p=$(peer_run)
  echo "run $r: nanolet ${n%% *} ms (lag, KiB: ${n#* }), skopeo+umoci $p ms" >&2
  echo "$n $p" >>"$work/results"
done

python3 - "$work/results" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
pull, lag, hwm, peer = (statistics.median(c) for c in zip(*rows))
print(f"nanolet pull+unpack median {pull:.0f} ms; skopeo copy + umoci unpack median {peer:.0f} ms")
print(f"nanolet peak RSS {hwm:.0f} KiB (median of runs), worst loop lag {lag:.2f} ms (median of runs' worst; max {max(r[1] for r in rows):.2f})")
print(f"BENCH pull-vs-skopeo-umoci {pull / peer:.2f}")
print(f"BENCH pull-peak-rss {hwm:.0f} KiB")
print(f"BENCH pull-max-loop-lag {lag:.2f} ms")
EOF
