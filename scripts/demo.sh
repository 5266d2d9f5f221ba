#!/usr/bin/env bash
# The demo: installs what it needs, builds nanolet, starts a loopback
# registry holding a demo image built offline from busybox-static, and runs
# nanolet in the foreground on the bundled manifests (config/manifests).
# Ctrl-C stops it and removes everything it made: pods, containers, mounts,
# cgroups, the registry and the temp dir.
# Usage: scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

if [[ $(id -u) != 0 ]]; then
  echo "demo.sh: nanolet runs containers: run the demo as root" >&2
  exit 1
fi
scripts/install-deps.sh
echo "== building nanolet (release)"
cargo build --release --locked --bin nanolet
nanolet="$PWD/target/release/nanolet"

work="$(mktemp -d /tmp/nanolet-demo.XXXXXX)"
state="$work/state"
cgroup_root="/nanolet-demo-$$"
agent_pid=""

cleanup() {
  trap - EXIT INT TERM
  echo
  echo "== cleaning up"
  if [[ -n $agent_pid ]] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -TERM "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  if [[ -d $state/pods ]]; then
    # The agent leaves pods running when it stops, like the kubelet. Start
    # it once more with no manifests: it adopts the pods and terminates
    # them (grace period, then SIGKILL), then removes all they used.
    rm -f "$work"/manifests/*
    "$nanolet" run --config config/nanolet.yaml --state-dir "$state" \
      --static-pod-path "$work/manifests" --pod-logs-dir "$work/logs" \
      --cgroup-root "$cgroup_root" >>"$work/cleanup.log" 2>&1 &
    local cleaner=$!
    for _ in $(seq 1 300); do
      [[ -z "$(ls -A "$state/pods" 2>/dev/null)" ]] && break
      sleep 0.2
    done
    kill -TERM "$cleaner" 2>/dev/null || true
    wait "$cleaner" 2>/dev/null || true
    if [[ -n "$(ls -A "$state/pods" 2>/dev/null)" ]]; then
      echo "demo.sh: pods were not all removed; see $work/cleanup.log" >&2
      return 1
    fi
  fi
  scripts/registry.sh stop "$work/registry" || true
  # The QoS-level cgroups (kubepods/...) stay after pods go, as upstream;
  # the demo removes its whole cgroup root.
  for hierarchy in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    if [[ -d "$hierarchy${cgroup_root#/}" ]]; then
      find "$hierarchy${cgroup_root#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    fi
  done
  rm -rf "$work"
  echo "== done: nothing of the demo is left"
}
trap cleanup EXIT INT TERM

echo "== starting a registry on loopback"
registry="$(scripts/registry.sh start "$work/registry")"
echo "   $registry"
echo "== building and pushing the demo image (offline, from busybox-static)"
scripts/demo-image.sh "$registry" | sed 's/^/   /'

mkdir -p "$work/manifests"
for manifest in config/manifests/*.yaml; do
  sed "s|@REGISTRY@|$registry|g" "$manifest" >"$work/manifests/$(basename "$manifest")"
done

cat <<EOF

== nanolet runs in the foreground; in another terminal:

   $nanolet pods --state-dir $state
   $nanolet logs -f --state-dir $state default/hello hello
   $nanolet logs --state-dir $state default/hello counter
   $nanolet logs --state-dir $state default/flaky

   Manifests: $work/manifests (edit, add or delete files: pods follow)
   Logs:      $work/logs
   Ctrl-C stops nanolet and removes everything the demo made.

EOF

"$nanolet" run --config config/nanolet.yaml --state-dir "$state" \
  --static-pod-path "$work/manifests" --pod-logs-dir "$work/logs" \
  --cgroup-root "$cgroup_root" --insecure-registry "$registry" &
agent_pid=$!
wait "$agent_pid" || true
