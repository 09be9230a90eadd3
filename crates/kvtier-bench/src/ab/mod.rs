//! `kvtier bench ab`: did a change cost performance? Two binaries (two
//! revisions, or one revision with and without a setting) measured with the
//! same `kvtier bench` workload in one run, their repeats alternating
//! (base head, head base, ...) so that a slow phase of this shared machine
//! falls on both sides (notes/README.md: it drifts by up to 1.7× between
//! days). docs/bench.md, "A/B of two revisions", says how to use it.
//!
//! The parts: `build` finds or builds each side's binary (cached per
//! commit), `side` runs one repeat of one side (a fresh server, the
//! generator against it), `summary` turns the repeats into medians, ranges
//! and head / base ratios. This file holds the plan and the record.

pub mod build;
mod side;
mod summary;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

pub use build::{Binary, SideSpec};
pub use summary::{Metric, SideValues};

use crate::record::header::Header;

/// A setting of the head side only (`--variant KEY=VALUE`).
#[derive(Debug, Clone, PartialEq)]
pub enum Variant {
    /// A server config key (`server.max_inflight=512`, `engine.memory_capacity=1GiB`):
    /// the dotted path and its TOML value.
    Server(String, toml::Value),
    /// A `kvtier bench` option of the head side's generator (`bench.transport=grpc`):
    /// the arguments that replace the option's own.
    Bench(String, Vec<String>),
    /// An environment variable of the head side's server (`env._RJEM_MALLOC_CONF=...`).
    Env(String, String),
}

impl Variant {
    /// Parses `server.KEY=VALUE` (any config section: `server`, `engine`,
    /// `disk`, ...) and `env.NAME=VALUE`. VALUE is read as TOML (`512`,
    /// `true`, `"x"`) and taken as a string when it is not TOML (`1GiB`,
    /// empty). `bench.*` options are parsed by the CLI, which knows them.
    pub fn parse_setting(s: &str) -> anyhow::Result<Variant> {
        let (key, value) = s
            .split_once('=')
            .with_context(|| format!("--variant {s:?}: expected KEY=VALUE"))?;
        if let Some(name) = key.strip_prefix("env.") {
            return Ok(Variant::Env(name.to_string(), value.to_string()));
        }
        if key.split('.').count() < 2 || key.split('.').any(str::is_empty) {
            anyhow::bail!(
                "--variant {s:?}: KEY is a config key with its section (server.max_inflight, \
                 engine.memory_capacity), bench.OPTION or env.NAME"
            );
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        Ok(Variant::Server(key.to_string(), value))
    }
}

/// Which binary drives the load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Generator {
    /// The head side's binary drives both servers: only the server differs.
    Head,
    /// Each side's binary drives its own server: the client changes too.
    Own,
}

/// Everything `kvtier bench ab` was told.
#[derive(Debug, Clone)]
pub struct AbConfig {
    /// The base side (`--base REV`, `--base-bin PATH`).
    pub base: SideSpec,
    /// The head side (`--head REV`, default the working tree; `--head-bin PATH`).
    pub head: SideSpec,
    /// Settings of the head side only.
    pub variants: Vec<(String, Variant)>,
    /// Settings of both sides (`--set`: server config keys and `env.*`).
    pub settings: Vec<Variant>,
    /// Rounds; each measures both sides once.
    pub repeats: u32,
    /// The `kvtier bench` workload arguments both generators get.
    pub bench_args: Vec<String>,
    /// A config file both servers start from.
    pub server_config: Option<PathBuf>,
    /// Which binary drives the load.
    pub generator: Generator,
    /// `taskset -c` lists for the servers and the generator.
    pub server_cpus: Option<String>,
    /// See `server_cpus`.
    pub generator_cpus: Option<String>,
    /// Built revisions' binaries (default `<repo>/target/ab`).
    pub cache_dir: Option<PathBuf>,
    /// Where the record, the summary and every run's outputs go.
    pub out: PathBuf,
}

/// One side as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct SideRecord {
    /// The server's binary and what it was built from.
    pub binary: Binary,
    /// `--variant`s applied (head only).
    pub variants: Vec<String>,
    /// The server's effective configuration (`serve --print-config`).
    pub server_config: String,
    /// Environment variables set for the server.
    pub env: BTreeMap<String, String>,
    /// The generator's binary and its arguments.
    pub generator: PathBuf,
    /// See `generator`.
    pub bench_args: Vec<String>,
    /// Each repeat's `kvtier bench` record, relative to the output directory.
    pub runs: Vec<String>,
}

/// The record `kvtier bench ab` writes (docs/bench-record.md, "The A/B record").
#[derive(Debug, Clone, Serialize)]
pub struct AbRecord {
    /// The perf header, first.
    #[serde(flatten)]
    pub header: Header,
    /// `kvtier bench ab`.
    pub kind: &'static str,
    /// The base side.
    pub base: SideRecord,
    /// The head side.
    pub head: SideRecord,
    /// Which binary drove the load.
    pub generator: Generator,
    /// Rounds measured.
    pub repeats: u32,
    /// The sides in the order they ran.
    pub order: Vec<String>,
    /// Every metric: both sides, head / base of the medians, the spread.
    pub metrics: Vec<Metric>,
}

fn write_config(
    base: &toml::Table,
    variants: &[(String, Variant)],
    path: &Path,
) -> anyhow::Result<()> {
    let mut t = base.clone();
    for (_, v) in variants {
        if let Variant::Server(key, value) = v {
            let parts: Vec<&str> = key.split('.').collect();
            let mut table = &mut t;
            for p in &parts[..parts.len() - 1] {
                table = table
                    .entry(p.to_string())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .with_context(|| format!("--variant {key}: {p} is not a section"))?;
            }
            table.insert(parts[parts.len() - 1].to_string(), value.clone());
        }
    }
    std::fs::write(path, toml::to_string(&t)?)?;
    Ok(())
}

/// Builds (or finds) both binaries, runs the alternating repeats and writes
/// `record.json` and `summary.md` into `cfg.out`.
pub fn run(cfg: &AbConfig) -> anyhow::Result<AbRecord> {
    let repo = build::repo_root().ok();
    let cache = match (&cfg.cache_dir, &repo) {
        (Some(c), _) => c.clone(),
        (None, Some(r)) => r.join("target").join("ab"),
        (None, None) => PathBuf::from("target/ab"),
    };
    let base_bin = build::binary(repo.as_deref(), &cfg.base, &cache, "--base")?;
    let head_bin = build::binary(repo.as_deref(), &cfg.head, &cache, "--head")?;
    let runs_dir = cfg.out.join("runs");
    std::fs::create_dir_all(&runs_dir)
        .with_context(|| format!("creating {}", runs_dir.display()))?;
    let shared: toml::Table = match &cfg.server_config {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("parsing {}", p.display()))?,
        None => toml::Table::new(),
    };
    let mut plans = Vec::new();
    for (name, bin, variants) in [
        ("base", &base_bin, &[][..]),
        ("head", &head_bin, &cfg.variants[..]),
    ] {
        let config = runs_dir.join(format!("{name}.toml"));
        let both = cfg.settings.iter().map(|v| (String::new(), v.clone()));
        let all: Vec<(String, Variant)> = both.chain(variants.iter().cloned()).collect();
        write_config(&shared, &all, &config)?;
        let mut bench_args = cfg.bench_args.clone();
        let mut env = Vec::new();
        for (_, v) in &all {
            match v {
                Variant::Bench(flag, args) => {
                    bench_args = without_option(&bench_args, flag);
                    bench_args.extend(args.iter().cloned());
                }
                Variant::Env(k, val) => env.push((k.clone(), val.clone())),
                Variant::Server(..) => {}
            }
        }
        bench_args.push("--quiet".into());
        let generator = match cfg.generator {
            Generator::Head => head_bin.path.clone(),
            Generator::Own => bin.path.clone(),
        };
        plans.push(side::Plan {
            server: bin.path.clone(),
            generator,
            config,
            env,
            bench_args,
            server_cpus: cfg.server_cpus.clone(),
            generator_cpus: cfg.generator_cpus.clone(),
        });
    }
    let effective: Vec<String> = plans
        .iter()
        .map(side::effective_config)
        .collect::<anyhow::Result<_>>()?;
    let mut outcomes: [Vec<side::Outcome>; 2] = [Vec::new(), Vec::new()];
    let mut order = Vec::new();
    let mut run_paths: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    for r in 0..cfg.repeats.max(1) {
        // base head, head base, ...: neither side always runs first.
        let sides: [usize; 2] = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in sides {
            let name = ["base", "head"][i];
            let dir = runs_dir.join(format!("{name}-{r}"));
            let o =
                side::measure(&plans[i], &dir).with_context(|| format!("repeat {r}, {name}"))?;
            eprintln!("repeat {}/{}: {name} done", r + 1, cfg.repeats.max(1));
            run_paths[i].push(format!("runs/{name}-{r}/bench/record.json"));
            outcomes[i].push(o);
            order.push(name.to_string());
        }
    }
    let metrics = summary::metrics(&outcomes[0], &outcomes[1]);
    let mut versions = crate::record::header::kvtier_version();
    versions.insert("kvtier (base)".into(), base_bin.version.clone());
    versions.insert("kvtier (head)".into(), head_bin.version.clone());
    let side_record = |i: usize, bin: Binary| {
        let p = &plans[i];
        SideRecord {
            binary: bin,
            variants: if i == 1 {
                cfg.variants.iter().map(|(s, _)| s.clone()).collect()
            } else {
                Vec::new()
            },
            server_config: effective[i].clone(),
            env: p.env.iter().cloned().collect(),
            generator: p.generator.clone(),
            bench_args: p.bench_args.clone(),
            runs: run_paths[i].clone(),
        }
    };
    let rec = AbRecord {
        header: Header::now(versions),
        kind: "kvtier bench ab",
        base: side_record(0, base_bin),
        head: side_record(1, head_bin),
        generator: cfg.generator,
        repeats: cfg.repeats.max(1),
        order,
        metrics,
    };
    std::fs::write(
        cfg.out.join("record.json"),
        serde_json::to_string_pretty(&rec)? + "\n",
    )?;
    std::fs::write(cfg.out.join("summary.md"), summary::render(&rec))?;
    Ok(rec)
}

/// `args` without `--flag`, `--flag VALUE` and `--flag=VALUE`.
fn without_option(args: &[String], flag: &str) -> Vec<String> {
    let long = format!("--{flag}");
    let mut out = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if *a == long {
            // Its value, if the next argument is one.
            if it.peek().is_some_and(|n| !n.starts_with("--")) {
                it.next();
            }
        } else if !a.starts_with(&format!("{long}=")) {
            out.push(a.clone());
        }
    }
    out
}

/// The markdown summary of a record (what `summary.md` holds).
pub fn render(rec: &AbRecord) -> String {
    summary::render(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_as_toml_or_as_strings() {
        assert_eq!(
            Variant::parse_setting("server.max_inflight=512").unwrap(),
            Variant::Server("server.max_inflight".into(), toml::Value::Integer(512))
        );
        assert_eq!(
            Variant::parse_setting("server.resident_limit=1TiB").unwrap(),
            Variant::Server("server.resident_limit".into(), "1TiB".into())
        );
        assert_eq!(
            Variant::parse_setting("server.data_tcp_congestion=").unwrap(),
            Variant::Server("server.data_tcp_congestion".into(), "".into())
        );
        assert_eq!(
            Variant::parse_setting("env.X=a=b").unwrap(),
            Variant::Env("X".into(), "a=b".into())
        );
        assert!(Variant::parse_setting("max_inflight=5").is_err());
        assert!(Variant::parse_setting("server.x").is_err());
    }

    #[test]
    fn an_option_is_removed_in_each_of_its_forms() {
        let args: Vec<String> = [
            "--transport",
            "grpc",
            "--duration=1s",
            "--probe",
            "--transport=x",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            without_option(&args, "transport"),
            ["--duration=1s", "--probe"]
        );
        assert_eq!(
            without_option(&args, "probe"),
            ["--transport", "grpc", "--duration=1s", "--transport=x"]
        );
    }
}
