#!/usr/bin/env bash
# Run by scripts/test-arm.sh inside the ARM VM booted with systemd: the
# release tarball installed on a clean Debian arm64 system by
# scripts/install.sh, the unit starting the agent, a static pod running on
# the installed CNI network, a second install changing nothing, and a
# restart of the unit (as an upgrade does) keeping the pod's container.
# Usage: scripts/arm-install.sh TARBALL REGISTRY
set -euo pipefail
tarball=$1 registry=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

job=arm-install
state=/var/lib/nanolet
show_failure() {
  journalctl -u nanolet --no-pager | tail -40
}
# shellcheck source=scripts/arm-lib.sh
. "$here/arm-lib.sh"
main_pid() {
  systemctl show -p MainPID --value nanolet.service
}

[[ $(cat /proc/1/comm) == systemd ]] || fail "PID 1 is not systemd"
[[ ! -e /usr/local/bin/nanolet ]] || fail "not a clean system"
# Copied out of the read-only share, as a download would be.
mkdir -p /root/release
cp "$tarball" "$(dirname "$tarball")/SHA256SUMS" /root/release/
sh "$here/install.sh" "/root/release/$(basename "$tarball")"
wait_for "the unit to be active" 120 systemctl is-active --quiet nanolet.service
if journalctl -q --no-pager -b | grep -F "nanolet.service:" | grep -q "ignoring"; then
  fail "systemd ignored lines of the unit: $(journalctl -q --no-pager -b | grep -F "nanolet.service:")"
fi
/usr/local/bin/nanolet check --config /etc/nanolet/nanolet.yaml || fail "nanolet check"

# The board's own setting: the test registry is plain HTTP.
sed -i "s|^insecureRegistries: \[\]|insecureRegistries: [\"$registry\"]|" /etc/nanolet/nanolet.yaml
grep -q "$registry" /etc/nanolet/nanolet.yaml || fail "the example configuration has no insecureRegistries line"
systemctl restart nanolet.service
cat >/etc/nanolet/manifests/smoke.yaml <<EOF
apiVersion: v1
kind: Pod
metadata: {name: smoke, namespace: default}
spec:
  containers:
  - name: main
    image: $registry/test/busybox:1
    command: [sh, -c, 'echo hello from the installed agent; exec sleep 3600']
EOF
wait_for "the pod to run" 600 running smoke
ip=$(record smoke | jq -r '.status.podIP // empty')
[[ $ip == 10.88.* ]] || fail "the pod is not on the installed CNI network: podIP '$ip'"
echo "arm-install: the installed agent runs the pod at $ip"

# Installed already: nothing changes, the agent is not restarted.
pid=$(main_pid)
out=$(sh "$here/install.sh" "/root/release/$(basename "$tarball")")
grep -q "nothing changed" <<<"$out" || fail "a second install: $out"
[[ $(main_pid) == "$pid" ]] || fail "a second install restarted the agent"

# A restart of the unit, as an upgrade does: the container lives on.
container=$(container_id smoke)
systemctl restart nanolet.service
new_pid=$(main_pid)
[[ $new_pid != "$pid" && $new_pid != 0 ]] || fail "the unit did not restart"
# The new agent's own word that it took the pod over, and the same container.
adopted() {
  journalctl -q --no-pager "_PID=$new_pid" | grep -q "adopting pod default/smoke" &&
    running smoke && [[ $(container_id smoke) == "$container" ]]
}
wait_for "the pod adopted after the restart" 300 adopted
[[ $(record smoke | jq -r '.status.containerStatuses[0].restartCount') == 0 ]] || fail "the container restarted"
echo "arm-install: passed (the unit's restart kept $container)"
