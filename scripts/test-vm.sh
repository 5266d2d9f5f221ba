#!/usr/bin/env bash
# The part of the suite that needs a pure cgroup v2 machine, run in the qemu
# VM of scripts/vm.sh: the cgroup v2 tests with crun and with runc, then
# standalone tests under crun (which refuses this hybrid host). The VM
# emulates its CPU, so only a selection of the standalone suite runs there;
# all of it runs on the host with runc. Then one test in a second VM, booted
# without PSI.
# Usage: scripts/test-vm.sh [extra libtest filters for the standalone run]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

binaries=$(cargo test --locked --no-run --test cgroup_v2 --test standalone --message-format=json 2>/dev/null |
  jq -r 'select(.executable != null and .target.kind[0] == "test") | .executable')
cgroup_v2=$(grep '/cgroup_v2-' <<<"$binaries")
standalone=$(grep '/standalone-' <<<"$binaries")
[[ -x $cgroup_v2 && -x $standalone ]] || { echo "test-vm.sh: test binaries not found" >&2; exit 1; }

selection=(a_container_over_its_memory_limit_is_oom_killed
  probes_gate_readiness_and_restart_unhealthy_containers
  init_containers_run_in_order
  hooks_termination_messages
  security_contexts_and_volume_options
  kill9_of_the_agent_adopts_running_containers
  shared_process_namespace
  the_kubepods_cgroup_is_capped_at_node_allocatable
  the_runtime_execs_with_pipes_and_on_a_terminal
  a_containers_stdin_and_terminal_are_held_by_its_monitor_for_attach
  "$@")

without_psi=without_psi_pods_at_node_allocatable_wake_eviction_at_once
job="set -e
for rt in crun runc; do
  echo \"== cgroup v2 VM: cgroup tests with \$rt\"
  NANOLET_TEST_RUNTIME=\$rt $cgroup_v2 --ignored --test-threads=2 --skip $without_psi
done
echo '== cgroup v2 VM: standalone tests with crun'
NANOLET_TEST_RUNTIME=crun $standalone --test-threads=2 ${selection[*]}"
scripts/vm.sh --mem 3072 --timeout 900 -- sh -c "$job"
# A kernel without PSI, as Raspberry Pi kernels boot by default.
echo "== cgroup v2 VM booted with psi=0: $without_psi"
exec scripts/vm.sh --mem 3072 --timeout 300 --kernel-arg psi=0 -- \
  env NANOLET_TEST_RUNTIME=crun "$cgroup_v2" --ignored --exact "$without_psi"
