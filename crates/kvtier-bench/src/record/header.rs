//! The header every perf record carries (perf/README.md, "The header"): six
//! top-level keys, first and in this order, whose names are fixed because a
//! check outside this repository reads them. perf/header.py writes the same
//! header from Python; this is the Rust side, for `kvtier bench`'s
//! `record.json`, `kvtier bench ab`'s record and the checks of
//! `kvtier bench compare`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Machine;

/// The header's keys, in the order every record starts with.
pub const HEADER_KEYS: [&str; 6] = ["date", "commit", "dirty", "machine", "command", "versions"];

/// The six keys (`Serialize` keeps this order; `#[serde(flatten)]` it into a record).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// UTC, RFC 3339 to the second.
    pub date: String,
    /// The checkout's HEAD (40 hex digits), `None` outside a git checkout.
    pub commit: Option<String>,
    /// Whether tracked files differed from `commit`.
    pub dirty: Option<bool>,
    /// The machine the measurement ran on.
    pub machine: Machine,
    /// The command line as executed, shell-quoted.
    pub command: String,
    /// Every tool the measurement used, with its version (`None`: unknown).
    pub versions: BTreeMap<String, Option<String>>,
}

impl Header {
    /// The header measured now, in the checkout that holds the current
    /// directory, for this process's command line.
    pub fn now(versions: BTreeMap<String, Option<String>>) -> Self {
        let (commit, dirty) = git_state(Path::new("."));
        Header {
            date: super::rfc3339_now(),
            commit,
            dirty,
            machine: Machine::detect(),
            command: shell_join(std::env::args()),
            versions,
        }
    }
}

/// `{"kvtier": this binary's version}`: the versions of a run that used only kvtier.
pub fn kvtier_version() -> BTreeMap<String, Option<String>> {
    BTreeMap::from([(
        "kvtier".to_string(),
        Some(env!("CARGO_PKG_VERSION").to_string()),
    )])
}

/// (HEAD's commit, whether tracked files differ from it) of the checkout
/// holding `dir`; `None` for what git cannot tell (no git, not a checkout).
/// The same test as perf/header.py: `git status --porcelain --untracked-files=no`.
pub fn git_state(dir: &Path) -> (Option<String>, Option<bool>) {
    let commit = git(dir, &["rev-parse", "HEAD"]);
    let status = git(dir, &["status", "--porcelain", "--untracked-files=no"]);
    (commit, status.map(|s| !s.is_empty()))
}

/// `git -C dir ARGS` trimmed stdout, `None` if git is missing or fails.
pub fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Arguments joined as a POSIX shell would need them typed: each one
/// single-quoted unless it is made only of safe characters.
pub fn shell_join(args: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    args.into_iter()
        .map(|a| {
            let a = a.as_ref();
            let safe = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c));
            if safe {
                a.to_string()
            } else {
                format!("'{}'", a.replace('\'', r#"'"'"'"#))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What is wrong with a record's header: a missing key or a value of the
/// wrong type (`null` is allowed where a field was never recorded), as
/// perf/records.py's `header_problems` says it.
pub fn header_problems(rec: &serde_json::Value) -> Vec<String> {
    let Some(o) = rec.as_object() else {
        return vec!["a record is a JSON object".into()];
    };
    let mut out: Vec<String> = HEADER_KEYS
        .iter()
        .filter(|k| !o.contains_key(**k))
        .map(|k| format!("no '{k}'"))
        .collect();
    for (k, ok, want) in [
        (
            "date",
            serde_json::Value::is_string as fn(&_) -> bool,
            "string",
        ),
        ("commit", serde_json::Value::is_string, "string"),
        ("dirty", serde_json::Value::is_boolean, "bool"),
        ("machine", serde_json::Value::is_object, "object"),
        ("command", serde_json::Value::is_string, "string"),
        ("versions", serde_json::Value::is_object, "object"),
    ] {
        if let Some(v) = o.get(k).filter(|v| !v.is_null() && !ok(v)) {
            out.push(format!("'{k}' is {v}, not a {want} or null"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_join_quotes_what_a_shell_would_split() {
        assert_eq!(
            shell_join(["kvtier", "bench", "--sla", "read.p99=1ms", "it's", ""]),
            r#"kvtier bench --sla read.p99=1ms 'it'"'"'s' ''"#
        );
    }

    #[test]
    fn header_serializes_its_keys_first_in_order() {
        let h = Header::now(kvtier_version());
        let text = serde_json::to_string(&h).unwrap();
        let pos: Vec<usize> = HEADER_KEYS
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(header_problems(&v).is_empty(), "{:?}", header_problems(&v));
        assert_eq!(
            header_problems(&serde_json::json!({"date": 3, "git_commit": "x"})),
            [
                "no 'commit'",
                "no 'dirty'",
                "no 'machine'",
                "no 'command'",
                "no 'versions'",
                "'date' is 3, not a string or null"
            ]
        );
    }
}
