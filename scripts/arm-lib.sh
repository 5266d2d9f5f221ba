# Helpers of the jobs the ARM VM runs (scripts/arm-smoke.sh,
# scripts/arm-install.sh), which source it. The job sets $job (its name in
# messages) and $state (the agent's state dir), and defines show_failure
# (what to print when it fails).

fail() {
  echo "$job: FAIL: $*" >&2
  show_failure >&2 || true
  exit 1
}

# Polls `$@` once a second for up to $2 seconds (emulated: everything is
# slow); fails naming $1.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || fail "timed out after ${seconds}s waiting for $what"
    sleep 1
  done
}

# The agent's status record of pod $1.
record() {
  cat "$state"/pods/*/status.json 2>/dev/null | jq -s --arg name "$1" 'map(select(.name == $name)) | .[0] // empty'
}

running() {
  [[ $(record "$1" | jq -r '.status.containerStatuses[0].state.running != null') == true ]]
}

container_id() {
  record "$1" | jq -r '.status.containerStatuses[0].containerID'
}
