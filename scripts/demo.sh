#!/usr/bin/env bash
# The demo: installs what it needs, builds nanolet, starts a loopback
# registry holding a demo image built offline from busybox-static, and runs
# nanolet in the foreground on the bundled manifests (config/manifests).
# Ctrl-C stops it and removes everything it made: pods, containers, mounts,
# cgroups, the registry and the temp dir.
#
# With --cluster it runs cluster mode instead: the test API server on
# loopback, nanolet joined to it as node "demo-node", and `kubectl apply` of
# config/cluster/web.yaml; it prints the KUBECONFIG to use kubectl with.
# Usage: scripts/demo.sh [--cluster]
set -euo pipefail
cluster=""
case "${1:-}" in
  --cluster) cluster=1 ;;
  "") ;;
  *) echo "usage: $0 [--cluster]" >&2; exit 2 ;;
esac
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
if [[ -n $cluster ]]; then
  cargo build --release --locked -p test-apiserver
fi
apiserver="$PWD/target/release/test-apiserver"

work="$(mktemp -d /tmp/nanolet-demo.XXXXXX)"
state="$work/state"
cgroup_root="/nanolet-demo-$$"
agent_pid=""
apiserver_pid=""

cleanup() {
  trap - EXIT TERM
  # A second Ctrl-C must not leave half the demo behind.
  trap '' INT
  echo
  echo "== cleaning up"
  if [[ -n $apiserver_pid ]] && [[ -n $agent_pid ]] && kill -0 "$agent_pid" 2>/dev/null; then
    # Graceful deletion through the API, as a user would; the node stops
    # the containers and deletes the pods.
    KUBECONFIG="$work/api/admin.kubeconfig" kubectl delete pods --all --timeout=60s >/dev/null 2>&1 || true
  fi
  if [[ -n $agent_pid ]] && kill -0 "$agent_pid" 2>/dev/null; then
    kill -TERM "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  if [[ -d $state/pods ]]; then
    # The agent leaves pods running when it stops, like the kubelet. Start
    # it once more with no manifests: it adopts the pods and terminates
    # them (grace period, then SIGKILL), then removes all they used.
    rm -f "$work"/manifests/*
    "$nanolet" run --config config/nanolet.yaml --state-dir "$state" --device-plugins-dir "$work/device-plugins" \
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
  if [[ -n $apiserver_pid ]]; then
    kill -TERM "$apiserver_pid" 2>/dev/null || true
    wait "$apiserver_pid" 2>/dev/null || true
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
if [[ -n $cluster ]]; then
  echo "== starting the test API server on loopback"
  mkdir -p "$work/api"
  # Their own sessions: Ctrl-C reaches only this script, whose cleanup
  # then deletes the pods through the API while both still run.
  setsid "$apiserver" --listen 127.0.0.1:0 --dir "$work/api" >"$work/api/stdout" 2>"$work/api/log" &
  apiserver_pid=$!
  for _ in $(seq 1 100); do
    grep -q ready "$work/api/stdout" 2>/dev/null && break
    sleep 0.1
  done
  grep -q ready "$work/api/stdout" || { echo "demo.sh: the test API server did not start" >&2; exit 1; }
  "$apiserver" node-kubeconfig demo-node --dir "$work/api" >"$work/node.kubeconfig"
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  setsid "$nanolet" run --config config/nanolet.yaml --state-dir "$state" --device-plugins-dir "$work/device-plugins" \
    --static-pod-path "$work/manifests" --pod-logs-dir "$work/logs" \
    --cgroup-root "$cgroup_root" --insecure-registry "$registry" \
    --kubeconfig "$work/node.kubeconfig" --hostname-override demo-node \
    --node-ip 127.0.0.1 --address 127.0.0.1 --port "$port" \
    --client-ca-file "$work/api/ca.crt" 2>"$work/nanolet.log" &
  agent_pid=$!
  export KUBECONFIG="$work/api/admin.kubeconfig"
  for _ in $(seq 1 100); do
    kubectl get node demo-node >/dev/null 2>&1 && break
    sleep 0.2
  done
  sed "s|@REGISTRY@|$registry|g" config/cluster/web.yaml | kubectl apply -f - | sed 's/^/   /'
  kubectl wait --for=condition=Ready pod/web --timeout=60s >/dev/null || true
  kubectl get nodes -o wide | sed 's/^/   /'
  kubectl get pods -o wide | sed 's/^/   /'
  cat <<EOF

== cluster mode runs; in another terminal:

   export KUBECONFIG=$KUBECONFIG
   kubectl get nodes -o wide
   kubectl get pods -o wide
   kubectl describe pod web
   kubectl logs -f web
   kubectl apply -f your-pod.yaml     (pods land on demo-node)
   kubectl delete pod web

   nanolet's log: $work/nanolet.log
   Ctrl-C stops everything and removes what the demo made.

EOF
  wait "$agent_pid" || true
  exit 0
fi
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

"$nanolet" run --config config/nanolet.yaml --state-dir "$state" --device-plugins-dir "$work/device-plugins" \
  --static-pod-path "$work/manifests" --pod-logs-dir "$work/logs" \
  --cgroup-root "$cgroup_root" --insecure-registry "$registry" &
agent_pid=$!
wait "$agent_pid" || true
