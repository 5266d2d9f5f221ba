#!/usr/bin/env bash
# Runs a command as root on an ARM kernel: a qemu-system-aarch64 VM
# (software emulation: times mean nothing, page counts are real) booting
# Debian's arm64 kernel into a Debian arm64 system made by debootstrap,
# pure cgroup v2, with runc, crun, the CNI plugins, iptables and systemd;
# with --arch armhf, a qemu-system-arm VM (a Cortex-A15) booting Debian's
# armmp-lpae kernel into a Debian armhf system, the same otherwise.
# The system is built once, as an ext4 disk image cached under
# target/arm-vm (target/arm-vm-armhf); each boot writes to a throwaway snapshot of it, so
# nothing a job does lasts. The project dir is shared read-only at its
# host path, and the VM reaches the host's loopback at 10.0.2.2 (qemu's
# user networking). Prints the command's output and exits with its exit
# code.
#
# Usage: scripts/arm-vm.sh [--arch arm64|armhf] [--mem MIB] [--cpus N] [--timeout SECONDS] [--systemd]
#                          [--env NAME=VALUE]... -- CMD [ARG]...
#        scripts/arm-vm.sh [--arch arm64|armhf] --build    only build the system (or find it cached)
# --systemd boots systemd as PID 1 and runs the command as a unit once the
# system is up; otherwise the command runs as soon as the root is mounted,
# as in scripts/vm.sh. CMD runs from the current directory, which must be
# under the project dir. A VM still running after the timeout (default
# 1500 s) is stopped, and the exit code is 124.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/vm-lib.sh
. "$repo/scripts/vm-lib.sh"

mem=2048
cpus=2
limit=1500
systemd=false
build_only=false
debarch=arm64
envs=()
while (($# > 0)); do
  case $1 in
    --arch) debarch=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --systemd) systemd=true; shift ;;
    --build) build_only=true; shift ;;
    --) shift; break ;;
    *) echo "arm-vm.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
$build_only || (($# > 0)) || { echo "usage: scripts/arm-vm.sh [options] -- CMD..." >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "arm-vm.sh: run as root (debootstrap)" >&2; exit 1; }
# What differs between the two: qemu's machine, Debian's kernel, and the
# ELF header that binfmt_misc hands to qemu-user for the second stage.
case $debarch in
  arm64)
    qemu=qemu-system-aarch64 machine=(-M virt -cpu max) kernel_package=linux-image-arm64
    cache="$repo/target/arm-vm" user_qemu=qemu-aarch64
    elf='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
    ;;
  armhf)
    # highmem=off: a 32-bit kernel reaches no RAM or PCI window above 4 GiB.
    qemu=qemu-system-arm machine=(-M virt,highmem=off -cpu cortex-a15) kernel_package=linux-image-armmp-lpae
    cache="$repo/target/arm-vm-armhf" user_qemu=qemu-arm
    elf='\x7fELF\x01\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x28\x00'
    ;;
  *) echo "arm-vm.sh: --arch is arm64 or armhf, not $debarch" >&2; exit 2 ;;
esac
for c in "$qemu" debootstrap mkfs.ext4; do
  command -v "$c" >/dev/null || { echo "arm-vm.sh: $c missing (scripts/install-deps.sh)" >&2; exit 1; }
done
if ! $build_only; then
  case $PWD/ in
    "$repo"/*) ;;
    *) echo "arm-vm.sh: run it from inside $repo" >&2; exit 2 ;;
  esac
fi

image="$cache/system.img"
mkdir -p "$cache/debs"

# The kernel Debian's metapackage names; its modules go into the system
# (modprobe there finds overlay, veth, bridge, iptables' own).
if [[ ! -s $cache/kernel.version ]]; then
  package=$("$repo/scripts/apt-foreign.sh" "$debarch" "$cache/debs" --depends-of "$kernel_package" | grep '^linux-image-' | head -n 1)
  [[ -n $package ]] || { echo "arm-vm.sh: no kernel package behind $kernel_package" >&2; exit 1; }
  echo "${package#linux-image-}" >"$cache/kernel.version"
fi
version=$(cat "$cache/kernel.version")
kernel="$cache/vmlinuz-$version"

# The initramfs: Debian's static busybox of the system's architecture, the modules that reach
# the disk and the shared dirs, and the init below.
initrd="$cache/initrd.cpio.gz"
make_initrd() {
  local modules_dir=$1 root="$cache/initramfs" deb
  rm -rf "$root" "$cache/busybox"
  mkdir -p "$root"/{bin,dev,proc,sys,newroot,mnt/scratch,modules}
  deb=$("$repo/scripts/apt-foreign.sh" "$debarch" "$cache/debs" busybox-static)
  dpkg-deb -x "$deb" "$cache/busybox"
  cp "$cache/busybox/bin/busybox" "$root/bin/busybox"
  rm -rf "$cache/busybox"
  initramfs_modules "$root" "$version" "$modules_dir" virtio_pci virtio_blk ext4 9pnet_virtio 9p virtio_net
  cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
while read -r m; do insmod "/modules/$m" || echo "arm-vm: insmod $m failed"; done </modules/order
p9=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o $p9 scratch /mnt/scratch
r=/newroot
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.5; done
mount -t ext4 /dev/vda $r
project=$(cat /mnt/scratch/project)
mkdir -p "$r$project" "$r/vm-scratch"
mount -t 9p -o $p9,ro project "$r$project"
# Not under /run: systemd mounts a tmpfs there.
mount --bind /mnt/scratch "$r/vm-scratch"
if [ -f /mnt/scratch/systemd ]; then
  cp /mnt/scratch/vm-job.service "$r/etc/systemd/system/"
  mkdir -p "$r/etc/systemd/system/multi-user.target.wants"
  ln -sf ../vm-job.service "$r/etc/systemd/system/multi-user.target.wants/vm-job.service"
  exec switch_root $r /lib/systemd/systemd
fi
. /guest-mounts.sh
guest_mounts $r
exec switch_root $r /bin/bash -c '. /vm-scratch/network; bash /vm-scratch/job; echo $? >/vm-scratch/rc; sync; /bin/busybox poweroff -f'
INIT
  cp "$repo/scripts/vm-guest-mounts.sh" "$root/guest-mounts.sh"
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 >"$initrd.tmp")
  mv "$initrd.tmp" "$initrd"
  rm -rf "$root"
}

# debootstrap's second stage (the packages' configuration) on the system
# dir $1, its ARM programs run by qemu-user through a binfmt_misc
# registration of a user namespace of its own (a kernel of 6.7 or later
# gives each one its own binfmt_misc): the host's binfmt_misc stays as it
# is. The namespace maps every ID to itself, so that the packages' owners
# are the system's; new PID and network namespaces let it mount /proc and
# /sys in the chroot.
second_stage() {
  local dir=$1 sync
  sync=$(mktemp -d /tmp/nanolet-arm-vm-userns.XXXXXX)
  # shellcheck disable=SC2016
  container=lxc unshare --user --mount --propagation private --pid --fork --net -- sh -c '
    while [ ! -f "$1/mapped" ]; do sleep 0.1; done
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    printf "%s" "$2" >/proc/sys/fs/binfmt_misc/register
    exec chroot "$3" /debootstrap/debootstrap --second-stage' sh "$sync" \
    ":$user_qemu:M::$elf:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:$(command -v "$user_qemu-static"):F" \
    "$dir" >>"$cache/debootstrap.log" 2>&1 &
  local pid=$! inner=""
  # unshare --fork: its child is in the namespaces already; until its IDs
  # are mapped it waits (as nobody, it can read the world-readable dir).
  chmod 0755 "$sync"
  while [[ -z $inner ]]; do
    sleep 0.1
    inner=$(pgrep -P "$pid" | head -n 1 || true)
  done
  echo "0 0 65536" >"/proc/$inner/uid_map"
  echo "0 0 65536" >"/proc/$inner/gid_map"
  touch "$sync/mapped"
  local rc=0
  wait "$pid" || rc=$?
  rm -rf "$sync"
  return $rc
}

# Boots the VM on a throwaway snapshot of the disk image $1 with the
# scratch dir $2; returns the job's exit code.
boot() {
  local disk=$1 scratch=$2 started=$SECONDS
  timeout --kill-after=10 "$limit" "$qemu" "${machine[@]}" -smp "$cpus" -m "$mem" \
    -accel tcg,thread=multi -nographic -no-reboot \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyAMA0 quiet loglevel=1 panic=-1 rdinit=/init" \
    -drive file="$disk",if=virtio,format=raw,snapshot=on \
    -nic user,model=virtio-net-pci \
    -fsdev local,id=project,path="$repo",security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=project,mount_tag=project \
    -fsdev local,id=scratch,path="$scratch",security_model=none,multidevs=remap \
    -device virtio-9p-pci,fsdev=scratch,mount_tag=scratch </dev/null |
    tr -d '\r' | grep --line-buffered -v '^\[ *[0-9.]*\] reboot: Power down$' || true
  job_exit_code arm-vm.sh "$scratch" "$started" "$limit"
}

# The system: debootstrap's two stages, the kernel and its modules put in,
# then an ext4 image of it. Made as system.img.new and renamed once
# complete, so a half-made one is never used.
if [[ ! -s $image ]]; then
  staged="$cache/rootfs.new"
  rm -rf "$staged" "$image.new"
  packages=systemd,systemd-sysv,udev,kmod,procps,iproute2,iptables,runc,crun,containernetworking-plugins,ca-certificates,busybox-static,jq
  echo "arm-vm.sh: building the Debian $debarch system (once; minutes)" >&2
  debootstrap --arch="$debarch" --variant=minbase --foreign --include="$packages" \
    bookworm "$staged" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # Unpacked aside and copied in: the package's /lib would replace the
  # system's /lib -> usr/lib link with a directory.
  deb=$("$repo/scripts/apt-foreign.sh" "$debarch" "$cache/debs" "linux-image-$version")
  rm -rf "$cache/kernel"
  dpkg-deb -x "$deb" "$cache/kernel"
  cp "$cache/kernel/boot/vmlinuz-$version" "$kernel"
  mkdir -p "$staged/usr/lib/modules"
  cp -a "$cache/kernel/lib/modules/." "$staged/usr/lib/modules/"
  rm -rf "$cache/kernel"
  depmod -b "$staged" "$version"
  make_initrd "$staged"
  echo nanolet-arm >"$staged/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 nanolet-arm\n' >"$staged/etc/hosts"
  # No login on the console; the job's output goes there.
  mkdir -p "$staged/etc/systemd/system"
  ln -sf /dev/null "$staged/etc/systemd/system/serial-getty@ttyAMA0.service"
  ln -sf /dev/null "$staged/etc/systemd/system/getty@tty1.service"
  echo "arm-vm.sh: configuring the system's packages under qemu-user (once; minutes)" >&2
  second_stage "$staged" || { tail -30 "$cache/debootstrap.log" >&2; exit 1; }
  truncate -s 4G "$image.new"
  mkfs.ext4 -q -F -L nanolet-arm -d "$staged" "$image.new"
  rm -rf "$staged"
  mv "$image.new" "$image"
fi
[[ -s $kernel ]] || { echo "arm-vm.sh: $kernel missing: remove $image to rebuild" >&2; exit 1; }
# An init older than this script: made again from the kernel package's
# modules.
if [[ ! -s $initrd || $0 -nt $initrd || $repo/scripts/vm-guest-mounts.sh -nt $initrd || $repo/scripts/vm-lib.sh -nt $initrd ]]; then
  deb=$("$repo/scripts/apt-foreign.sh" "$debarch" "$cache/debs" "linux-image-$version")
  rm -rf "$cache/kernel"
  dpkg-deb -x "$deb" "$cache/kernel"
  depmod -b "$cache/kernel" "$version"
  make_initrd "$cache/kernel"
  rm -rf "$cache/kernel"
fi
if $build_only; then
  echo "arm-vm.sh: $image, kernel $version"
  exit 0
fi

scratch=$(mktemp -d /tmp/nanolet-arm-vm.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
echo "$repo" >"$scratch/project"
# The user network: the VM's address, and the host's loopback as 10.0.2.2.
# (eth0 without udev; under systemd, udev names it after its PCI slot.)
cat >"$scratch/network" <<'NET'
ip link set lo up
nic=$(ls /sys/class/net | grep -v '^lo$' | head -n 1)
ip link set "$nic" up
ip addr add 10.0.2.15/24 dev "$nic"
ip route add default via 10.0.2.2
NET
write_job "$scratch/job" "$@"
if $systemd; then
  touch "$scratch/systemd"
  cat >"$scratch/vm-job.service" <<'UNIT'
[Unit]
Description=the arm-vm.sh job
After=multi-user.target
[Service]
Type=oneshot
StandardOutput=journal+console
StandardError=journal+console
ExecStart=/bin/bash -c '. /vm-scratch/network; bash /vm-scratch/job; echo $? >/vm-scratch/rc; sync'
# Whatever happened, the VM goes down (an rc missing says it failed), at
# once: what the job left running (pods outlive their agent) would hold a
# clean shutdown for its 90 s, and the disk is a throwaway snapshot.
ExecStopPost=/bin/systemctl poweroff --force --force
UNIT
fi
boot "$image" "$scratch"
