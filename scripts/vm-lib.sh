# Sourced by scripts/vm.sh and scripts/arm-vm.sh, which build an
# initramfs for their VM.

# Copies into ROOT/modules the kernel modules MODULE... of kernel VERSION
# need, with their dependencies, in the order modprobe would load them,
# named in ROOT/modules/order for the init's insmod loop. BASEDIR is the
# dir holding lib/modules ("/" for this host's).
initramfs_modules() {
  local root=$1 version=$2 basedir=$3 m path
  shift 3
  local modules=()
  for m in "$@"; do
    while read -r _ path _; do
      [[ " ${modules[*]} " == *" $path "* ]] || modules+=("$path")
    done < <(modprobe --show-depends -d "$basedir" -S "$version" "$m" | grep '^insmod')
  done
  mkdir -p "$root/modules"
  : >"$root/modules/order"
  for path in "${modules[@]}"; do
    cp "$path" "$root/modules/"
    basename "$path" >>"$root/modules/order"
  done
}

# Writes the job script FILE: from the current directory, the exports
# named in the array `envs` (NAME=VALUE each), then CMD ARG...
write_job() {
  local file=$1 e
  shift
  {
    echo "cd $(printf '%q' "$PWD") || exit 125"
    echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root NANOLET_IN_VM=1"
    for e in "${envs[@]}"; do echo "export $(printf '%q' "$e")"; done
    printf '%q ' "$@"
    echo
  } >"$file"
}

# After the VM NAME has ended: the job's exit code from SCRATCH/rc; 124
# when the VM was stopped at its time limit (started at STARTED, SECONDS
# of LIMIT); 1 when it ended without one.
job_exit_code() {
  local name=$1 scratch=$2 started=$3 limit=$4
  if [[ ! -s $scratch/rc ]]; then
    if ((SECONDS - started >= limit)); then
      echo "$name: the VM ran past ${limit} s and was stopped" >&2
      return 124
    fi
    echo "$name: the VM ended without the job's exit code" >&2
    return 1
  fi
  return "$(cat "$scratch/rc")"
}
