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
