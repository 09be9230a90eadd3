//! The two binaries of an A/B: a revision built once and cached, the working
//! tree built as it is, or a binary given on the command line.
//!
//! A commit is built in a detached `git worktree` under the cache directory
//! (`target/ab/` by default), with one cargo target directory shared by every
//! revision (`target/ab/cargo-target`: dependencies compile once, and the
//! checkout's own `target/release/kvtier` is never overwritten by an old
//! revision). The binary is copied to `<cache>/<commit>/kvtier` and the
//! worktree removed; a later run finds that file and builds nothing. A
//! commit's sources do not change, so its binary is never stale; the working
//! tree's is rebuilt by cargo, which does nothing when nothing changed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::record::header::{git, git_state};

/// Where one side's binary comes from.
#[derive(Debug, Clone, Default)]
pub struct SideSpec {
    /// A revision (`HEAD~1`, a tag, a commit); `None`: the working tree.
    pub rev: Option<String>,
    /// A binary to run instead of building (`--base-bin`, `--head-bin`).
    pub bin: Option<PathBuf>,
}

/// One side's binary and what it was built from.
#[derive(Debug, Clone, Serialize)]
pub struct Binary {
    /// The revision as given (`working tree` for the default head).
    pub rev: String,
    /// The commit it resolves to (the working tree's HEAD), if known.
    pub commit: Option<String>,
    /// The working tree's tracked files differed from `commit` (only for a
    /// working-tree build; a commit is never dirty).
    pub dirty: Option<bool>,
    /// `built`, `cached`, `working tree` or `given` (`--base-bin` / `--head-bin`:
    /// the caller vouches that it is `rev`).
    pub how: String,
    /// The executable run.
    pub path: PathBuf,
    /// Its `--version`.
    pub version: Option<String>,
}

/// The repository holding the current directory.
pub fn repo_root() -> anyhow::Result<PathBuf> {
    git(Path::new("."), &["rev-parse", "--show-toplevel"])
        .map(PathBuf::from)
        .context("kvtier bench ab builds revisions of a git checkout: run it inside one (or give --base-bin and --head-bin)")
}

/// `rev`'s full commit id in `repo`.
pub fn resolve_commit(repo: &Path, rev: &str) -> anyhow::Result<String> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )
    .filter(|s| !s.is_empty())
    .with_context(|| format!("{rev:?} is not a commit of {}", repo.display()))
}

/// The binary of one side: given, cached, built now, or the working tree's.
/// `flag` names the side's option in messages (`--base`, `--head`).
pub fn binary(
    repo: Option<&Path>,
    spec: &SideSpec,
    cache: &Path,
    flag: &str,
) -> anyhow::Result<Binary> {
    if let Some(bin) = &spec.bin {
        if !bin.is_file() {
            bail!("{flag}-bin {}: no such file", bin.display());
        }
        let commit = match (repo, &spec.rev) {
            (Some(r), Some(rev)) => resolve_commit(r, rev).ok(),
            _ => None,
        };
        return Ok(with_version(Binary {
            rev: spec.rev.clone().unwrap_or_else(|| "given".into()),
            commit,
            dirty: None,
            how: "given".into(),
            path: std::path::absolute(bin)?,
            version: None,
        }));
    }
    let repo = repo.context("no git checkout to build from")?;
    let Some(rev) = &spec.rev else {
        let (commit, dirty) = git_state(repo);
        eprintln!("{flag}: building the working tree (cargo build --release -p kvtier)");
        let path = cargo_build(repo, None)?;
        return Ok(with_version(Binary {
            rev: "working tree".into(),
            commit,
            dirty,
            how: "working tree".into(),
            path,
            version: None,
        }));
    };
    let commit = resolve_commit(repo, rev).with_context(|| format!("{flag} {rev}"))?;
    let path = cache.join(&commit).join("kvtier");
    let how = if path.is_file() {
        eprintln!("{flag} {rev}: cached {}", path.display());
        "cached"
    } else {
        build_commit(repo, &commit, cache, flag)?;
        "built"
    };
    Ok(with_version(Binary {
        rev: rev.clone(),
        commit: Some(commit),
        dirty: Some(false),
        how: how.into(),
        path: std::path::absolute(&path)?,
        version: None,
    }))
}

fn with_version(mut b: Binary) -> Binary {
    b.version = Command::new(&b.path)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    b
}

/// Builds `commit` in a worktree under `cache` and leaves its binary at
/// `<cache>/<commit>/kvtier`.
fn build_commit(repo: &Path, commit: &str, cache: &Path, flag: &str) -> anyhow::Result<()> {
    let dir = cache.join(commit);
    let tree = dir.join("tree");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if tree.exists() {
        // Left by a build that was interrupted.
        let _ = git(
            repo,
            &["worktree", "remove", "--force", &tree.to_string_lossy()],
        );
        let _ = std::fs::remove_dir_all(&tree);
        let _ = git(repo, &["worktree", "prune"]);
    }
    eprintln!(
        "{flag}: building {commit} in {} (a release build; cached for later runs)",
        tree.display()
    );
    let st = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["worktree", "add", "--detach"])
        .arg(&tree)
        .arg(commit)
        .stdout(Stdio::null())
        .status()
        .context("running git worktree add")?;
    if !st.success() {
        bail!("git worktree add {} {commit} failed", tree.display());
    }
    let built = cargo_build(&tree, Some(&cache.join("cargo-target")));
    let _ = git(
        repo,
        &["worktree", "remove", "--force", &tree.to_string_lossy()],
    );
    let exe = built.with_context(|| format!("building {commit}"))?;
    // Copied under another name, then renamed: a run that stops half-way
    // leaves no binary a later run would take for a finished one.
    let tmp = dir.join("kvtier.partial");
    std::fs::copy(&exe, &tmp).with_context(|| format!("copying {}", exe.display()))?;
    std::fs::rename(&tmp, dir.join("kvtier"))?;
    Ok(())
}

/// `cargo build --release -p kvtier` in `dir` (with `target` as
/// CARGO_TARGET_DIR if given); the executable cargo reports.
fn cargo_build(dir: &Path, target: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(dir)
        .args([
            "build",
            "--release",
            "-p",
            "kvtier",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped());
    if let Some(t) = target {
        c.env("CARGO_TARGET_DIR", t);
    }
    let out = c.output().context("running cargo build")?;
    if !out.status.success() {
        bail!(
            "cargo build --release -p kvtier failed in {}",
            dir.display()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "kvtier")
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .next_back()
        .context("cargo built no kvtier executable")
}
