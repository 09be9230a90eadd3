#!/usr/bin/env bash
# Builds the release server with the same-host peer checks taken out
# (crates/kvtier-server/src/peer.rs: `check` and `check_quick` answer Ok at
# once), for the A/B in scripts/bench-plugin-loads.py --ab-binary: what the
# pidfd checks cost a same-host load (notes/060-same-host-fixes). The
# variant is built from a worktree of HEAD in a temp dir and shares target/
# (only the workspace's crates are rebuilt); the binary it leaves is NEVER
# one to deploy: it is the hole the checks close.
#
#   scripts/build-no-peer-check.sh OUT_BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/build-no-peer-check.sh OUT_BINARY}
root=$PWD
tree=$(mktemp -d /tmp/kvtier-no-peer-check.XXXXXX)
keep=$(mktemp /tmp/kvtier-release.XXXXXX)
cleanup() {
    git -C "$root" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
    rm -f "$keep"
}
trap cleanup EXIT
# target/release/kvtier is the uplifted copy of whichever tree built last:
# keep this checkout's and put it back.
have_release=0
if [[ -x target/release/kvtier ]]; then cp -p target/release/kvtier "$keep"; have_release=1; fi
git worktree add -q --detach "$tree" HEAD
peer="$tree/crates/kvtier-server/src/peer.rs"
for f in 'pub fn check(&self) -> Result<(), Refused> {' 'pub fn check_quick(&self) -> Result<(), Refused> {'; do
    grep -qF "$f" "$peer" || { echo "peer.rs has no '$f': update this script" >&2; exit 1; }
done
python3 - "$peer" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
for f in ("pub fn check(&self) -> Result<(), Refused> {", "pub fn check_quick(&self) -> Result<(), Refused> {"):
    s = s.replace(f, f + "\n        #[allow(unreachable_code)]\n        return Ok(());", 1)
open(p, "w").write(s)
PY
(cd "$tree" && CARGO_TARGET_DIR="$root/target" cargo build --release -p kvtier)
cp -p target/release/kvtier "$out"
if [[ $have_release == 1 ]]; then cp -p "$keep" target/release/kvtier; fi
echo "built $out (peer checks off: for the A/B only)"
