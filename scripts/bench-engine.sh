#!/usr/bin/env bash
# Engine baseline (notes/001-engine-baseline): criterion benches of the engine in
# process, then a perf record with the medians. Usage: scripts/bench-engine.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p kvtier-core --bench engine -- --noplot "$@" | tee target/bench-engine.log
python3 scripts/criterion_record.py "scripts/bench-engine.sh" target/criterion notes/001-engine-baseline.json
