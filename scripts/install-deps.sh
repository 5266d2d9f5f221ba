#!/usr/bin/env bash
# Install the host tools nanolet's scripts and integration tests rely on.
# Idempotent and quiet: a machine that already has everything prints nothing,
# so CI can call this unconditionally on every run.
# Usage: scripts/install-deps.sh
set -euo pipefail

# Commands we probe for; each one is provided by a package in PACKAGES below.
# curl is not in the brief's list but registry.sh needs it for its readiness
# probe, and minimal images do not always ship it.
COMMANDS=(runc crun docker-registry skopeo umoci busybox jq htpasswd qemu-aarch64-static mkfs.ext4 curl file
  aarch64-linux-gnu-gcc arm-linux-gnueabihf-gcc arm-linux-gnueabi-gcc riscv64-linux-gnu-gcc
  iptables qemu-system-x86_64 qemu-system-aarch64 qemu-system-arm qemu-arm-static debootstrap zstd protoc)
PACKAGES=(runc crun docker-registry skopeo umoci busybox-static jq apache2-utils
  qemu-user-static e2fsprogs iproute2 musl-tools gcc-aarch64-linux-gnu
  libc6-dev-arm64-cross gcc-arm-linux-gnueabihf libc6-dev-armhf-cross gcc-arm-linux-gnueabi
  libc6-dev-armel-cross gcc-riscv64-linux-gnu libc6-dev-riscv64-cross curl file iptables containernetworking-plugins
  qemu-system-x86 qemu-system-arm debootstrap linux-image-amd64 python3-grpcio python3-kubernetes python3-yaml zstd apparmor
  protobuf-compiler)
RUST_TARGETS=(aarch64-unknown-linux-musl x86_64-unknown-linux-musl riscv64gc-unknown-linux-gnu)

missing=()
for c in "${COMMANDS[@]}"; do
  command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
# Images are built from /bin/busybox, and Debian's plain "busybox" package is
# dynamically linked (useless inside a bare rootfs) yet also provides that
# path, so ask dpkg for the static flavour rather than probing the command.
if [[ ! -x /bin/busybox ]] ||
  [[ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null || true)" != "install ok installed" ]]; then
  missing+=("busybox-static")
fi

# The cgroup v2 VM boots the installed Debian kernel.
compgen -G '/boot/vmlinuz-*' >/dev/null || missing+=("linux-image-amd64")
# CNI plugins are not commands on PATH; the network tests run Debian's.
for plugin in bridge host-local portmap; do
  [[ -x /usr/lib/cni/$plugin ]] || { missing+=("containernetworking-plugins"); break; }
done

# nanolet loads its AppArmor profile with the parser, a root-only tool
# that need not be on PATH; the cgroup v2 VM (which has AppArmor) uses the
# host's.
[[ -x /sbin/apparmor_parser || -x /usr/sbin/apparmor_parser ]] || missing+=("apparmor")

# gRPC probes are tested against gRPC's own implementation: Debian's
# Python (not whatever python3 is first on PATH) with its grpcio.
/usr/bin/python3 -c 'import grpc' 2>/dev/null || missing+=("python3-grpcio")
# The kubelet's WebSocket port forward is tested with the client that
# speaks it: the Kubernetes Python client (kubectl speaks SPDY).
/usr/bin/python3 -c 'import kubernetes.stream' 2>/dev/null || missing+=("python3-kubernetes")
# The workload corpus test reads the projects' YAML with it.
/usr/bin/python3 -c 'import yaml' 2>/dev/null || missing+=("python3-yaml")

if ((${#missing[@]} > 0)); then
  if ((EUID != 0)); then
    echo "install-deps: missing ${missing[*]} and not root; run as root" >&2
    exit 1
  fi
  echo "install-deps: missing ${missing[*]}; installing packages" >&2
  # apt/debconf chatter goes to a log that is shown only if a step fails.
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${PACKAGES[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
  echo "install-deps: installed ${PACKAGES[*]}" >&2
fi

# Cross/musl targets are only needed for the static agent builds; rustup is
# optional (CI might use a distro toolchain), so skip silently without it.
if command -v rustup >/dev/null 2>&1; then
  installed="$(rustup target list --installed 2>/dev/null || true)"
  want=()
  for t in "${RUST_TARGETS[@]}"; do
    grep -qxF "$t" <<<"$installed" || want+=("$t")
  done
  if ((${#want[@]} > 0)); then
    echo "install-deps: adding rust targets ${want[*]}" >&2
    if ! out="$(rustup target add "${want[@]}" 2>&1)"; then
      echo "$out" >&2
      exit 1
    fi
  fi
  # armv7 and armv6 have no std from rustup here: nightly builds it from
  # its source (scripts/build-cross.sh).
  if rustup toolchain list 2>/dev/null | grep -q '^nightly' &&
    ! rustup +nightly component list --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "install-deps: adding rust-src to the nightly toolchain" >&2
    if ! out="$(rustup component add rust-src --toolchain nightly 2>&1)"; then
      echo "$out" >&2
      exit 1
    fi
  fi
fi
