#!/usr/bin/env bash
# Builds kvtier._native, the Rust client core as a Python extension module
# (crates/kvtier-py), and puts it in python/kvtier/ where the SDK imports it
# from a checkout (an editable install or PYTHONPATH=python). A wheel built
# from python/ ships the same file (python/setup.py runs this script).
# Needs Rust >= 1.89 and Python >= 3.11 (the limited API's buffer protocol).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CARGO="${CARGO:-cargo}"
export PYO3_PYTHON="$("$PYTHON" -c 'import sys; print(sys.executable)')"
"$CARGO" build -q --locked -p kvtier-py --profile native --features extension-module
target_dir="$("$CARGO" metadata --format-version 1 --no-deps | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
src="$target_dir/native/lib_native.so"
dest="python/kvtier/_native.abi3.so"
# Replaced by rename, never rewritten in place: a process that has it loaded keeps its copy.
cp "$src" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "built $dest"
