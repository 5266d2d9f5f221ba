#!/usr/bin/env bash
# Build a tiny busybox-based OCI image layout without any daemon, builder or
# network access, so nanolet's tests can make images on a bare CI machine.
# Output is a pure function of the inputs: fixed mtimes, owners, modes, sort
# order and gzip header make repeated builds produce identical digests, which
# lets tests assert on digests and lets registries deduplicate blobs.
#
# Usage: scripts/build-image.sh OUTDIR [--arch amd64|arm64|arm] [--busybox PATH]
#          [--extra-file SRC:DEST]... [--env K=V]... [--entrypoint JSON]
#          [--cmd JSON] [--workdir DIR] [--user U] [--tag TAG]
#          [--compression gzip|zstd] [--layer TAR]...
# --layer adds a tar, as it is, as one more layer on top of the busybox one
# (compressed like it): how tests ship crafted, even hostile, layers.
# Prints the manifest digest (sha256:...) on stdout.
set -euo pipefail

usage() {
  sed -n 's/^# \{0,1\}//; /^Usage:/,/^Prints/p' "$0" >&2
  exit 2
}

die() {
  echo "build-image.sh: $*" >&2
  exit 1
}

# The caller's umask would otherwise leak into directory modes, and so into
# the layer digest.
umask 022

DEFAULT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
APPLETS=(sh ls cat echo sleep env id pwd hostname true false ps wget nc printf
  date mkdir rm touch kill head tail seq yes)
EPOCH=1970-01-01T00:00:00Z

(($# >= 1)) || usage
[[ $1 != -* ]] || usage
outdir=$1
shift

arch=amd64
busybox=/bin/busybox
tag=latest
compression=gzip
entrypoint=""
cmd=""
workdir=""
user=""
extra_files=()
extra_layers=()
envs=()

need_arg() {
  (($# >= 2)) || die "$1 needs a value"
}

while (($# > 0)); do
  case $1 in
    --arch) need_arg "$@"; arch=$2; shift 2 ;;
    --busybox) need_arg "$@"; busybox=$2; shift 2 ;;
    --extra-file) need_arg "$@"; extra_files+=("$2"); shift 2 ;;
    --layer) need_arg "$@"; extra_layers+=("$2"); shift 2 ;;
    --env) need_arg "$@"; envs+=("$2"); shift 2 ;;
    --entrypoint) need_arg "$@"; entrypoint=$2; shift 2 ;;
    --cmd) need_arg "$@"; cmd=$2; shift 2 ;;
    --workdir) need_arg "$@"; workdir=$2; shift 2 ;;
    --user) need_arg "$@"; user=$2; shift 2 ;;
    --tag) need_arg "$@"; tag=$2; shift 2 ;;
    --compression) need_arg "$@"; compression=$2; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown argument: $1" ;;
  esac
done

case $arch in
  amd64 | arm64 | arm) ;;
  *) die "--arch must be amd64, arm64 or arm (v7), not '$arch'" ;;
esac
[[ -f $busybox ]] || die "busybox binary not found: $busybox"
# Same grammar the OCI image layout spec gives for ref.name tags; anything
# else would be rejected later by skopeo with a far less clear message.
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] || die "invalid tag: $tag"
command -v jq >/dev/null 2>&1 || die "jq not found; run scripts/install-deps.sh"
for j in "$entrypoint" "$cmd"; do
  [[ -z $j ]] && continue
  jq -e 'type == "array" and all(.[]; type == "string")' <<<"$j" >/dev/null 2>&1 ||
    die "--entrypoint/--cmd must be a JSON array of strings, got: $j"
done
for e in "${envs[@]}"; do
  [[ $e == ?*=* ]] || die "--env must be K=V, got: $e"
done
for l in "${extra_layers[@]}"; do
  [[ -f $l ]] || die "layer tar not found: $l"
done
# Checked before OUTDIR is created so a typo leaves nothing behind.
for spec in "${extra_files[@]}"; do
  [[ $spec == ?*:/?* ]] || die "--extra-file must be SRC:/ABS/DEST, got: $spec"
  src=${spec%%:*}
  dest=${spec#*:}
  [[ -e $src ]] || die "extra file not found: $src"
  [[ /$dest/ != */../* ]] || die "--extra-file destination may not contain '..': $dest"
done

mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd -P)"
if [[ -n "$(ls -A "$outdir")" && ! -f $outdir/oci-layout ]]; then
  die "$outdir is not empty and not an OCI layout; refusing to write into it"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
# mktemp -d makes 0700; that mode would become the container's "/" and lock
# non-root users out of everything.
mkdir -m 0755 "$root"

mkdir -m 0755 "$root/bin" "$root/etc" "$root/proc" "$root/sys" "$root/dev"
mkdir -m 0700 "$root/root"
mkdir "$root/tmp"
chmod 1777 "$root/tmp"

cp "$busybox" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
for a in "${APPLETS[@]}"; do
  ln -s busybox "$root/bin/$a"
done

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
app:x:1000:1000:app:/tmp:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
app:x:1000:
nobody:x:65534:
EOF
chmod 0644 "$root/etc/passwd" "$root/etc/group"

for spec in "${extra_files[@]}"; do
  src=${spec%%:*}
  dest=${spec#*:}
  mkdir -p "$root$(dirname "$dest")"
  # Keep the source's mode (executables must stay executable) but nothing
  # else; -L so a symlinked source contributes its content, not a dangling
  # link into the host filesystem.
  cp -RL --preserve=mode "$src" "$root$dest"
done

# Ownership and timestamps are normalised by tar itself, so the host's clock
# and the invoking user never reach the layer.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
  -C "$root" -cf "$work/layer.tar" .
compress() {
  case $compression in
    gzip) gzip -n -c "$1" ;;
    # zstd's output depends only on its input, level and version.
    zstd) zstd -q -c -19 "$1" ;;
    *) die "--compression must be gzip or zstd, not '$compression'" ;;
  esac
}
compress "$work/layer.tar" >"$work/layer.blob"

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

blobs=$outdir/blobs/sha256
mkdir -p "$blobs"

# Store a file as a content-addressed blob and print its hex digest. Blobs are
# immutable, so an existing one is already correct and is left alone.
put_blob() {
  local f=$1 d
  d="$(sha "$f")"
  if [[ ! -f $blobs/$d ]]; then
    cp "$f" "$blobs/$d.tmp.$$"
    mv -f "$blobs/$d.tmp.$$" "$blobs/$d"
  fi
  echo "$d"
}

# Layers as manifest descriptors and their diff IDs, bottom first.
layer_type="application/vnd.oci.image.layer.v1.tar+$compression"
layers_json='[]'
diff_ids_json='[]'
add_layer() {
  local tar=$1 blob=$2 digest
  digest="sha256:$(put_blob "$blob")"
  layers_json="$(jq -c --arg t "$layer_type" --arg d "$digest" --argjson s "$(size "$blob")" \
    '. + [{mediaType: $t, digest: $d, size: $s}]' <<<"$layers_json")"
  diff_ids_json="$(jq -c --arg d "sha256:$(sha "$tar")" '. + [$d]' <<<"$diff_ids_json")"
}
add_layer "$work/layer.tar" "$work/layer.blob"
for i in "${!extra_layers[@]}"; do
  compress "${extra_layers[$i]}" >"$work/extra-$i.blob"
  add_layer "${extra_layers[$i]}" "$work/extra-$i.blob"
done

env_json="$(
  # An explicit --env PATH=... replaces the default rather than duplicating
  # the key, since runtimes disagree on which duplicate wins.
  has_path=false
  for e in "${envs[@]}"; do
    [[ $e == PATH=* ]] && has_path=true
  done
  {
    [[ $has_path == true ]] || printf '%s\n' "PATH=$DEFAULT_PATH"
    for e in "${envs[@]}"; do printf '%s\n' "$e"; done
  } | jq -R . | jq -cs .
)"

# Default Cmd only when neither is set: with an explicit entrypoint, a stray
# ["sh"] would be appended to it as an argument.
if [[ -z $entrypoint && -z $cmd ]]; then
  cmd='["sh"]'
fi

variant=""
[[ $arch == arm64 ]] && variant=v8
[[ $arch == arm ]] && variant=v7

jq -cn \
  --arg arch "$arch" \
  --arg variant "$variant" \
  --arg created "$EPOCH" \
  --argjson env "$env_json" \
  --arg entrypoint "$entrypoint" \
  --arg cmd "$cmd" \
  --arg workdir "$workdir" \
  --arg user "$user" \
  --argjson diff_ids "$diff_ids_json" \
  '{
    created: $created,
    architecture: $arch,
    os: "linux",
    config: (
      {Env: $env}
      + (if $entrypoint != "" then {Entrypoint: ($entrypoint | fromjson)} else {} end)
      + (if $cmd != "" then {Cmd: ($cmd | fromjson)} else {} end)
      + (if $workdir != "" then {WorkingDir: $workdir} else {} end)
      + (if $user != "" then {User: $user} else {} end)
    ),
    rootfs: {type: "layers", diff_ids: $diff_ids},
    history: [{created: $created, created_by: "nanolet scripts/build-image.sh"}]
  } + (if $variant != "" then {variant: $variant} else {} end)' \
  >"$work/config.json"
config_digest="sha256:$(put_blob "$work/config.json")"
config_size="$(size "$work/config.json")"

jq -cn \
  --arg cd "$config_digest" --argjson cs "$config_size" \
  --argjson layers "$layers_json" \
  '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
    layers: $layers
  }' >"$work/manifest.json"
manifest_digest="sha256:$(put_blob "$work/manifest.json")"
manifest_size="$(size "$work/manifest.json")"

printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
mv -f "$work/oci-layout" "$outdir/oci-layout"

# Several tags may share one layout; replace only this tag's entry, and keep
# entries sorted by tag so index.json does not depend on build order.
if [[ -f $outdir/index.json ]]; then
  cp "$outdir/index.json" "$work/old-index.json"
else
  echo '{"schemaVersion":2,"manifests":[]}' >"$work/old-index.json"
fi
jq -c \
  --arg tag "$tag" \
  --arg md "$manifest_digest" --argjson ms "$manifest_size" \
  --arg arch "$arch" --arg variant "$variant" \
  '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: (
      [.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] != $tag)]
      + [{
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          digest: $md,
          size: $ms,
          platform: ({architecture: $arch, os: "linux"}
            + (if $variant != "" then {variant: $variant} else {} end)),
          annotations: {"org.opencontainers.image.ref.name": $tag}
        }]
      | sort_by(.annotations["org.opencontainers.image.ref.name"] // "")
    )
  }' "$work/old-index.json" >"$work/index.json"
mv -f "$work/index.json" "$outdir/index.json"

echo "$manifest_digest"
