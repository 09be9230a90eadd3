//! kvtier bench: latency-vs-concurrency sweeps, their analysis and reports.
//!
//! The crate in four parts:
//!
//! * **the generator**: [`run`] (a sweep, its processes and competitors), [`load`]
//!   (closed and open loops), [`workloads`] (what each worker sends),
//!   [`probe`] (raw TCP throughput) and [`netobs`] (the congestion control each
//!   system's sockets ran);
//! * **the competitors** ([`competitors`]): Redis through a RESP2 client or `redis-rs`,
//!   Mooncake Store through its Python API;
//! * **the record** ([`record`]): a versioned schema, filled by
//!   [`builder::StepBuilder`] from the generator's histograms;
//! * **analysis and outputs**: [`analysis`] (self-checks, knees, USL, SLAs,
//!   coordinated omission, comparisons with competitors under the rules, `compare`
//!   between two records), rendered by [`summary`] and [`report`]
//!   ([`write_outputs`]).

pub mod ab;
pub mod analysis;
pub mod builder;
pub mod competitors;
pub mod diff;
pub mod load;
pub mod netobs;
pub mod probe;
pub mod record;
pub mod report;
pub mod run;
pub mod summary;
pub mod workloads;

#[cfg(test)]
mod testutil;

use std::path::Path;

pub use analysis::analyze;
pub use analysis::compare::{compare, render_comparison};
pub use record::Record;
pub use report::render_report;
pub use summary::render_summary;

/// Analyses a copy of `record` ([`analysis::analyze`]) and writes
/// `record.json`, `summary.md` and `report.html` into `dir` (created if missing).
pub fn write_outputs(dir: impl AsRef<Path>, record: &Record) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut r = record.clone();
    analyze(&mut r);
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write("record.json", &(serde_json::to_string_pretty(&r)? + "\n"))?;
    write("summary.md", &render_summary(&r))?;
    write("report.html", &render_report(&r)?)?;
    Ok(())
}

/// Reads two `record.json` files and renders the regression table (`kvtier bench compare A B`).
pub fn compare_files(a: impl AsRef<Path>, b: impl AsRef<Path>) -> anyhow::Result<String> {
    use anyhow::Context;
    let read = |p: &Path| -> anyhow::Result<Record> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        Record::from_json(&text).with_context(|| format!("parsing {}", p.display()))
    };
    Ok(render_comparison(&compare(
        &read(a.as_ref())?,
        &read(b.as_ref())?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_three_files_and_compares_them() {
        let dir = std::env::temp_dir().join(format!("kvtier-bench-test-{}", std::process::id()));
        let r = testutil::synthetic_record();
        write_outputs(&dir, &r).unwrap();
        let back =
            Record::from_json(&std::fs::read_to_string(dir.join("record.json")).unwrap()).unwrap();
        assert!(back.analysis.is_some());
        assert!(
            std::fs::read_to_string(dir.join("summary.md"))
                .unwrap()
                .contains("## Recommendations")
        );
        assert!(
            std::fs::read_to_string(dir.join("report.html"))
                .unwrap()
                .contains("data-charts-expected")
        );
        let table = compare_files(dir.join("record.json"), dir.join("record.json")).unwrap();
        assert!(table.contains("| c=1 | read | p50 |"), "{table}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
