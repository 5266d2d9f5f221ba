#!/usr/bin/env bash
# Pod start latency and memory: nanolet next to `podman kube play` of the
# same pod (same OCI runtime, image present, no network for either) and to
# bare `runc run -d`, in one run.
#
# - nanolet: time from a manifest written to all its containers running
#   (read from the pod's status file, polled every 2 ms), PODS one-container
#   pods started one after the other and left running; median and p95.
# - podman: `podman kube play --network none` of the same pod, which
#   returns once its containers run; PODS pods, left running; median, p95.
# - runc: `runc run -d` of the same image's rootfs, 20 containers.
# - memory: the agent, its monitor launcher and its pod monitors at 10 and 30 pods, against
#   podman's conmon processes (podman has no daemon) at the same counts, as
#   PSS (shared pages of the one binary count once; RSS printed beside).
# Each runtime this host can run is measured: runc here; crun only on a pure
# cgroup v2 host (it refuses hybrid ones like these development machines).
# The cgroup v2 VM of scripts/vm.sh will not do: it has no systemd, and
# with the cgroupfs manager on cgroup v2 podman 4.3 gives each pod's cgroup
# a device filter that allows nothing, so `kube play` pods cannot start.
# The agent measured is the static musl build that ships.
#
# Ends with (R is crun where available, else runc):
#   BENCH pod-start-vs-podman <ratio>    (nanolet median / podman median, runtime R)
#   BENCH memory-30-pods <KiB> KiB       (agent + launcher + monitors, 30 pods, PSS)
#   BENCH pod-start-vs-runc <ratio>      (nanolet median / bare runc median)
#   BENCH rss-idle <KiB> KiB             (agent, no pods)
# Usage: scripts/bench/pod-start.sh [PODS]      (default 30, at least 30)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
pods=${1:-30}
((pods >= 30)) || { echo "pod-start.sh: at least 30 pods (memory at 30)" >&2; exit 2; }

[[ $(id -u) == 0 ]] || { echo "pod-start.sh: run as root" >&2; exit 1; }
scripts/install-deps.sh
bench_install_podman
bench_build_agent

work="$(mktemp -d /tmp/nanolet-bench.XXXXXX)"
cgroup_root="/nanolet-bench-$$"
agent=""
cleanup() {
  set +e
  [[ -n $agent ]] && kill -9 "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  bench_cleanup "$work" "$cgroup_root" "$work/state/runtime" "$work/runc"
}
trap cleanup EXIT

registry="$(scripts/registry.sh start "$work/registry")"
image_dir="$work/image"
scripts/build-image.sh "$image_dir" --tag 1 >/dev/null
scripts/push-image.sh "$image_dir" 1 "$registry" bench/busybox:1 >/dev/null
image="$registry/bench/busybox:1"

# --- peer: bare runc on the same rootfs -------------------------------------
umoci unpack --image "$image_dir:1" "$work/bundle" >/dev/null
python3 - "$work/bundle/config.json" <<'EOF'
import json, sys
path = sys.argv[1]
spec = json.load(open(path))
spec["process"]["args"] = ["sleep", "3600"]
spec["process"]["terminal"] = False
spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
json.dump(spec, open(path, "w"))
EOF
runc_times=()
for i in $(seq 1 20); do
  start=$(date +%s%N)
  runc --root "$work/runc" run -d --bundle "$work/bundle" "bench-$i" </dev/null >/dev/null 2>&1
  end=$(date +%s%N)
  runc_times+=($(((end - start) / 1000)))
  runc --root "$work/runc" delete --force "bench-$i" >/dev/null
done

# --- podman, with its own storage under the work dir --------------------------
# Podman 4.3's defaults ask for more nofile/nproc than this sandbox's hard
# limits allow. It has no daemon; its pods go with the work dir.
printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n' >"$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
podman_args=(--root "$work/podman/root" --runroot "$work/podman/run" --tmpdir "$work/podman/tmp")
podman_cleanup() {
  podman "${podman_args[@]}" pod rm -a -f -t 0 >/dev/null 2>&1
  podman "${podman_args[@]}" rmi -a -f >/dev/null 2>&1
  # Its parent cgroups stay behind; only empty ones go.
  find /sys/fs/cgroup/*/libpod_parent /sys/fs/cgroup/libpod_parent -depth -type d \
    -exec rmdir {} + 2>/dev/null || true
}
cleanup() {
  set +e
  [[ -n $agent ]] && kill -9 "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  podman_cleanup
  bench_cleanup "$work" "$cgroup_root" "$work/state/runtime" "$work/runc"
}

# crun refuses hybrid cgroup hosts such as these development machines.
runtimes=(runc)
if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && command -v crun >/dev/null; then
  runtimes=(crun runc)
fi

for runtime in "${runtimes[@]}"; do
  rm -rf "$work/state" "$work/logs" "$work/manifests"
  mkdir -p "$work/manifests" "$work/no-cni"
  # No CNI network: podman runs with --network none, the same for both.
  "$nanolet" run --state-dir "$work/state" --device-plugins-dir "$work/device-plugins" --static-pod-path "$work/manifests" \
    --pod-logs-dir "$work/logs" --cgroup-root "$cgroup_root" --runtime "$runtime" \
    --cni-conf-dir "$work/no-cni" --insecure-registry "$registry" \
    >"$work/agent-$runtime.log" 2>&1 &
  agent=$!
  python3 scripts/bench/pod-start-driver.py "$work" "$image" "$agent" "$pods" "$runtime" \
    "${podman_args[@]}" >>"$work/results.jsonl"
  kill "$agent" 2>/dev/null
  wait "$agent" 2>/dev/null || true
  agent=""
  # The agent leaves its pods running when it stops: remove them.
  bench_cleanup_pods "$work" "$work/state/runtime"
  podman_cleanup
done

python3 scripts/bench/pod-start-driver.py --report "$work/results.jsonl" "${runc_times[@]}"
