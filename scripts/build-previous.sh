#!/usr/bin/env bash
# Builds the agent of the commit named in scripts/previous-release (the
# previous release), for tests/upgrade.rs: its source exported with git
# archive, built with a target dir of its own under target/previous (kept:
# the next run finds it built). Prints the binary's path.
# Usage: scripts/build-previous.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"

commit=$(grep -v '^#' scripts/previous-release | head -n 1 | tr -d '[:space:]')
full=$(git rev-parse --verify --quiet "$commit^{commit}") ||
  { echo "build-previous.sh: commit $commit is not in this clone (a shallow one?): fetch it" >&2; exit 1; }
dir="$PWD/target/previous/$full"
binary="$dir/build/debug/nanolet"
if [[ ! -x $binary ]]; then
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git archive "$full" | tar -x -C "$dir/src"
  (cd "$dir/src" && CARGO_TARGET_DIR="$dir/build" cargo build --locked --bin nanolet) >&2
fi
echo "$binary"
