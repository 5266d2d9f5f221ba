#!/usr/bin/env bash
# The part of the suite that needs a pure cgroup v2 machine, run in the qemu
# VM of scripts/vm.sh: the cgroup v2 tests with crun and with runc, then
# standalone tests under crun (which refuses this hybrid host). The VM
# emulates its CPU, so only a selection of the standalone suite runs there;
# all of it runs on the host with runc. Then one test in a second VM, booted
# without PSI.
#
# Usage: scripts/test-vm.sh [--repeat N] [--only] [TEST...]
#   TEST...     standalone tests to run under crun besides the selection
#   --only      run just the tests these filters match, in both binaries,
#               with crun and runc (cgroup v2 tests as well as
#               standalone ones)
#   --repeat N  run it all N times in a row in one boot, stopping at the
#               first failure: a flaky test shows before it lands
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

repeat=1
only=false
while (($# > 0)); do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --only) only=true; shift ;;
    *) break ;;
  esac
done
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "test-vm.sh: --repeat takes a count" >&2; exit 2; }
if $only && (($# == 0)); then
  echo "test-vm.sh: --only needs test names" >&2
  exit 2
fi

binaries=$(cargo test --locked --no-run --test cgroup_v2 --test standalone --message-format=json 2>/dev/null |
  jq -r 'select(.executable != null and .target.kind[0] == "test") | .executable')
cgroup_v2=$(grep '/cgroup_v2-' <<<"$binaries")
standalone=$(grep '/standalone-' <<<"$binaries")
[[ -x $cgroup_v2 && -x $standalone ]] || { echo "test-vm.sh: test binaries not found" >&2; exit 1; }

# What differs between the runtimes or needs cgroup v2 (probes, init
# containers and hooks, runtime-agnostic, run on the host only: the suite's
# 30 minutes).
selection=(a_container_over_its_memory_limit_is_oom_killed
  security_contexts_and_volume_options
  kill9_of_the_agent_adopts_running_containers
  shared_process_namespace
  the_kubepods_cgroup_is_capped_at_node_allocatable
  the_runtime_execs_with_pipes_and_on_a_terminal
  a_containers_stdin_and_terminal_are_held_by_its_monitor_for_attach
  "$@")

without_psi=without_psi_pods_at_node_allocatable_wake_eviction_at_once
if $only; then
  names="$*"
  run="for rt in crun runc; do
  echo \"== cgroup v2 VM: \$rt: $names\"
  NANOLET_TEST_RUNTIME=\$rt $cgroup_v2 --include-ignored --test-threads=2 $names
  NANOLET_TEST_RUNTIME=\$rt $standalone --test-threads=2 $names
done"
else
  run="for rt in crun runc; do
  echo \"== cgroup v2 VM: cgroup tests with \$rt\"
  NANOLET_TEST_RUNTIME=\$rt $cgroup_v2 --ignored --test-threads=2 --skip $without_psi
done
echo '== cgroup v2 VM: standalone tests with crun'
NANOLET_TEST_RUNTIME=crun $standalone --test-threads=2 ${selection[*]}"
fi
job="set -e
for round in \$(seq $repeat); do
  [ $repeat = 1 ] || echo \"== cgroup v2 VM: round \$round of $repeat\"
  $run
done"

# A named test that matched nothing would pass every round: count what ran.
out=$(mktemp /tmp/nanolet-test-vm.XXXXXX)
trap 'rm -f "$out"' EXIT
scripts/vm.sh --mem 3072 --timeout $((900 * repeat)) -- sh -c "$job" | tee "$out"
if $only; then
  ran=$(sed 's/\x1b\[[0-9;]*m//g' "$out" | grep -oE 'test result: ok\. [0-9]+ passed' |
    awk '{s += $4} END {print s + 0}')
  ((ran >= repeat)) || { echo "test-vm.sh: no test matched: $*" >&2; exit 1; }
  exit 0
fi
# exec skips the EXIT trap.
rm -f "$out"
# A kernel without PSI, as Raspberry Pi kernels boot by default.
echo "== cgroup v2 VM booted with psi=0: $without_psi"
exec scripts/vm.sh --mem 3072 --timeout $((300 * repeat)) --kernel-arg psi=0 -- \
  sh -c "set -e; for round in \$(seq $repeat); do NANOLET_TEST_RUNTIME=crun $cgroup_v2 --ignored --exact $without_psi; done"
