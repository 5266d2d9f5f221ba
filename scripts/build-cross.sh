#!/usr/bin/env bash
# Builds the static release binary for each board architecture named
# (default aarch64), checks that it is a static executable of that
# architecture which starts under qemu-user, and that it is within the
# 6 MiB budget; with --test, also runs the library's unit tests for
# aarch64 under qemu.
#
#   aarch64  aarch64-unknown-linux-musl    Pi 3/4/5 under a 64-bit OS (stable)
#   armv7    armv7-unknown-linux-musleabihf Pi 2/3/Zero 2 W under a 32-bit OS
#   armv6    arm-unknown-linux-musleabi    Pi Zero/Zero W/1
#   riscv64  riscv64gc-unknown-linux-gnu   RV64GC boards (static glibc)
#
# armv7 and armv6 have no std from rustup here: nightly builds it from
# source (rust-src), and musl's and gcc's C parts come from Debian's armhf
# and armel packages (scripts/apt-foreign.sh: the host's dpkg gets no
# foreign architecture).
# Usage: scripts/build-cross.sh [--test] [--all | ARCH...]
# Prints "<arch> <path> <bytes>" per binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

readonly BUDGET=$((6 * 1024 * 1024))
test=false
arches=()
for arg in "$@"; do
  case $arg in
    --test) test=true ;;
    --all) arches=(aarch64 armv7 armv6 riscv64) ;;
    aarch64 | armv7 | armv6 | riscv64) arches+=("$arg") ;;
    *) echo "build-cross.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
((${#arches[@]} > 0)) || arches=(aarch64)

# What `file` says of each architecture's binary, its qemu-user, the
# toolchain, and for the std-from-source targets Debian's architecture and
# gcc triple.
triple() {
  case $1 in
    aarch64) echo aarch64-unknown-linux-musl ;;
    armv7) echo armv7-unknown-linux-musleabihf ;;
    armv6) echo arm-unknown-linux-musleabi ;;
    riscv64) echo riscv64gc-unknown-linux-gnu ;;
  esac
}
machine() {
  case $1 in
    aarch64) echo "ARM aarch64" ;;
    armv7 | armv6) echo "ARM, EABI5" ;;
    riscv64) echo "UCB RISC-V" ;;
  esac
}
# The emulator, as the oldest core of the boards each build is for: an
# instruction that core lacks is an illegal instruction here, not on a
# board (the armv7 build fails on an ARM1176, as it must).
qemu() {
  case $1 in
    aarch64) echo qemu-aarch64-static -cpu cortex-a53 ;;
    armv7) echo qemu-arm-static -cpu cortex-a7 ;;
    armv6) echo qemu-arm-static -cpu arm1176 ;;
    riscv64) echo qemu-riscv64-static ;;
  esac
}
toolchain() {
  case $1 in
    armv7 | armv6) echo +nightly ;;
    *) echo +stable ;;
  esac
}
debian_arch() {
  case $1 in
    armv7) echo armhf ;;
    armv6) echo armel ;;
  esac
}
gcc_triple() {
  case $1 in
    armv7) echo arm-linux-gnueabihf ;;
    armv6) echo arm-linux-gnueabi ;;
  esac
}

# musl's crt objects and libc.a from Debian's musl-dev of that
# architecture, and gcc's crtbegin/crtend and unwinder from the cross gcc:
# what a self-contained musl link takes from rustup's std where rustup has
# one. Kept once made; remade when a piece is missing.
sysroot() {
  local arch=$1 dir="$PWD/target/cross-sysroot/$1"
  local debarch gcc
  debarch=$(debian_arch "$arch")
  gcc=$(gcc_triple "$arch")
  if [[ -f $dir/libc.a && -f $dir/crtbegin.o && -f $dir/libunwind.a ]]; then
    echo "$dir"
    return
  fi
  local debs="$PWD/target/cross-sysroot/debs" deb unpacked="$dir.unpacked"
  mkdir -p "$dir"
  deb=$(scripts/apt-foreign.sh "$debarch" "$debs" musl-dev)
  rm -rf "$unpacked"
  dpkg-deb -x "$deb" "$unpacked"
  local musl="$unpacked/usr/lib/${gcc/-linux-gnu/-linux-musl}"
  cp "$musl"/{crt1.o,crti.o,crtn.o,libc.a} "$dir/"
  local libgcc
  libgcc=$("$gcc-gcc" -print-libgcc-file-name)
  cp "$(dirname "$libgcc")"/{crtbegin.o,crtend.o,crtbeginS.o,crtendS.o} "$dir/"
  cp "$(dirname "$libgcc")/libgcc_eh.a" "$dir/libunwind.a"
  cp "$libgcc" "$dir/libgcc.a"
  rm -rf "$unpacked"
  echo "$dir"
}

for arch in "${arches[@]}"; do
  target=$(triple "$arch")
  config=cross/$arch.toml
  extra=()
  if [[ -n $(debian_arch "$arch") ]]; then
    dir=$(sysroot "$arch")
    extra=(--config "target.$target.rustflags=[\"-L\", \"native=$dir\"]")
  fi
  cargo "$(toolchain "$arch")" --config "$config" "${extra[@]}" build --release --locked --bin nanolet >&2
  binary="${CARGO_TARGET_DIR:-target}/$target/release/nanolet"
  description=$(file -b "$binary")
  if ! grep -q "$(machine "$arch")" <<<"$description" || ! grep -Eq "statically linked|static-pie linked" <<<"$description"; then
    echo "build-cross.sh: $binary is not a static $arch executable: $description" >&2
    exit 1
  fi
  # The binary must start on its architecture, not just link.
  read -ra emulator <<<"$(qemu "$arch")"
  "${emulator[@]}" "$binary" version >/dev/null
  size=$(stat -c %s "$binary")
  if ((size > BUDGET)); then
    echo "build-cross.sh: $binary is $size bytes, over the budget of $BUDGET (6 MiB)" >&2
    exit 1
  fi
  echo "$arch $binary $size"
done

if $test; then
  # The library holds the unit tests (the binary has none of its own).
  cargo --config cross/aarch64.toml test --locked --lib --bin nanolet
fi
