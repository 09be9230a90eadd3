#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time, coverage-guided
# (libFuzzer), growing and then minimizing its corpus in fuzz/corpus/<target>/
# (the seeds, seed-*, are kept). A crash, a hang (-timeout) or running out of
# memory fails the script; the input stays in fuzz/artifacts/<target>/ and the
# commands that replay it are printed. fuzz/README.md says what each target
# checks and what to do with a crash.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default: 60, every target)
# Needs a nightly toolchain (libFuzzer's instrumentation takes -Z flags) and
# cargo-fuzz, which this script installs into .tools/cargo-fuzz when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[ $# -gt 0 ] && shift
case $secs in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2 ;; esac
CARGO_FUZZ_VERSION=0.13.2

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "scripts/fuzz.sh: no nightly Rust toolchain; installing one (rustup toolchain install nightly --profile minimal)" >&2
  rustup toolchain install nightly --profile minimal || {
    echo "scripts/fuzz.sh: needs a nightly toolchain (cargo-fuzz builds with -Zsanitizer=address and libFuzzer's" >&2
    echo "  coverage instrumentation), and rustup could not install one. Install it, then run this again." >&2
    echo "  Without it, \`cargo test -p kvtier-server --test fuzz_corpus\` still replays the corpora on stable." >&2
    exit 2
  }
fi
if cargo +nightly fuzz --version >/dev/null 2>&1; then
  fuzz=(cargo +nightly fuzz)
else
  bin=.tools/cargo-fuzz/bin/cargo-fuzz
  if ! "$bin" --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    echo "scripts/fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION into .tools/cargo-fuzz" >&2
    cargo install --locked --quiet --version "$CARGO_FUZZ_VERSION" --root .tools/cargo-fuzz cargo-fuzz
  fi
  # cargo-fuzz runs as `cargo fuzz`, so it finds cargo on PATH; +nightly picks the toolchain.
  export PATH="$PWD/.tools/cargo-fuzz/bin:$PATH"
  fuzz=(cargo +nightly fuzz)
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <("${fuzz[@]}" list)
fi
# -a: debug assertions on, as in `cargo test`, so an integer overflow is a crash.
"${fuzz[@]}" build -a
bin_dir=fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/release
# As cargo-fuzz sets it: the instrumented std and the target may both define
# a global, which is not a bug of ours.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_odr_violation=0}

failed=()
started=$(mktemp)  # artifacts newer than this are this run's
trap 'rm -f "$started"' EXIT
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/$t
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  before=$(find "$corpus" -type f | wc -l)
  echo "== $t: ${secs}s from $before inputs"
  # -timeout: an input that takes longer than 30 s is a hang (the entry
  # points give up on their own after 10 s); -rss_limit_mb: a memory blow-up.
  # The binary built above, as `cargo fuzz run -a` would run it (that would
  # rebuild first whenever the sources changed since, mid-run).
  if ! "$bin_dir/$t" "$corpus" -artifact_prefix="fuzz/artifacts/$t/" -max_total_time="$secs" \
      -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 >"fuzz/artifacts/$t/last-run.log" 2>&1; then
    tail -n 40 "fuzz/artifacts/$t/last-run.log"
    failed+=("$t")
    continue
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added)' "fuzz/artifacts/$t/last-run.log" || true
  # Minimize: keep the seeds, then add the fewest inputs that reach the code
  # edges they do not (a greedy set cover; hit counts are not kept), so the
  # checked-in corpus stays at a few hundred small files for all targets.
  min=$(mktemp -d)
  cp "$corpus"/seed-* "$min"/ 2>/dev/null || true
  "$bin_dir/$t" -set_cover_merge=1 -use_counters=0 -timeout=30 -rss_limit_mb=4096 "$min" "$corpus" >"fuzz/artifacts/$t/merge.log" 2>&1 || {
    tail -n 20 "fuzz/artifacts/$t/merge.log"
    failed+=("$t")
    rm -rf "$min"
    continue
  }
  find "$corpus" -type f -delete
  cp "$min"/* "$corpus"/
  rm -rf "$min"
  echo "   corpus: $before -> $(find "$corpus" -type f | wc -l) inputs, $(du -sh "$corpus" | cut -f1)"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo
  echo "scripts/fuzz.sh: FAILED: ${failed[*]}"
  for t in "${failed[@]}"; do
    for a in $(find "fuzz/artifacts/$t" -type f ! -name '*.log' -newer "$started"); do
      echo "  $t: $a"
      echo "    replay under libFuzzer: cargo +nightly fuzz run -a $t $a"
      echo "    keep it as a regression: mkdir -p fuzz/regressions/$t && cp $a fuzz/regressions/$t/"
      echo "      then: cargo test -p kvtier-server --test fuzz_corpus"
    done
  done
  exit 1
fi
echo "scripts/fuzz.sh: ${#targets[@]} targets, ${secs}s each: no crash"
