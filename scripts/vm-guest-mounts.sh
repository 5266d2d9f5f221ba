# Sourced by the init (busybox sh) of the initramfs of scripts/vm.sh and
# scripts/arm-vm.sh: the kernel filesystems a container host needs, under
# the root about to be switched to, and every cgroup v2 controller for the
# jobs' subtrees, as systemd sets a v2 host up.
# Usage (in the init): . /guest-mounts.sh; guest_mounts ROOT
guest_mounts() {
  r=$1
  mount -t proc proc "$r/proc"
  mount -t sysfs sys "$r/sys"
  mount -t securityfs securityfs "$r/sys/kernel/security"
  mount -t devtmpfs dev "$r/dev"
  mkdir -p "$r/dev/pts" "$r/dev/shm"
  ln -sf /proc/self/fd "$r/dev/fd"
  ln -sf /proc/self/fd/0 "$r/dev/stdin"
  ln -sf /proc/self/fd/1 "$r/dev/stdout"
  ln -sf /proc/self/fd/2 "$r/dev/stderr"
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts"
  mount -t tmpfs tmpfs "$r/dev/shm"
  mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup"
  for d in tmp run var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$r/$d"; done
  for c in $(cat "$r/sys/fs/cgroup/cgroup.controllers"); do
    echo "+$c" >"$r/sys/fs/cgroup/cgroup.subtree_control"
  done
}
