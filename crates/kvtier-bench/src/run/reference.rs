//! The competitors' own benchmark tools, run at each closed-loop concurrency after
//! the sweep (comparison rule 2: a competitor is compared at the better of the
//! bench's client and its own tool): `redis-benchmark` here, Mooncake's
//! through its driver.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::BenchConfig;
use super::setup::Competitor;
use crate::record::{CompetitorReference, CompetitorRun, ReferenceRow};
use crate::workloads::Workload;

/// The competitors' own tools at each closed-loop concurrency (comparison rule 2).
pub(super) fn competitor_references(
    cfg: &BenchConfig,
    competitors: &[Competitor],
    runs: &mut [CompetitorRun],
    value_size: usize,
) -> anyhow::Result<()> {
    let applies = cfg.competitor_tool
        && cfg.rates.is_empty()
        && matches!(cfg.workload, Workload::Read | Workload::Write);
    if !applies {
        return Ok(());
    }
    let totals: Vec<u32> = cfg
        .concurrency
        .iter()
        .map(|c| c * cfg.processes.max(1))
        .collect();
    for (competitor, run) in competitors.iter().zip(runs) {
        run.reference = match competitor {
            Competitor::Bench { url, .. } => {
                Some(redis_benchmark(url, value_size, &totals, cfg.quiet)?)
            }
            Competitor::Mooncake(m) => m.reference(&totals, cfg.duration, value_size)?,
        };
    }
    Ok(())
}

/// Runs `redis-benchmark` against `url` at each concurrency: `SET` with a
/// key range of 10⁹ (so that, as kvtier's writes, every SET makes a new key)
/// and `GET` of one key holding a `value_size` value (written right before
/// each GET run without a key range, which names it `key:__rand_int__`, and
/// checked after it with `redis-cli STRLEN`: a GET of an evicted key is a
/// fast miss, not a read). N is about 3 s of work at
/// ~2,000 req/s, at least 50 per connection. The tool's CPU utilisation (of
/// its one thread) comes from `getrusage(RUSAGE_CHILDREN)`.
fn redis_benchmark(
    url: &str,
    value_size: usize,
    concurrency: &[u32],
    quiet: bool,
) -> anyhow::Result<CompetitorReference> {
    let addr = url.trim_start_matches("redis://");
    let addr = addr.split('/').next().unwrap_or(addr);
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("redis url {url:?} has no port"))?;
    let d = value_size.to_string();
    let tool = format!(
        "redis-benchmark -h {host} -p {port} -t set -r 1000000000 -d {value_size} -c {{c}} -n {{n}} --csv; \
         redis-benchmark -h {host} -p {port} -t get -d {value_size} -c {{c}} -n {{n}} --csv"
    );
    let run = |args: &[&str]| -> anyhow::Result<(String, f64)> {
        let before = children_cpu();
        let t0 = std::time::Instant::now();
        let out = Command::new("redis-benchmark")
            .args(["-h", host, "-p", port, "-d", &d, "--csv"])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .context("running redis-benchmark")?;
        let wall = t0.elapsed().as_secs_f64();
        anyhow::ensure!(
            out.status.success(),
            "redis-benchmark failed: {}",
            out.status
        );
        let cpu = (children_cpu() - before).as_secs_f64();
        Ok((
            String::from_utf8_lossy(&out.stdout).into_owned(),
            cpu / wall.max(1e-9),
        ))
    };
    // The key GET reads holds a value of `value_size` before and after the
    // GET run: the SET runs before it fill `maxmemory`, and eviction would
    // otherwise turn every GET into a fast miss.
    let get_key_len = || -> anyhow::Result<usize> {
        let out = Command::new("redis-cli")
            .args(["-h", host, "-p", port, "STRLEN", "key:__rand_int__"])
            .output()
            .context("running redis-cli (apt-get install redis-tools)")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .with_context(|| format!("redis-cli STRLEN answered {text:?}"))
    };
    let mut rows = Vec::new();
    for &c in concurrency {
        let n = (u64::from(c) * 50).max(6000).to_string();
        let cs = c.to_string();
        for test in [&["-t", "set", "-r", "1000000000"][..], &["-t", "get"][..]] {
            let get = test[1] == "get";
            if get {
                run(&["-t", "set", "-n", "1", "-c", "1"])?;
            }
            let (csv, util) = run(&[test, &["-c", &cs, "-n", &n]].concat())?;
            if get {
                let len = get_key_len()?;
                anyhow::ensure!(
                    len == value_size,
                    "redis-benchmark GET read a {len}-byte value, not {value_size}: its key was evicted"
                );
            }
            for line in csv.lines().skip(1) {
                let f: Vec<&str> = line.split(',').map(|x| x.trim_matches('"')).collect();
                // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
                if f.len() < 7 {
                    continue;
                }
                let num = |i: usize| f[i].parse::<f64>().unwrap_or(f64::NAN);
                let row = ReferenceRow {
                    concurrency: c,
                    op: f[0].to_ascii_lowercase(),
                    throughput_ops_s: num(1),
                    p50_us: num(4) * 1000.0,
                    p99_us: num(6) * 1000.0,
                    generator_cpu_utilisation: Some(util),
                };
                if !quiet {
                    println!(
                        "redis-benchmark c={c}: {} {:.0} ops/s p50 {:.2} ms p99 {:.2} ms (tool CPU {:.0}%)",
                        row.op,
                        row.throughput_ops_s,
                        row.p50_us / 1000.0,
                        row.p99_us / 1000.0,
                        util * 100.0
                    );
                }
                rows.push(row);
            }
        }
    }
    Ok(CompetitorReference { tool, rows })
}

/// CPU time (user + system) of every child process waited for so far.
fn children_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| {
            Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
        };
        tv(u.user_time()) + tv(u.system_time())
    })
}
