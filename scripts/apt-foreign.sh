#!/usr/bin/env bash
# Downloads Debian packages of another architecture (armhf, armel, arm64)
# from this host's apt sources, without adding the architecture to the
# host's dpkg: apt runs with a state of its own under target/apt-<arch>,
# and verifies what it fetches against the signed index as usual.
# Usage: scripts/apt-foreign.sh ARCH DEST PACKAGE...
#   Prints the path of each downloaded .deb. With --depends-of PACKAGE in
#   place of the packages, prints what PACKAGE depends on instead (a
#   metapackage's real kernel package, say).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# >= 3)) || { echo "usage: scripts/apt-foreign.sh ARCH DEST PACKAGE... | --depends-of PACKAGE" >&2; exit 2; }
arch=$1 dest=$2
shift 2

state="$PWD/target/apt-$arch"
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$dest"
: >"$state/status"
options=(-q -o APT::Sandbox::User=root -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch"
  -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o "Dir::State::status=$state/status")
# The index once a day is enough for a cache that is rebuilt rarely.
if [[ -z $(find "$state/lists" -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n 1) ]]; then
  apt-get "${options[@]}" update >&2
fi
if [[ $1 == --depends-of ]]; then
  apt-cache "${options[@]}" depends --no-recommends --no-suggests "$2:$arch" |
    sed -n 's/^ *Depends: \([^ ]*\).*/\1/p' | sed "s/:$arch\$//"
  exit 0
fi
dest=$(cd "$dest" && pwd)
(cd "$dest" && apt-get "${options[@]}" download "${@/%/:$arch}" >&2)
for package in "$@"; do
  found=$(compgen -G "$dest/${package}_*_$arch.deb" || compgen -G "$dest/${package}_*_all.deb" || true)
  [[ -n $found ]] || { echo "apt-foreign.sh: $package was not downloaded" >&2; exit 1; }
  head -n 1 <<<"$found"
done
