//! Synthetic records for unit tests.

use std::collections::BTreeMap;

use crate::record::{Machine, Mode, OpStats, Percentiles, Phase, Record, RepeatOp, Step};

/// Percentiles with the given p50/p99 (p90 between them, mean = p50).
pub fn pct(p50: f64, p99: f64) -> Percentiles {
    Percentiles {
        count: 1000,
        p50,
        p90: (p50 + p99) / 2.0,
        p99,
        p999: p99 * 1.2,
        max: p99 * 1.5,
        mean: p50,
    }
}

/// A closed-loop step at concurrency `c`, 10 s, with ops `(name, p50 µs, p99 µs, ops/s)`.
/// Each op moves 128 tokens and 1 MiB; storage is half and network 30 % of e2e.
pub fn synthetic_step(c: u32, ops: &[(&str, f64, f64, f64)]) -> Step {
    let mut map = BTreeMap::new();
    for &(name, p50, p99, thr) in ops {
        let n = (thr * 10.0) as u64;
        let mut latency_us = BTreeMap::new();
        latency_us.insert(Phase::E2e, pct(p50, p99));
        latency_us.insert(Phase::Storage, pct(p50 * 0.5, p99 * 0.5));
        latency_us.insert(Phase::Network, pct(p50 * 0.3, p99 * 0.3));
        let per_repeat = vec![RepeatOp {
            repeat: 0,
            throughput_ops_s: thr,
            e2e_us: pct(p50, p99),
        }];
        map.insert(
            name.to_string(),
            OpStats {
                ops: n,
                errors: 0,
                bytes: n << 20,
                tokens: n * 128,
                throughput_ops_s: thr,
                tokens_per_s: thr * 128.0,
                bytes_per_s: thr * 1_048_576.0,
                latency_us,
                e2e_uncorrected_us: None,
                per_repeat,
                across_repeats: None,
            },
        );
    }
    Step {
        mode: Mode::Closed { concurrency: c },
        processes: 1,
        repeats: 1,
        duration_s: 10.0,
        generator_cpu_utilisation: 0.2,
        generator_cores: 2,
        schedule_lag: None,
        mean_in_flight: None,
        ops: map,
        flags: Vec::new(),
    }
}

/// A step that obeys Little's law exactly: one op, throughput = c / latency.
pub fn littles_step(c: u32, latency_us: f64) -> Step {
    synthetic_step(
        c,
        &[(
            "read",
            latency_us,
            latency_us * 3.0,
            f64::from(c) / (latency_us / 1e6),
        )],
    )
}

/// A record whose read latency is flat to c = 8 then grows linearly (saturation at ~8).
pub fn synthetic_record() -> Record {
    let mut r = Record::new("synthetic", "grpc", 1 << 20, "127.0.0.1:8085");
    r.machine = Machine {
        cores: 2,
        memory_bytes: 1 << 33,
        hostname: "test".into(),
        kernel: "6.0".into(),
        ..Machine::default()
    };
    r.date = "2026-01-05T12:00:00Z".into();
    r.command_line = vec!["kvtier".into(), "bench".into()];
    r.analysis_config.slas = vec!["read.p99=40ms".into()];
    r.analysis_config.target_tokens_per_s = Some(1_000_000.0);
    for c in [1u32, 2, 4, 8, 16, 32, 64] {
        let lat = 10_000.0 * (f64::from(c) / 8.0).max(1.0);
        r.steps.push(littles_step(c, lat));
    }
    r
}
