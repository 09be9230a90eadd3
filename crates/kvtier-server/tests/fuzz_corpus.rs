//! Replays the checked-in fuzz corpora as regression tests on the stable
//! toolchain: every file of `fuzz/corpus/<target>/` (seeds and what
//! `scripts/fuzz.sh` found) and of `fuzz/regressions/<target>/` (inputs that
//! once crashed) goes through the same function the cargo-fuzz target runs
//! (`kvtier_server::fuzzing::TARGETS`), which asserts its invariants. A
//! target without a corpus, or a fuzz target this list does not know, fails
//! the test: it cannot pass by replaying nothing (fuzz/README.md).
use kvtier_server::fuzzing::TARGETS;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every corpus and regression file of `target`; fails naming each
/// input that panicked, with the command that replays it under libFuzzer.
fn replay(target: &str) {
    let run = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no entry point for fuzz target {target}"))
        .1;
    let corpus = files(&fuzz_dir().join("corpus").join(target));
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{target}/ is empty or missing: write its seeds \
         (KVTIER_WRITE_FUZZ_SEEDS=1 cargo test -p kvtier-server --test fuzz_seeds)"
    );
    let regressions = files(&fuzz_dir().join("regressions").join(target));
    let mut failed = Vec::new();
    for path in corpus.iter().chain(&regressions) {
        let input = std::fs::read(path).expect("a readable corpus file");
        if catch_unwind(AssertUnwindSafe(|| run(&input))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs panicked (see the panics above): {failed:#?}\n\
         replay one under libFuzzer: cargo +nightly fuzz run -a {target} FILE",
        failed.len(),
        corpus.len() + regressions.len(),
    );
}

#[test]
fn every_fuzz_target_is_replayed() {
    let mut declared: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .collect();
    declared.sort();
    let mut known: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    known.sort();
    assert_eq!(
        declared, known,
        "fuzz/fuzz_targets/ and fuzzing::TARGETS name the same targets"
    );
    for dir in ["corpus", "regressions"] {
        for sub in std::fs::read_dir(fuzz_dir().join(dir))
            .into_iter()
            .flatten()
        {
            let name = sub.expect("a directory entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                known.contains(&&*name),
                "fuzz/{dir}/{name} names no fuzz target"
            );
        }
    }
}

#[test]
fn data_plane() {
    replay("data_plane");
}

#[test]
fn decode_request() {
    replay("decode_request");
}

#[test]
fn disk_header() {
    replay("disk_header");
}

#[test]
fn http_request() {
    replay("http_request");
}

#[test]
fn kvstore_location() {
    replay("kvstore_location");
}

#[test]
fn object_decode() {
    replay("object_decode");
}
