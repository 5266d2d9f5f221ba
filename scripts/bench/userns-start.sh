#!/usr/bin/env bash
# What a user namespace costs a pod's start: nanolet starting PODS pods with
# `hostUsers: false` and PODS without, alternating, in one agent (runc,
# image present, no network), each timed from its manifest written to its
# container running (the pod's status file, polled every 2 ms). The peer is
# the same pod on the host's user namespace: the difference is the
# `nanolet userns` helper and the ID-mapped mounts of the layers and of the
# pod's /etc files.
#
# Ends with:
#   BENCH pod-start-userns <ms> ms                (median, hostUsers: false)
#   BENCH pod-start-userns-vs-host-users <ratio>  (that median / the other's)
# Usage: scripts/bench/userns-start.sh [PODS]     (default 20)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
pods=${1:-20}

[[ $(id -u) == 0 ]] || { echo "userns-start.sh: run as root" >&2; exit 1; }
scripts/install-deps.sh
bench_build_agent

work="$(mktemp -d /tmp/nanolet-bench.XXXXXX)"
# runc reaches a user namespace's rootfs through it (mktemp makes it 0700).
chmod 711 "$work"
cgroup_root="/nanolet-bench-$$"
agent=""
cleanup() {
  set +e
  [[ -n $agent ]] && kill -9 "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  bench_cleanup_pods "$work" "$work/state/runtime"
  bench_cleanup "$work" "$cgroup_root" "$work/state/runtime"
}
trap cleanup EXIT

registry="$(scripts/registry.sh start "$work/registry")"
scripts/build-image.sh "$work/image" --tag 1 >/dev/null
scripts/push-image.sh "$work/image" 1 "$registry" bench/busybox:1 >/dev/null
mkdir -p "$work/manifests" "$work/no-cni"
"$nanolet" run --state-dir "$work/state" --device-plugins-dir "$work/device-plugins" --static-pod-path "$work/manifests" \
  --pod-logs-dir "$work/logs" --cgroup-root "$cgroup_root" --runtime runc \
  --cni-conf-dir "$work/no-cni" --insecure-registry "$registry" >"$work/agent.log" 2>&1 &
agent=$!

python3 - "$work" "$registry/bench/busybox:1" "$pods" <<'PY'
import importlib.util, os, statistics, sys, time

spec = importlib.util.spec_from_file_location("driver", "scripts/bench/pod-start-driver.py")
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
work, image, pods = sys.argv[1], sys.argv[2], int(sys.argv[3])


def start_ms(name, own_users):
    tmp = os.path.join(work, "manifests", f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(driver.pod_text(name, image, "  hostUsers: false\n" if own_users else ""))
    start = time.monotonic()
    os.rename(tmp, os.path.join(work, "manifests", f"{name}.yaml"))
    driver.wait_until(lambda: driver.pod_running(work, name), work)
    return (time.monotonic() - start) * 1000


# Warm-up: pulls the image, and makes one pod of each kind.
start_ms("warmup-0", False)
start_ms("warmup-1", True)
times = {False: [], True: []}
for i in range(pods):
    for own_users in (False, True):
        times[own_users].append(start_ms(f"p{i}-{int(own_users)}", own_users))
medians = {k: statistics.median(v) for k, v in times.items()}
for own_users, label in ((True, "hostUsers: false"), (False, "hostUsers: true ")):
    print(f"{label}  median {medians[own_users]:6.1f} ms  "
          f"p95 {driver.p95(times[own_users]):6.1f} ms  ({pods} pods)")
print(f"BENCH pod-start-userns {medians[True]:.1f} ms")
print(f"BENCH pod-start-userns-vs-host-users {medians[True] / medians[False]:.2f}")
PY
