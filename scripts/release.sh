#!/usr/bin/env bash
# Makes the release tarballs: one per board architecture, each holding the
# static binary, the systemd unit, the example configuration and the CNI
# configuration, and a SHA256SUMS file beside them (what
# scripts/install.sh checks). Tarballs are reproducible: names sorted,
# owner root, times the commit's, gzip without a timestamp.
#
# Usage: scripts/release.sh [--out DIR] [ARCH...]
#   ARCH    aarch64, armv7, armv6, riscv64 (default: all four)
#   --out   where the tarballs go (default target/release-tarballs)
# Prints each tarball's path.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=target/release-tarballs
arches=()
while (($# > 0)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    aarch64 | armv7 | armv6 | riscv64) arches+=("$1"); shift ;;
    *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#arches[@]} > 0)) || arches=(aarch64 armv7 armv6 riscv64)

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
commit=$(git rev-parse --short=12 HEAD)
# A tree with changes is not what the commit names: say so in the version.
git diff --quiet HEAD -- || commit="$commit-dirty"
epoch=$(git log -1 --format=%ct)

mkdir -p "$out"
out=$(cd "$out" && pwd)
staging=$(mktemp -d /tmp/nanolet-release.XXXXXX)
trap 'rm -rf "$staging"' EXIT

# One build per architecture; build-cross.sh checks each is static, starts
# under qemu and is within its size budget.
built=$(scripts/build-cross.sh "${arches[@]}")

tarballs=()
while read -r arch binary _; do
  name="nanolet-$version-$arch"
  dir="$staging/$name"
  mkdir -p "$dir"
  install -m 0755 "$binary" "$dir/nanolet"
  install -m 0644 config/systemd/nanolet.service "$dir/nanolet.service"
  install -m 0644 config/nanolet.yaml "$dir/nanolet.yaml"
  install -m 0644 config/cni/10-nanolet.conflist "$dir/10-nanolet.conflist"
  install -m 0644 README.md CHANGELOG.md "$dir/"
  printf 'nanolet %s\narch %s\ncommit %s\n' "$version" "$arch" "$commit" >"$dir/VERSION"
  touch -h -d "@$epoch" "$dir" "$dir"/*
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    -C "$staging" -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
  tarballs+=("$name.tar.gz")
  echo "$out/$name.tar.gz"
done <<<"$built"

# The sums of every tarball in the dir, these and earlier ones alike.
(cd "$out" && sha256sum -- nanolet-*.tar.gz >SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)
