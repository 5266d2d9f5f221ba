#!/usr/bin/env bash
# Fuzzes the layer unpacker (tests/fuzz, cargo fuzz with libFuzzer) for
# SECONDS (default 60), from a corpus of real layers made here: the
# busybox layer build-image.sh makes, in gzip and zstd, and small layers
# with every entry type (files, dirs, symlinks, hardlinks, a FIFO, OCI
# whiteouts and an opaque dir), plus the hostile shapes the suite tests.
# Needs root (the unpacker chowns and makes overlay whiteouts) and a
# nightly toolchain; installs cargo-fuzz if missing. Not part of
# scripts/test.sh: libFuzzer needs nightly, the suite runs on stable.
# A crash leaves its input under tests/fuzz/artifacts/unpack/.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
seconds=${1:-60}
[[ $(id -u) == 0 ]] || { echo "fuzz.sh: run as root" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

work="$(mktemp -d /tmp/nanolet-fuzz.XXXXXX)"
trap 'rm -rf "$work"' EXIT
corpus=$work/corpus
mkdir -p "$corpus"

# Real layers: busybox's, as the suite's images carry it.
scripts/build-image.sh "$work/oci" >/dev/null
scripts/build-image.sh "$work/oci-zstd" --compression zstd >/dev/null
for layout in "$work/oci" "$work/oci-zstd"; do
  manifest=$(jq -r '.manifests[0].digest' "$layout/index.json" | cut -d: -f2)
  layer=$(jq -r '.layers[0].digest' "$layout/blobs/sha256/$manifest" | cut -d: -f2)
  cp "$layout/blobs/sha256/$layer" "$corpus/busybox-$(basename "$layout")"
done

# Small layers with every entry type.
tree=$work/tree
mkdir -p "$tree/dir/sub" "$tree/opaque"
echo data >"$tree/dir/file"
chmod 4755 "$tree/dir/file"
ln -s ../dir/file "$tree/dir/sub/link"
ln "$tree/dir/file" "$tree/dir/hard"
mkfifo "$tree/fifo"
: >"$tree/dir/.wh.gone"
: >"$tree/opaque/.wh..wh..opq"
tar -C "$tree" -cf "$corpus/types.tar" .
gzip -n -c "$corpus/types.tar" >"$corpus/types.tar.gz"
zstd -q -c "$corpus/types.tar" >"$corpus/types.tar.zst"
# Hostile shapes, written by Python's tarfile (GNU tar refuses them).
python3 - "$corpus" <<'PY'
import io, sys, tarfile
out = sys.argv[1]
def layer(name, entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for path, kind, target in entries:
            info = tarfile.TarInfo(path)
            info.type = kind
            info.linkname = target
            data = b"x" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    open(f"{out}/{name}.tar", "wb").write(buf.getvalue())
R, S, H = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
layer("dotdot", [("../../etc/pwned", R, "")])
layer("through-symlink", [("evil", S, "/tmp"), ("evil/pwned", R, "")])
layer("hardlink-out", [("h", H, "/etc/passwd")])
layer("whiteout-parent", [(".wh...", R, "")])
layer("absolute", [("/tmp/pwned", R, "")])
PY

export NANOLET_FUZZ_DIR=/dev/shm
cargo +nightly fuzz run --fuzz-dir tests/fuzz unpack "$corpus" -- \
  -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=262144 2>&1 |
  tee "$work/fuzz.log" | grep -E '^(#[0-9]+.*(DONE|pulse)|Done|==|SUMMARY|INFO: -max_total_time)' || true
status=${PIPESTATUS[0]}
rm -rf /dev/shm/nanolet-fuzz-*
head -60 "$work/fuzz.log" | grep -v "^ *[0-9]*: \|^ *at "; tail -3 "$work/fuzz.log"
exit "$status"
