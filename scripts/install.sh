#!/bin/sh
# Installs a release tarball of scripts/release.sh on a board, as root:
#   /usr/local/bin/nanolet                  the binary (replaced in one rename)
#   /etc/systemd/system/nanolet.service     the unit
#   /etc/nanolet/nanolet.yaml               the example configuration, if there is none
#   /etc/nanolet/manifests/                 static pods
#   /etc/cni/net.d/10-nanolet.conflist      if no CNI configuration is there
# then enables and starts the service, or restarts it if the binary or
# the unit changed: the unit's KillMode=process keeps the pods running, and
# the new agent adopts them. Idempotent: a second run changes nothing.
# Refuses a tarball whose SHA-256 is not the one in the SHA256SUMS file
# beside it (or --sums FILE), and one for another architecture; nothing
# is written before both are checked.
#
# Usage: scripts/install.sh [--root DIR] [--sums FILE] [--no-start] TARBALL
#   --root DIR   install under DIR (an image of a board's root); no
#                systemctl, no architecture check
#   --no-start   enable the service but do not start or restart it
#
# POSIX sh and coreutils only: a board has no bash necessarily.
set -eu

root=
sums=
start=true
tarball=
while [ $# -gt 0 ]; do
  case $1 in
    --root) root=${2:?--root needs a directory}; shift 2 ;;
    --sums) sums=${2:?--sums needs a file}; shift 2 ;;
    --no-start) start=false; shift ;;
    -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    *) [ -z "$tarball" ] || { echo "install.sh: one tarball only" >&2; exit 2; }
      tarball=$1; shift ;;
  esac
done
[ -n "$tarball" ] || { echo "usage: install.sh [--root DIR] [--sums FILE] [--no-start] TARBALL" >&2; exit 2; }
[ -f "$tarball" ] || { echo "install.sh: $tarball: no such file" >&2; exit 1; }
[ -n "$sums" ] || sums=$(dirname "$tarball")/SHA256SUMS
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
  echo "install.sh: run as root" >&2
  exit 1
fi

# The checksum first: nothing of an unchecked tarball is read.
name=$(basename "$tarball")
[ -f "$sums" ] || { echo "install.sh: $sums: no checksum file; refusing $name" >&2; exit 1; }
expected=$(awk -v n="$name" '$2 == n || $2 == "*" n { print $1; exit }' "$sums")
[ -n "$expected" ] || { echo "install.sh: $sums has no sum for $name; refusing it" >&2; exit 1; }
actual=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$actual" != "$expected" ]; then
  echo "install.sh: $name: SHA-256 $actual, but $sums says $expected; refusing it" >&2
  exit 1
fi

work=$(mktemp -d /tmp/nanolet-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work" --no-same-owner
dir=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'nanolet-*' | head -n 1)
for file in nanolet nanolet.service nanolet.yaml 10-nanolet.conflist VERSION; do
  if [ -z "$dir" ] || [ ! -f "$dir/$file" ] || [ -L "$dir/$file" ]; then
    echo "install.sh: $name has no $file: not a nanolet release" >&2
    exit 1
  fi
done
arch=$(sed -n 's/^arch //p' "$dir/VERSION")
if [ -z "$root" ]; then
  case $(uname -m) in
    aarch64 | arm64) here="aarch64" ;;
    armv7l | armv8l) here="armv7 armv6" ;;
    armv6l) here="armv6" ;;
    riscv64) here="riscv64" ;;
    *) here="" ;;
  esac
  case " $here " in
    *" $arch "*) ;;
    *) echo "install.sh: $name is for $arch; this machine is $(uname -m)" >&2; exit 1 ;;
  esac
fi

changed=""
# Puts $1 at $2 with mode $3 unless the same file is there, in one rename
# (a running agent keeps its old binary until it restarts).
put() {
  if [ -f "$2" ] && cmp -s "$1" "$2"; then
    chmod "$3" "$2"
    return
  fi
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2.new.$$"
  chmod "$3" "$2.new.$$"
  mv -f "$2.new.$$" "$2"
  changed="$changed $2"
}
# Puts $1 at $2 only if nothing is there: the board's own settings win.
put_once() {
  if [ -e "$2" ]; then
    cmp -s "$1" "$2" || echo "install.sh: kept $2 as it is (the release's is in $name)"
    return
  fi
  put "$1" "$2" 0644
}

put "$dir/nanolet" "$root/usr/local/bin/nanolet" 0755
put "$dir/nanolet.service" "$root/etc/systemd/system/nanolet.service" 0644
put_once "$dir/nanolet.yaml" "$root/etc/nanolet/nanolet.yaml"
mkdir -p "$root/etc/nanolet/manifests"
cni="$root/etc/cni/net.d"
if ls "$cni"/*.conf "$cni"/*.conflist "$cni"/*.json >/dev/null 2>&1; then
  [ -e "$cni/10-nanolet.conflist" ] || echo "install.sh: $cni has a network configuration already; 10-nanolet.conflist not added"
else
  put "$dir/10-nanolet.conflist" "$cni/10-nanolet.conflist" 0644
fi

version=$(sed -n 's/^nanolet //p' "$dir/VERSION")
commit=$(sed -n 's/^commit //p' "$dir/VERSION")
if [ -z "$changed" ]; then
  echo "install.sh: nanolet $version ($commit, $arch) is installed already: nothing changed"
else
  for file in $changed; do echo "install.sh: wrote $file"; done
fi

[ -z "$root" ] || exit 0
if [ ! -d /run/systemd/system ]; then
  echo "install.sh: systemd is not running here: start /usr/local/bin/nanolet yourself"
  exit 0
fi
systemctl daemon-reload
systemctl enable --quiet nanolet.service
if ! $start; then
  exit 0
fi
if systemctl is-active --quiet nanolet.service; then
  if [ -n "$changed" ]; then
    # KillMode=process: only the agent restarts; the new one adopts the pods.
    systemctl restart nanolet.service
    echo "install.sh: nanolet restarted (its pods kept running)"
  fi
else
  systemctl start nanolet.service
  echo "install.sh: nanolet started"
fi
