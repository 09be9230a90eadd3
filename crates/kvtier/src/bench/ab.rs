//! `kvtier bench ab`: the flags, and the workload options handed to both
//! sides' generators exactly as they were typed (docs/bench.md, "A/B of two
//! revisions"). The measurement itself is `kvtier_bench::ab`.
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory};
use kvtier_bench::ab::{AbConfig, Generator, SideSpec, Variant};

use super::RunArgs;

/// Flags of `kvtier bench ab`; every `kvtier bench` workload option too.
#[derive(Args, Debug)]
pub struct AbArgs {
    /// The revision to compare against (a commit, tag, `HEAD~1`); built in a
    /// worktree and cached per commit under target/ab/.
    #[arg(long, required_unless_present = "base_bin")]
    base: Option<String>,
    /// The revision measured against the base [default: the working tree,
    /// uncommitted changes included; the record says whether it was dirty].
    #[arg(long)]
    head: Option<String>,
    /// A setting of the head side only, repeatable: a server config key
    /// (`server.max_inflight=512`, `engine.memory_capacity=1GiB`), a bench
    /// option of the head's generator (`bench.transport=grpc`), or an
    /// environment variable of the head's server (`env._RJEM_MALLOC_CONF=...`).
    /// With `--base HEAD --head HEAD`: one binary with and without it.
    #[arg(long, value_name = "KEY=VALUE")]
    variant: Vec<String>,
    /// A setting of both sides, repeatable: a server config key
    /// (`engine.memory_capacity=512MiB`) or `env.NAME=VALUE`.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Rounds, each running both sides once in alternating order (base
    /// head, head base, ...). Not `--repeat`, which repeats each step inside
    /// one bench run.
    #[arg(long, default_value_t = 3)]
    repeats: u32,
    /// Run this binary as the base instead of building `--base` (the record
    /// says it was given).
    #[arg(long, value_name = "PATH")]
    base_bin: Option<PathBuf>,
    /// Run this binary as the head instead of building it.
    #[arg(long, value_name = "PATH")]
    head_bin: Option<PathBuf>,
    /// A server config file both sides start from (variants apply on top).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Which binary drives the load: `head` (the head's generator drives
    /// both servers, so only the server differs) or `own` (each side drives
    /// its own server: client changes count too).
    #[arg(long, default_value = "head", value_parser = parse_generator)]
    generator: Generator,
    /// CPUs of each side's server (`taskset -c` list, e.g. 1).
    #[arg(long)]
    server_cpus: Option<String>,
    /// CPUs of the generator (`taskset -c` list, e.g. 0).
    #[arg(long)]
    generator_cpus: Option<String>,
    /// Where built revisions are cached [default: <checkout>/target/ab].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

fn parse_generator(s: &str) -> Result<Generator, String> {
    match s {
        "head" => Ok(Generator::Head),
        "own" => Ok(Generator::Own),
        _ => Err(format!("{s:?}: expected head or own")),
    }
}

/// `kvtier bench` options that `bench ab` sets itself or does not pass on.
const NOT_PASSED: [&str; 5] = ["spawn", "target", "out", "worker", "quiet"];

/// The options of `kvtier bench` (`RunArgs`) as clap knows them.
fn run_options() -> clap::Command {
    RunArgs::augment_args(clap::Command::new("bench"))
}

/// The workload options given on this command line, as `--name=value`
/// arguments for the generators. Read back from clap's parse of the
/// process's own arguments, so every `kvtier bench` option passes through
/// as typed, defaults left to the generator.
fn passed_through() -> anyhow::Result<Vec<String>> {
    let m = crate::Args::command().try_get_matches_from(std::env::args_os())?;
    let m: &ArgMatches = m
        .subcommand_matches("bench")
        .and_then(|b| b.subcommand_matches("ab"))
        .ok_or_else(|| anyhow::anyhow!("not a `kvtier bench ab` command line"))?;
    let mut out = Vec::new();
    for arg in run_options().get_arguments() {
        let id = arg.get_id().as_str();
        if NOT_PASSED.contains(&id) || m.value_source(id) != Some(ValueSource::CommandLine) {
            continue;
        }
        let long = arg.get_long().unwrap_or(id);
        if arg.get_action().takes_values() {
            for v in m.get_raw(id).into_iter().flatten() {
                let v: OsString = v.to_owned();
                out.push(format!("--{long}={}", v.to_string_lossy()));
            }
        } else {
            out.push(format!("--{long}"));
        }
    }
    Ok(out)
}

/// `bench.NAME=VALUE`: NAME must be a `kvtier bench` option; a flag takes
/// `true` or `false`.
fn bench_variant(name: &str, value: &str) -> anyhow::Result<Variant> {
    let cmd = run_options();
    let arg = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(name) && !NOT_PASSED.contains(&a.get_id().as_str()))
        .ok_or_else(|| {
            anyhow::anyhow!("--variant bench.{name}: not a `kvtier bench` workload option")
        })?;
    let args = if arg.get_action().takes_values() {
        vec![format!("--{name}={value}")]
    } else {
        match value {
            "true" => vec![format!("--{name}")],
            "false" => Vec::new(),
            _ => anyhow::bail!("--variant bench.{name}={value}: a flag is true or false"),
        }
    };
    Ok(Variant::Bench(name.to_string(), args))
}

/// Runs `kvtier bench ab` (blocking: it builds, starts servers and waits).
pub fn run(a: AbArgs) -> anyhow::Result<()> {
    if a.run.target.is_some() || a.run.spawn {
        anyhow::bail!("kvtier bench ab starts each side's server itself: no --target or --spawn");
    }
    if a.run.workload.is_none() {
        anyhow::bail!("--workload is required (the workload both sides run)");
    }
    let out = a
        .run
        .out
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--out DIR is required"))?;
    let mut variants = Vec::new();
    for v in &a.variant {
        let parsed = match v.split_once('=') {
            Some((k, val)) if k.starts_with("bench.") => bench_variant(&k["bench.".len()..], val)?,
            _ => Variant::parse_setting(v)?,
        };
        variants.push((v.clone(), parsed));
    }
    let settings = a
        .set
        .iter()
        .map(|s| match Variant::parse_setting(s)? {
            v @ (Variant::Server(..) | Variant::Env(..)) => Ok(v),
            Variant::Bench(..) => anyhow::bail!("--set {s}: give bench options as they are"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cfg = AbConfig {
        base: SideSpec {
            rev: a.base,
            bin: a.base_bin,
        },
        head: SideSpec {
            rev: a.head,
            bin: a.head_bin,
        },
        variants,
        settings,
        repeats: a.repeats,
        bench_args: passed_through()?,
        server_config: a.config,
        generator: a.generator,
        server_cpus: a.server_cpus,
        generator_cpus: a.generator_cpus,
        cache_dir: a.cache_dir,
        out: out.clone(),
    };
    let rec = kvtier_bench::ab::run(&cfg)?;
    crate::cli::print(kvtier_bench::ab::render(&rec))?;
    crate::cli::print(format!(
        "wrote {0}/record.json, {0}/summary.md (each run under {0}/runs/)\n",
        out.display()
    ))
}
