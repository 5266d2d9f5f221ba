# Shared by the benchmarks: removes everything a run made under WORK (pod
# monitors, runc containers under the given runc roots, mounts, the cgroup
# root, the registry), also after a failure. Source it, then call
#   bench_cleanup WORK CGROUP_ROOT RUNC_ROOT...
# Kills the pods an agent left running (monitors, runtime containers, their
# mounts), keeping the rest of WORK: bench_cleanup_pods WORK RUNTIME_ROOT
# For the cluster benchmarks: builds nanolet and the test API server
# (release), makes a work dir and a registry holding bench/busybox:1, and
# removes all of it at exit: bench_cluster_prepare SCRIPT_NAME sets
# nanolet, apiserver, work, cgroup_root and registry.
# Starts the test API server and an agent joined to it as NODE:
#   bench_join_cluster WORK NODE NANOLET APISERVER REGISTRY CGROUP_ROOT
# sets api, agent (pids), admin (the API server's admin URL) and port (the
# kubelet API's), and exports KUBECONFIG (the admin's).
# Builds the agent as it ships: a static musl binary, here for the host's
# architecture (a glibc build would count glibc's own pages as the agent's
# and use another allocator): bench_build_agent sets nanolet.
# The peer of the pod-start benchmark, which the suite itself does not
# need. (Debian's podman also drops a CNI config into /etc/cni/net.d;
# nanolet runs without one.) bench_install_podman
bench_build_agent() {
  local target
  target="$(uname -m)-unknown-linux-musl"
  cargo build --release --locked --bin nanolet --target "$target" >&2
  nanolet="$PWD/target/$target/release/nanolet"
}

bench_install_podman() {
  if ! command -v podman >/dev/null || ! command -v catatonit >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman catatonit >/dev/null
  fi
}

bench_cleanup_pods() {
  local work=$1 root=$2 runtime id pidfile
  for pidfile in "$work"/state/pods/*/monitor.pid; do
    [[ -f $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  for runtime in runc crun; do
    command -v "$runtime" >/dev/null || continue
    for id in $("$runtime" --root "$root" list -q 2>/dev/null); do
      "$runtime" --root "$root" delete --force "$id" >/dev/null 2>&1
    done
  done
  grep -o " $work/state[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
  return 0
}

bench_cleanup() {
  local work=$1 cgroup_root=$2
  shift 2
  set +e
  for pidfile in "$work"/state/pods/*/monitor.pid; do
    [[ -f $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  for root in "$@"; do
    for id in $(runc --root "$root" list -q 2>/dev/null); do
      runc --root "$root" delete --force "$id" >/dev/null 2>&1
    done
  done
  grep -o " $work[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
  for hierarchy in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [[ -d "$hierarchy${cgroup_root#/}" ]] && find "$hierarchy${cgroup_root#/}" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  scripts/registry.sh stop "$work/registry" >/dev/null 2>&1
  rm -rf "$work"
}

bench_join_cluster() {
  local work=$1 node=$2 nanolet=$3 apiserver=$4 registry=$5 cgroup_root=$6
  mkdir -p "$work/api"
  "$apiserver" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --dir "$work/api" \
    >"$work/api/stdout" 2>"$work/api/log" &
  api=$!
  for _ in $(seq 1 100); do grep -q ready "$work/api/stdout" 2>/dev/null && break; sleep 0.1; done
  admin="$(cat "$work/api/admin")"
  "$apiserver" node-kubeconfig "$node" --dir "$work/api" >"$work/node.kubeconfig"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  "$nanolet" run --state-dir "$work/state" --device-plugins-dir "$work/device-plugins" --pod-logs-dir "$work/logs" \
    --cgroup-root "$cgroup_root" --insecure-registry "$registry" \
    --kubeconfig "$work/node.kubeconfig" --hostname-override "$node" \
    --node-ip 127.0.0.1 --address 127.0.0.1 --port "$port" --healthz-port 0 \
    --client-ca-file "$work/api/ca.crt" 2>"$work/nanolet.log" &
  agent=$!
  export KUBECONFIG="$work/api/admin.kubeconfig"
  for _ in $(seq 1 100); do kubectl get node "$node" >/dev/null 2>&1 && break; sleep 0.2; done
}

bench_cluster_prepare() {
  [[ $(id -u) == 0 ]] || { echo "$1: run as root" >&2; exit 1; }
  scripts/install-deps.sh
  bench_build_agent
  cargo build --release --locked -p test-apiserver >&2
  apiserver="$PWD/target/release/test-apiserver"
  work="$(mktemp -d /tmp/nanolet-bench.XXXXXX)"
  cgroup_root="/nanolet-bench-$$"
  agent=""
  api=""
  trap bench_cluster_cleanup EXIT
  registry="$(scripts/registry.sh start "$work/registry")"
  scripts/build-image.sh "$work/image" --tag 1 >/dev/null
  scripts/push-image.sh "$work/image" 1 "$registry" bench/busybox:1 >/dev/null
}

bench_cluster_cleanup() {
  set +e
  [[ -n $agent ]] && kill -9 "$agent" 2>/dev/null && wait "$agent" 2>/dev/null
  [[ -n $api ]] && kill "$api" 2>/dev/null && wait "$api" 2>/dev/null
  bench_cleanup "$work" "$cgroup_root" "$work/state/runtime"
}
