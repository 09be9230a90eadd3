//! `kvtier`: the server (`kvtier serve`), CLI verbs against a running server
//! (`put`, `get`, `lookup`, `delete`, `stats`) and the benchmark harness (`bench`).
mod bench;
mod cli;
mod demo;
#[cfg(feature = "jemalloc")]
mod purge;
mod serve;

use clap::{Parser, Subcommand};

/// Large block buffers are allocated per write and kept by the memory tier;
/// jemalloc reuses freed extents where glibc maps and clears fresh pages each
/// time (profile and measurement in notes/006-data-plane.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (its `malloc_conf` symbol): freed
/// pages are never handed back to the kernel by the allocator's own decay.
/// Under steady eviction a freed block's pages are wanted again at once, and
/// handing them back cost up to a quarter of a 1.2 MB write in page faults
/// and zeroing (notes/016: 1.34× writes/s without it; notes/025: 1.03×
/// pooled over ten repeats on a quieter day). This applies to every subcommand, `kvtier bench`'s
/// generator included; only `serve` runs the watcher. What is kept
/// is bounded instead by `server.resident_limit`: above it the watcher in
/// `purge.rs` hands every freed page back. `_RJEM_MALLOC_CONF` at run time
/// still overrides these (jemalloc reads it after this string).
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code, non_upper_case_globals)]
// SAFETY: jemalloc declares `const char *malloc_conf` (weak, `_rjem_`-prefixed
// as tikv-jemalloc-sys builds it); this is a thin pointer to a NUL-terminated
// string that lives for the whole process and is never written.
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 36] = b"dirty_decay_ms:-1,muzzy_decay_ms:-1\0";

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
    Serve(Box<serve::ServeArgs>),
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
    /// Exit 0 when the server answers grpc.health.v1 SERVING (probes, HEALTHCHECK).
    Health(cli::CommonArgs),
    /// Drive a small multi-turn prompt workload against a server and report.
    Demo(demo::DemoArgs),
    /// Latency-vs-concurrency sweep (or `bench ab`, `bench compare A B`).
    Bench(bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    use std::io::IsTerminal as _;
    // The server, the demo and the bench report what they do; a one-shot
    // command (put, get, stats, ...) prints its answer and, on stderr, only
    // what went wrong (`RUST_LOG=info` shows the client's transport too).
    let default = match &args.cmd {
        Cmd::Serve(_) | Cmd::Demo(_) | Cmd::Bench(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never in files, pipes or journald.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // The flag that names the server, for hints.
    let flag = match &args.cmd {
        Cmd::Bench(_) => "--target URL",
        _ => "--server URL (or KVTIER_SERVER)",
    };
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `kvtier stats | head -2`: the reader left; exit as a program
        // killed by SIGPIPE would (128 + 13), quietly.
        Err(e) if e.is::<cli::StdoutClosed>() => std::process::ExitCode::from(141),
        Err(e) => {
            eprintln!("{}", report(&e, flag));
            std::process::ExitCode::FAILURE
        }
    }
}

/// One readable error: the message, the storage error behind it (a core
/// error names the path or key; its own source is the bare OS error), the
/// root cause, each only if it adds something, and a hint for the mistakes
/// people make (no server running, a wrong address or port, TLS on one side
/// only, a missing or wrong token). `flag` names the option that sets the
/// server's address.
fn report(e: &anyhow::Error, flag: &str) -> String {
    use std::error::Error as _;
    // Every gRPC status the server sent is printed once: its code and message
    // (not the context, the client's wrapper and tonic's rendering of it).
    // A status that tonic made from a failed connection has a source: that is
    // a transport failure, reported as one.
    let transport = e.chain().any(|c| c.is::<tonic::transport::Error>());
    if let Some(s) = e
        .chain()
        .find_map(|c| c.downcast_ref::<tonic::Status>())
        .filter(|s| s.source().is_none())
    {
        let mut parts: Vec<String> = e
            .chain()
            .take_while(|c| !c.is::<kvtier_client::ClientError>() && !c.is::<tonic::Status>())
            .map(|c| c.to_string())
            .collect();
        parts.push(match s.code() {
            tonic::Code::Unauthenticated => "authentication failed".into(),
            tonic::Code::PermissionDenied => "permission denied".into(),
            c => c.description().to_string(),
        });
        if !s.message().is_empty() {
            parts.push(s.message().to_string());
        }
        let mut out = format!("error: {}", parts.join(": "));
        match s.code() {
            tonic::Code::Unauthenticated => out.push_str(
                "\nhint: this server has authentication on: give a valid token with \
                 --token TOKEN (or the KVTIER_TOKEN environment variable); docs/security.md",
            ),
            tonic::Code::PermissionDenied => out.push_str(
                "\nhint: the token given (--token / KVTIER_TOKEN) is valid but may not do this: \
                 its namespace prefixes or its access (read, read-write) do not cover the request",
            ),
            _ => {}
        }
        return out;
    }
    let mut out = format!("error: {e}");
    let core = e
        .chain()
        .filter_map(|c| c.downcast_ref::<kvtier_core::Error>())
        .last()
        .map(|c| c.to_string());
    for text in core.into_iter().chain([e.root_cause().to_string()]) {
        if !out.contains(&text) {
            out.push_str(&format!(": {text}"));
        }
    }
    let text = format!("{e:#}");
    if text.contains("Connection refused") || text.contains("tcp connect error") {
        out.push_str(&format!(
            "\nhint: no kvtier server answers at that address; start one with `kvtier serve` \
             or point the CLI at yours with {flag}"
        ));
    } else if text.contains("dns error") || text.contains("failed to lookup address") {
        out.push_str(&format!(
            "\nhint: the server's host name does not resolve; check {flag}"
        ));
    } else if text.contains("invalid peer certificate") {
        out.push_str(
            "\nhint: the server's certificate is not signed by the CA in --tls-ca (KVTIER_TLS_CA) \
             or does not name the address used (docs/security.md)",
        );
    } else if transport && !text.contains("timed out") {
        // Something answered, but not as kvtier's gRPC with the same TLS
        // setting: the HTTP or data-plane port, or TLS on one side only.
        out.push_str(
            "\nhint: something answers at that address but the gRPC connection failed: \
             is this the gRPC port (default 50051, not the HTTP or data-plane port)? \
             does the server use TLS (https:// and --tls-ca)?",
        );
    }
    out
}

fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match args.cmd {
            Cmd::Serve(a) => serve::run(*a).await,
            Cmd::Put(a) => cli::put(a).await,
            Cmd::Get(a) => cli::get(a).await,
            Cmd::Lookup(a) => cli::lookup(a).await,
            Cmd::Delete(a) => cli::delete(a).await,
            Cmd::Stats(a) => cli::stats(a).await,
            Cmd::Health(a) => cli::health(a).await,
            Cmd::Demo(a) => demo::run(a).await,
            Cmd::Bench(a) => bench::run(a).await,
        }
    })
}
