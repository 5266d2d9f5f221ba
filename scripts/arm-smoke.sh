#!/usr/bin/env bash
# The standalone smoke test, run inside an ARM VM by scripts/test-arm.sh
# (arm64) or scripts/test-armv7.sh (armhf): the agent pulls busybox from a
# multi-platform index (the manifest of this machine's platform must be
# the one pulled) and runs a pod; its
# logs; `kill -9` of the agent and a new agent adopting the container (same
# ID, no restart); the manifest deleted and nothing of the pod left
# (containers, mounts, cgroups, monitors, pod dirs).
# Usage: scripts/arm-smoke.sh BINARY REGISTRY MANIFEST_DIGEST RUNTIME [MACHINE]
#   MACHINE: what `uname -m` must say (default aarch64)
set -euo pipefail
binary=$1 registry=$2 arm_digest=$3 runtime=$4 machine=${5:-aarch64}

work=/var/lib/nanolet-smoke
state=$work/state manifests=$work/manifests logs=$work/logs
mkdir -p "$manifests" "$logs"
agent_pid=""
job="arm-smoke ($runtime)"
show_failure() {
  echo "--- agent log ---"
  tail -40 "$work/agent.log"
}
# shellcheck source=scripts/arm-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/arm-lib.sh"
start_agent() {
  "$binary" run --static-pod-path "$manifests" --state-dir "$state" --pod-logs-dir "$logs" \
    --runtime "$runtime" --insecure-registry "$registry" --healthz-port 0 >>"$work/agent.log" 2>&1 &
  agent_pid=$!
}

echo "arm-smoke: $(uname -m), kernel $(uname -r), $("$runtime" --version | head -n 1), cgroup $(stat -fc %T /sys/fs/cgroup)"
[[ $(uname -m) == "$machine" ]] || fail "not an $machine machine"
start_agent
cat >"$manifests/smoke.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: default}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: $registry/test/busybox:1
    command: [sh, -c, 'echo hello from \$(uname -m); exec sleep 3600']
EOF
wait_for "the pod to run" 600 running smoke
grep -rqF "$arm_digest" "$state/images/" || fail "the manifest $arm_digest of this platform was not the one pulled"
wait_for "the pod's log" 60 bash -c "'$binary' logs --state-dir '$state' default/smoke | grep -q 'hello from $machine'"
echo "arm-smoke: the pod runs and logs: $("$binary" logs --state-dir "$state" default/smoke)"

# kill -9 of the agent: the next one adopts the container.
before=$(container_id smoke)
kill -9 "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
start_agent
adopted() {
  grep -q "adopting pod default/smoke" "$work/agent.log" && running smoke && [[ $(container_id smoke) == "$before" ]]
}
wait_for "the container to be adopted" 300 adopted
[[ $(record smoke | jq -r '.status.containerStatuses[0].restartCount') == 0 ]] || fail "the container restarted"
echo "arm-smoke: adopted $before after kill -9"

# Deleted: nothing of the pod is left.
rm "$manifests/smoke.yaml"
gone() { ! compgen -G "$state/pods/*" >/dev/null; }
wait_for "the pod to be removed" 300 gone
left=$("$runtime" --root "$state/runtime" list -q 2>/dev/null || true)
[[ -z $left ]] || fail "containers left: $left"
if grep -qF " $state/" /proc/self/mountinfo; then
  fail "mounts left: $(grep -F " $state/" /proc/self/mountinfo)"
fi
if compgen -G "/sys/fs/cgroup/kubepods/*pod*" >/dev/null || compgen -G "/sys/fs/cgroup/kubepods/*/pod*" >/dev/null; then
  fail "pod cgroups left: $(ls -d /sys/fs/cgroup/kubepods/*pod* /sys/fs/cgroup/kubepods/*/pod* 2>/dev/null)"
fi
if pgrep -f "monitor --pod-dir $state" >/dev/null; then
  fail "monitors left: $(pgrep -af "monitor --pod-dir $state")"
fi
kill -TERM "$agent_pid"
wait "$agent_pid" 2>/dev/null || true
echo "arm-smoke: passed with $runtime"
