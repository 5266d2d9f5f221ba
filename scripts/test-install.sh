#!/usr/bin/env bash
# Tests the release tarball and scripts/install.sh against a board's root
# in a temp dir: what is installed and with which modes; a second install
# changes nothing; the board's own configuration is kept; a tarball whose
# checksum is wrong, or that has none, is refused before anything is
# written; the same commit gives the same tarball twice. (The unit
# starting the agent under systemd is the ARM VM's part.)
# Usage: scripts/test-install.sh [ARCH]   (default aarch64)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
arch=${1:-aarch64}

work=$(mktemp -d /tmp/nanolet-test-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "test-install.sh: FAIL: $*" >&2
  exit 1
}
# Every file under the root with its mode and content digest.
inventory() {
  (cd "$1" && find . -printf '%p %y %m\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r sha256sum)
}

tarball=$(scripts/release.sh --out "$work/dist" "$arch")
[[ -f $tarball && -f $work/dist/SHA256SUMS ]] || fail "release.sh made no tarball and sums"
listing=$(tar -tzvf "$tarball")
for file in nanolet nanolet.service nanolet.yaml 10-nanolet.conflist VERSION; do
  grep -q " nanolet-[^/]*-$arch/$file\$" <<<"$listing" || fail "the tarball has no $file: $listing"
done
grep -q "^-rwxr-xr-x 0/0 .*/nanolet\$" <<<"$listing" || fail "the binary is not 0755 root's: $listing"

# The same commit, the same tarball.
first_sums=$(cat "$work/dist/SHA256SUMS")
scripts/release.sh --out "$work/dist" "$arch" >/dev/null
[[ $(cat "$work/dist/SHA256SUMS") == "$first_sums" ]] || fail "a second release of the same commit differs"

root=$work/root
out=$(sh scripts/install.sh --root "$root" "$tarball")
grep -q "wrote $root/usr/local/bin/nanolet" <<<"$out" || fail "first install: $out"
cmp -s "$root/usr/local/bin/nanolet" "$(scripts/build-cross.sh "$arch" | awk '{print $2}')" ||
  fail "the installed binary is not the built one"
[[ $(stat -c %a "$root/usr/local/bin/nanolet") == 755 ]] || fail "binary mode"
[[ $(stat -c %a "$root/etc/systemd/system/nanolet.service") == 644 ]] || fail "unit mode"
grep -q '^KillMode=process$' "$root/etc/systemd/system/nanolet.service" || fail "the unit lacks KillMode=process"
grep -q '^Delegate=yes$' "$root/etc/systemd/system/nanolet.service" || fail "the unit does not delegate cgroups"
cmp -s config/nanolet.yaml "$root/etc/nanolet/nanolet.yaml" || fail "configuration not installed"
cmp -s config/cni/10-nanolet.conflist "$root/etc/cni/net.d/10-nanolet.conflist" || fail "CNI configuration not installed"
[[ -d $root/etc/nanolet/manifests ]] || fail "no manifest dir"
compgen -G "$root/usr/local/bin/*.new.*" >/dev/null && fail "a temp file was left"

# Idempotent: nothing changes the second time.
before=$(inventory "$root")
out=$(sh scripts/install.sh --root "$root" "$tarball")
grep -q "nothing changed" <<<"$out" || fail "second install: $out"
[[ $(inventory "$root") == "$before" ]] || fail "a second install changed the root"

# The board's own configuration wins over the release's.
echo "# the board's own" >>"$root/etc/nanolet/nanolet.yaml"
edited=$(sha256sum <"$root/etc/nanolet/nanolet.yaml")
out=$(sh scripts/install.sh --root "$root" "$tarball")
grep -q "kept $root/etc/nanolet/nanolet.yaml" <<<"$out" || fail "edited configuration: $out"
[[ $(sha256sum <"$root/etc/nanolet/nanolet.yaml") == "$edited" ]] || fail "the board's configuration was replaced"

# A tarball that is not what its sums say is refused, and writes nothing.
mkdir -p "$work/tampered"
cp "$work/dist/SHA256SUMS" "$work/tampered/"
cp "$tarball" "$work/tampered/"
printf 'x' >>"$work/tampered/$(basename "$tarball")"
fresh=$work/fresh
if out=$(sh scripts/install.sh --root "$fresh" "$work/tampered/$(basename "$tarball")" 2>&1); then
  fail "a tampered tarball was installed: $out"
fi
grep -q "refusing it" <<<"$out" || fail "tampered tarball: $out"
[[ ! -e $fresh ]] || fail "a refused tarball wrote $(find "$fresh")"
rm "$work/tampered/SHA256SUMS"
cp "$tarball" "$work/tampered/"
if out=$(sh scripts/install.sh --root "$fresh" "$work/tampered/$(basename "$tarball")" 2>&1); then
  fail "a tarball without sums was installed: $out"
fi
grep -q "no checksum file" <<<"$out" || fail "no sums: $out"
[[ ! -e $fresh ]] || fail "a refused tarball wrote $(find "$fresh")"

# Busybox's sh runs it too (a board's /bin/sh may be that).
out=$(busybox sh scripts/install.sh --root "$root" "$tarball")
grep -q "nothing changed\|kept" <<<"$out" || fail "under busybox sh: $out"
echo "test-install.sh: release and install of $arch passed"
