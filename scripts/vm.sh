#!/usr/bin/env bash
# Runs a command as root in a pure cgroup v2 machine: a qemu VM (software
# emulation; this host's KVM cannot boot stock kernels) with Debian's kernel,
# this host's / shared read-only over 9p as its root, tmpfs on /tmp, /run and
# /var/tmp, cgroup2 with every controller on /sys/fs/cgroup, loopback up.
# The host's cgroup mounts are never touched. Prints the command's output
# and exits with its exit code.
#
# Usage: scripts/vm.sh [--mem MIB] [--cpus N] [--timeout SECONDS] [--env NAME=VALUE]...
#                      [--kernel-arg ARG]... -- CMD [ARG]...
# CMD runs from the current directory (which must be under / on this host).
# A VM still running after the timeout (default 1500 s; a boot once hung
# with the CPUs busy and no output) is stopped, and the exit code is 124.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vm-lib.sh
. "$repo/scripts/vm-lib.sh"

mem=2048
cpus=2
limit=1500
envs=()
kernel_args=()
while (($# > 0)); do
  case $1 in
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --kernel-arg) kernel_args+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "vm.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
(($# > 0)) || { echo "usage: scripts/vm.sh [--mem MIB] [--cpus N] [--env K=V]... -- CMD..." >&2; exit 2; }

kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1 || true)
[[ -n $kernel ]] || { echo "vm.sh: no kernel in /boot (install linux-image-amd64)" >&2; exit 1; }
version=${kernel#/boot/vmlinuz-}
command -v qemu-system-x86_64 >/dev/null || { echo "vm.sh: qemu-system-x86_64 missing" >&2; exit 1; }

# The initramfs is built once per kernel and busybox, under target/.
cache="$repo/target/vm/$version"
initrd="$cache/initrd.cpio.gz"
if [[ ! -s $initrd || /bin/busybox -nt $initrd || $0 -nt $initrd || $repo/scripts/vm-guest-mounts.sh -nt $initrd || $repo/scripts/vm-lib.sh -nt $initrd ]]; then
  rm -rf "$cache/root"
  mkdir -p "$cache/root"/{bin,dev,proc,sys,mnt/root,mnt/scratch,modules}
  cp /bin/busybox "$cache/root/bin/busybox"
  initramfs_modules "$cache/root" "$version" / virtio_pci 9pnet_virtio 9p overlay
  cat >"$cache/root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
while read -r m; do insmod "/modules/$m" || echo "vm: insmod $m failed"; done </modules/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /mnt/root
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 scratch /mnt/scratch
r=/mnt/root
. /guest-mounts.sh
guest_mounts $r
mkdir -p $r/run/vm-scratch && mount --bind /mnt/scratch $r/run/vm-scratch
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
# switch_root, not chroot: the shared root must be the root of the mount
# namespace, or runtimes that join a container's namespaces (exec) land in
# the initramfs.
exec switch_root $r /bin/bash -c 'bash /run/vm-scratch/job; echo $? >/run/vm-scratch/rc; sync; /bin/busybox poweroff -f'
INIT
  cp "$repo/scripts/vm-guest-mounts.sh" "$cache/root/guest-mounts.sh"
  chmod +x "$cache/root/init"
  (cd "$cache/root" && find . | cpio -o -H newc --quiet | gzip -1 >"$initrd.tmp")
  mv "$initrd.tmp" "$initrd"
fi

scratch=$(mktemp -d /tmp/nanolet-vm.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
write_job "$scratch/job" "$@"

bios=()
[[ -f /usr/share/qemu/qboot.rom ]] && bios=(-bios /usr/share/qemu/qboot.rom)
# The console carries the job's output; the kernel stays quiet.
started=$SECONDS
timeout --kill-after=10 "$limit" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp "$cpus" -m "$mem" \
  "${bios[@]}" -nographic -no-reboot -nic none \
  -kernel "$kernel" -initrd "$initrd" \
  -append "console=ttyS0 quiet loglevel=1 panic=-1 rdinit=/init systemd.unified_cgroup_hierarchy=1${kernel_args[*]:+ ${kernel_args[*]}}" \
  -fsdev local,id=root,path=/,security_model=none,readonly=on,multidevs=remap \
  -device virtio-9p-pci,fsdev=root,mount_tag=hostroot \
  -fsdev local,id=scratch,path="$scratch",security_model=none,multidevs=remap \
  -device virtio-9p-pci,fsdev=scratch,mount_tag=scratch </dev/null |
  tr -d '\r' | grep --line-buffered -v '^\[ *[0-9.]*\] reboot: Power down$' || true

job_exit_code vm.sh "$scratch" "$started" "$limit"
