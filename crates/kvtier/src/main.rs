//! `kvtier`: the server (`kvtier serve`), CLI verbs against a running server
//! (`put`, `get`, `lookup`, `delete`, `stats`) and the benchmark harness (`bench`).
mod bench;
mod cli;
mod demo;
mod serve;

use clap::{Parser, Subcommand};

/// Large block buffers are allocated per write and kept by the memory tier;
/// jemalloc reuses freed extents where glibc maps and clears fresh pages each
/// time (profile and measurement in notes/006-data-plane.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// kvtier: tiered KV-cache block store for LLM inference.
#[derive(Parser, Debug)]
#[command(name = "kvtier", version, about, propagate_version = true)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the server.
    Serve(serve::ServeArgs),
    /// Store a value / block.
    Put(cli::PutArgs),
    /// Fetch a value / block.
    Get(cli::GetArgs),
    /// How many leading blocks of a chain are stored.
    Lookup(cli::LookupArgs),
    /// Delete blocks.
    Delete(cli::DeleteArgs),
    /// Server statistics.
    Stats(cli::CommonArgs),
    /// Drive a small multi-turn prompt workload against a server and report.
    Demo(demo::DemoArgs),
    /// Latency-vs-concurrency sweep (or `bench compare A B`).
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match args.cmd {
            Cmd::Serve(a) => serve::run(a).await,
            Cmd::Put(a) => cli::put(a).await,
            Cmd::Get(a) => cli::get(a).await,
            Cmd::Lookup(a) => cli::lookup(a).await,
            Cmd::Delete(a) => cli::delete(a).await,
            Cmd::Stats(a) => cli::stats(a).await,
            Cmd::Demo(a) => demo::run(a).await,
            Cmd::Bench(a) => bench::run(a).await,
        }
    })
}
