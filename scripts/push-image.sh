#!/usr/bin/env bash
# Push OCI layouts made by build-image.sh to a plain-HTTP loopback registry,
# either as a single-platform image or as an OCI image index of several
# platforms (each image's own, from its config), which is what nanolet's platform resolution is tested against.
# Digests are preserved, so what the registry serves is byte-for-byte what
# build-image.sh wrote and tests can compare digests directly.
#
# Usage: scripts/push-image.sh [--creds USER:PASSWORD] OCIDIR TAG REGISTRY NAME[:TAG]
#        scripts/push-image.sh [--creds USER:PASSWORD] --index REGISTRY NAME:TAG OCIDIR OCIDIR...
#   --creds: log in to a registry that demands it (registry.sh --token-auth)
# Prints REGISTRY/NAME:TAG@sha256:... (the pushed manifest or index) on stdout.
set -euo pipefail

usage() {
  sed -n 's/^# \{0,1\}//; /^Usage:/,/^Prints/p' "$0" >&2
  exit 2
}

die() {
  echo "push-image.sh: $*" >&2
  exit 1
}

MT_INDEX=application/vnd.oci.image.index.v1+json
MT_MANIFEST=application/vnd.oci.image.manifest.v1+json
REF_NAME=org.opencontainers.image.ref.name
# --dest-creds for skopeo when --creds is given; kept out of error messages.
dest_creds=()

command -v skopeo >/dev/null 2>&1 || die "skopeo not found; run scripts/install-deps.sh"
command -v jq >/dev/null 2>&1 || die "jq not found; run scripts/install-deps.sh"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Our own permissive policy: the host's /etc/containers/policy.json may be
# missing or stricter, and signature policy is irrelevant for local test images.
policy=$work/policy.json
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$policy"

skopeo_copy() {
  local out
  if ! out="$(skopeo --policy "$policy" copy --quiet --preserve-digests \
    --dest-tls-verify=false "${dest_creds[@]}" "$@" 2>&1)"; then
    echo "$out" >&2
    die "skopeo copy $* failed"
  fi
}

# NAME[:TAG] -> repository and tag; only a colon after the last slash is a tag.
split_name() {
  local n=$1 default_tag=$2
  if [[ ${n##*/} == *:* ]]; then
    repo=${n%:*}
    dtag=${n##*:}
  else
    repo=$n
    dtag=$default_tag
  fi
  [[ -n $repo && -n $dtag ]] || die "bad image name: $n"
}

check_layout() {
  [[ -f $1/oci-layout && -f $1/index.json ]] || die "$1 is not an OCI image layout"
}

push_single() {
  local dir=$1 tag=$2 registry=$3 name=$4 digest
  check_layout "$dir"
  split_name "$name" "$tag"
  digest="$(jq -r --arg t "$tag" --arg k "$REF_NAME" \
    '[.manifests[] | select(.annotations[$k] == $t)][0].digest // empty' "$dir/index.json")"
  [[ -n $digest ]] || die "no tag '$tag' in $dir/index.json"
  skopeo_copy "oci:$dir:$tag" "docker://$registry/$repo:$dtag"
  echo "$registry/$repo:$dtag@$digest"
}

# Pick the manifest descriptor to use from a layout: its only one, or the one
# tagged like the destination when the layout holds several tags.
pick_manifest() {
  local dir=$1 tag=$2 desc
  desc="$(jq -c --arg t "$tag" --arg k "$REF_NAME" --arg mt "$MT_MANIFEST" '
    [.manifests[] | select(.mediaType == null or .mediaType == $mt)] as $m
    | if ($m | length) == 1 then $m[0]
      else ([$m[] | select(.annotations[$k] == $t)][0] // empty) end' "$dir/index.json")"
  [[ -n $desc ]] || die "$dir has several images and none tagged '$tag'"
  echo "$desc"
}

# The platform of the image $desc in layout $dir, from its own config (an
# index's labels then cannot contradict what the images are).
platform_of() {
  local dir=$1 desc=$2 m cfg
  m="$(jq -r .digest <<<"$desc")"
  cfg="$(jq -r .config.digest "$dir/blobs/sha256/${m#sha256:}")"
  jq -c '{architecture, os} + (if .variant then {variant} else {} end)' "$dir/blobs/sha256/${cfg#sha256:}"
}

push_index() {
  local registry=$1 name=$2 dir desc entries="" idx idx_digest idx_size
  shift 2
  (($# >= 2)) || die "--index needs two layouts or more"
  [[ ${name##*/} == *:* ]] || die "--index needs NAME:TAG, got: $name"
  split_name "$name" ""
  # One combined layout whose tag points at an image index blob; skopeo --all
  # then pushes every image and the index exactly as written here.
  combined=$work/combined
  mkdir -p "$combined/blobs/sha256"
  local b
  for dir in "$@"; do
    check_layout "$dir"
    desc="$(pick_manifest "$dir" "$dtag")"
    entries+="$(jq -c --arg mm "$MT_MANIFEST" --argjson p "$(platform_of "$dir" "$desc")" \
      '{mediaType: (.mediaType // $mm), digest, size, platform: $p}' <<<"$desc")"$'\n'
    # Blobs are content-addressed, so one present in several layouts (a
    # shared layer) is the same file and needs copying only once.
    for b in "$dir"/blobs/sha256/*; do
      [[ -e $combined/blobs/sha256/${b##*/} ]] || cp "$b" "$combined/blobs/sha256/"
    done
  done
  [[ $(jq -s '[.[].platform | [.architecture, .variant]] | unique | length' <<<"$entries") == "$#" ]] ||
    die "two layouts of one platform"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$combined/oci-layout"

  idx=$work/index-blob.json
  jq -cs --arg mt "$MT_INDEX" '{schemaVersion: 2, mediaType: $mt, manifests: .}' <<<"$entries" >"$idx"
  idx_digest="sha256:$(sha256sum "$idx" | cut -d' ' -f1)"
  idx_size="$(stat -c %s "$idx")"
  cp "$idx" "$combined/blobs/sha256/${idx_digest#sha256:}"

  jq -cn --arg mt "$MT_INDEX" --arg d "$idx_digest" --argjson s "$idx_size" \
    --arg k "$REF_NAME" --arg t "$dtag" '{
    schemaVersion: 2,
    mediaType: $mt,
    manifests: [{mediaType: $mt, digest: $d, size: $s, annotations: {($k): $t}}]
  }' >"$combined/index.json"

  skopeo_copy --all "oci:$combined:$dtag" "docker://$registry/$repo:$dtag"
  echo "$registry/$repo:$dtag@$idx_digest"
}

(($# >= 1)) || usage
if [[ $1 == --creds ]]; then
  (($# >= 2)) || usage
  [[ $2 == ?*:* ]] || die "--creds needs USER:PASSWORD"
  dest_creds=(--dest-creds "$2")
  shift 2
  (($# >= 1)) || usage
fi
case $1 in
  -h | --help) usage ;;
  --index)
    (($# >= 5)) || usage
    shift
    push_index "$@"
    ;;
  *)
    (($# == 4)) || usage
    push_single "$1" "$2" "$3" "$4"
    ;;
esac
