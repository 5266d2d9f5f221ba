#!/usr/bin/env bash
# Pod start latency and agent memory, nanolet next to bare runc in one run.
#
# - nanolet: median time from a manifest written (image present) to all its
#   containers running, over 20 one-container pods started one at a time;
#   "running" is read from the pod's status file, polled every 2 ms.
# - peer: median time of `runc run -d` of the same image's rootfs with the
#   same command, over 20 containers.
# - the agent's RSS idle (no pods) and with 10 pods (agent only; the pods'
#   monitors are reported separately).
#
# Ends with:
#   BENCH pod-start-vs-runc <ratio>      (nanolet median / runc median)
#   BENCH rss-idle <KiB> KiB
#   BENCH rss-10-pods <KiB> KiB
# Usage: scripts/bench/pod-start.sh [PODS]      (default 20)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/bench/lib.sh
export PATH="$HOME/.cargo/bin:$PATH"
pods=${1:-20}

[[ $(id -u) == 0 ]] || { echo "pod-start.sh: run as root" >&2; exit 1; }
scripts/install-deps.sh
cargo build --release --locked --bin nanolet >&2
nanolet="$PWD/target/release/nanolet"

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
for i in $(seq 1 "$pods"); do
  start=$(date +%s%N)
  runc --root "$work/runc" run -d --bundle "$work/bundle" "bench-$i" </dev/null >/dev/null 2>&1
  end=$(date +%s%N)
  runc_times+=($(((end - start) / 1000)))
  runc --root "$work/runc" delete --force "bench-$i" >/dev/null
done

# --- nanolet ------------------------------------------------------------------
mkdir -p "$work/manifests"
"$nanolet" run --state-dir "$work/state" --static-pod-path "$work/manifests" \
  --pod-logs-dir "$work/logs" --cgroup-root "$cgroup_root" \
  --insecure-registry "$registry" >"$work/agent.log" 2>&1 &
agent=$!

python3 - "$work" "$image" "$agent" "$pods" "${runc_times[@]}" <<'EOF'
import glob, json, os, statistics, sys, time

work, image, agent, pods = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
runc_us = [int(x) for x in sys.argv[5:]]
manifests = os.path.join(work, "manifests")

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def monitors_kib():
    total = 0
    for path in glob.glob(os.path.join(work, "state/pods/*/monitor.pid")):
        try:
            total += rss_kib(int(open(path).read()))
        except (OSError, ValueError):
            pass
    return total

def running(name):
    for path in glob.glob(os.path.join(work, "state/pods/*/status.json")):
        try:
            record = json.load(open(path))
        except (OSError, ValueError):
            continue
        if record.get("name") != name:
            continue
        statuses = record["status"].get("containerStatuses") or []
        return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)
    return False

def write_pod(name):
    text = (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n"
            f"  terminationGracePeriodSeconds: 0\n"
            f"  containers:\n  - name: c\n    image: {image}\n    command: [sleep, '3600']\n")
    tmp = os.path.join(manifests, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(manifests, f"{name}.yaml"))

def wait_until(check, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"timed out; see {work}/agent.log")
        time.sleep(0.002)

# Warm-up: pulls the image, so that every measured pod has it present.
write_pod("warmup")
wait_until(lambda: running("warmup"))
os.remove(os.path.join(manifests, "warmup.yaml"))
wait_until(lambda: not glob.glob(os.path.join(work, "state/pods/*")))
time.sleep(2)
rss_idle = rss_kib(agent)

nanolet_us = []
rss_10 = monitors_10 = 0
for i in range(pods):
    name = f"bench-{i}"
    start = time.monotonic()
    write_pod(name)
    wait_until(lambda: running(name))
    nanolet_us.append(int((time.monotonic() - start) * 1e6))
    if i == 9:
        time.sleep(2)
        rss_10, monitors_10 = rss_kib(agent), monitors_kib()

n_med = statistics.median(nanolet_us) / 1000
r_med = statistics.median(runc_us) / 1000
print(f"pods: {pods}")
print(f"nanolet pod start (manifest -> running): median {n_med:.1f} ms, "
      f"min {min(nanolet_us)/1000:.1f} ms, max {max(nanolet_us)/1000:.1f} ms")
print(f"runc run -d of the same rootfs:         median {r_med:.1f} ms, "
      f"min {min(runc_us)/1000:.1f} ms, max {max(runc_us)/1000:.1f} ms")
print(f"agent RSS idle: {rss_idle} KiB; with 10 pods: {rss_10} KiB "
      f"(+ {monitors_10} KiB in 10 pod monitors)")
print(f"BENCH pod-start-vs-runc {n_med / r_med:.2f}")
print(f"BENCH rss-idle {rss_idle} KiB")
print(f"BENCH rss-10-pods {rss_10} KiB")
EOF
