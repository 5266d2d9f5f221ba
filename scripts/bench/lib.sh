# Shared by the benchmarks: removes everything a run made under WORK (pod
# monitors, runc containers under the given runc roots, mounts, the cgroup
# root, the registry), also after a failure. Source it, then call
#   bench_cleanup WORK CGROUP_ROOT RUNC_ROOT...
# Kills the pods an agent left running (monitors, runtime containers, their
# mounts), keeping the rest of WORK: bench_cleanup_pods WORK RUNTIME_ROOT
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
