//! Latency SLAs, the recommended maximum load that meets them, and capacity planning.
//!
//! An SLA string is a comma-separated list of constraints
//! `op[.phase].stat(=|<|<=)value[unit]`, e.g. `read.p99=100ms,lookup.p50<5ms`
//! or `read.network.p99=50ms`. `stat` is one of `p50 p90 p99 p999 max mean`;
//! units are `us`/`µs`, `ms` (default) or `s`. Each constraint gets its own
//! recommendation; when there are several, one more recommendation requires
//! all of them at once.
pub use crate::record::{CapacityPlan, Recommendation, Sla};

use crate::record::{Phase, Step};

impl std::fmt::Display for Sla {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = if self.phase == Phase::E2e {
            String::new()
        } else {
            format!(".{}", self.phase.name())
        };
        write!(
            f,
            "{}{}.{} < {}",
            self.op,
            phase,
            self.stat,
            fmt_ms(self.limit_us)
        )
    }
}

/// Formats microseconds as milliseconds with two decimals (`12.50ms`).
pub fn fmt_ms(us: f64) -> String {
    format!("{:.2}ms", us / 1000.0)
}

/// Parses one constraint such as `read.p99=100ms`.
pub fn parse_sla(s: &str) -> anyhow::Result<Sla> {
    let s = s.trim();
    let (lhs, rhs) = s
        .split_once("<=")
        .or_else(|| s.split_once('<'))
        .or_else(|| s.split_once('='))
        .ok_or_else(|| anyhow::anyhow!("SLA `{s}`: expected op.stat=value, e.g. read.p99=100ms"))?;
    let parts: Vec<&str> = lhs.trim().split('.').collect();
    let (op, phase, stat) = match parts.as_slice() {
        [op, stat] => (*op, Phase::E2e, *stat),
        [op, phase, stat] => {
            let p = Phase::from_name(phase)
                .ok_or_else(|| anyhow::anyhow!("SLA `{s}`: unknown phase `{phase}`"))?;
            (*op, p, *stat)
        }
        _ => anyhow::bail!("SLA `{s}`: expected op[.phase].stat on the left"),
    };
    anyhow::ensure!(!op.is_empty(), "SLA `{s}`: empty op");
    anyhow::ensure!(
        ["p50", "p90", "p99", "p999", "max", "mean"].contains(&stat),
        "SLA `{s}`: unknown statistic `{stat}` (p50 p90 p99 p999 max mean)"
    );
    let rhs = rhs.trim();
    let split = rhs
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rhs.len());
    let (num, unit) = rhs.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("SLA `{s}`: bad number `{num}`"))?;
    let scale = match unit.trim() {
        "us" | "µs" => 1.0,
        "" | "ms" => 1_000.0,
        "s" => 1_000_000.0,
        u => anyhow::bail!("SLA `{s}`: unknown unit `{u}` (us, ms, s)"),
    };
    Ok(Sla {
        op: op.to_string(),
        phase,
        stat: stat.to_string(),
        limit_us: value * scale,
    })
}

/// Parses a comma-separated list (each entry may itself be a list).
pub fn parse_slas<S: AsRef<str>>(items: &[S]) -> anyhow::Result<Vec<Sla>> {
    items
        .iter()
        .flat_map(|i| {
            i.as_ref()
                .split(',')
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_sla(&s))
        .collect()
}

/// The measured value a constraint refers to, if the step measured it.
pub fn measured(step: &Step, sla: &Sla) -> Option<f64> {
    step.ops.get(&sla.op)?.phase(sla.phase)?.get(&sla.stat)
}

/// For closed-loop and open-loop steps separately, the step with the largest
/// load whose measurements meet every constraint in `slas`. Steps that did not
/// measure a constrained op are ignored. Returns one recommendation per mode
/// that has steps.
pub fn recommend(steps: &[Step], slas: &[Sla]) -> Vec<Recommendation> {
    let text = slas
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = Vec::new();
    for mode in ["closed", "open"] {
        let in_mode: Vec<&Step> = steps
            .iter()
            .filter(|s| (s.total_concurrency().is_some()) == (mode == "closed"))
            .collect();
        if in_mode.is_empty() {
            continue;
        }
        let mut best: Option<(&Step, Vec<f64>)> = None;
        for s in in_mode {
            let Some(values) = slas
                .iter()
                .map(|c| measured(s, c))
                .collect::<Option<Vec<f64>>>()
            else {
                continue;
            };
            let ok = values.iter().zip(slas).all(|(v, c)| *v <= c.limit_us);
            if ok && best.as_ref().is_none_or(|(b, _)| s.load() > b.load()) {
                best = Some((s, values));
            }
        }
        out.push(match best {
            Some((s, values)) => Recommendation {
                sla: text.clone(),
                mode: mode.to_string(),
                step: Some(s.label()),
                load: Some(s.load()),
                throughput_ops_s: Some(s.total_throughput()),
                tokens_per_s: Some(s.total_tokens_per_s()),
                measured_us: values,
                flagged: !s.flags.is_empty(),
            },
            None => Recommendation {
                sla: text.clone(),
                mode: mode.to_string(),
                step: None,
                load: None,
                throughput_ops_s: None,
                tokens_per_s: None,
                measured_us: Vec::new(),
                flagged: false,
            },
        });
    }
    out
}

/// `servers = ceil(target / per-server capacity at the recommendation)`;
/// `None` when nothing meets the SLA or the workload moved no tokens.
pub fn plan_capacity(rec: &Recommendation, target_tokens_per_s: f64) -> Option<CapacityPlan> {
    let per = rec.tokens_per_s.filter(|t| *t > 0.0)?;
    Some(CapacityPlan {
        sla: rec.sla.clone(),
        target_tokens_per_s,
        per_server_tokens_per_s: per,
        per_server_load: rec.load?,
        servers_needed: (target_tokens_per_s / per).ceil() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::synthetic_step;

    #[test]
    fn parses_forms_and_units() {
        let v = parse_slas(&[
            "read.p99=100ms,lookup.p50<5ms",
            "read.network.p999<=250us",
            "write.max=1.5s",
        ])
        .unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(
            v[0],
            Sla {
                op: "read".into(),
                phase: Phase::E2e,
                stat: "p99".into(),
                limit_us: 100_000.0
            }
        );
        assert_eq!(v[1].op, "lookup");
        assert_eq!(v[1].limit_us, 5_000.0);
        assert_eq!(v[2].phase, Phase::Network);
        assert_eq!(v[2].stat, "p999");
        assert_eq!(v[2].limit_us, 250.0);
        assert_eq!(v[3].limit_us, 1_500_000.0);
        assert_eq!(v[0].to_string(), "read.p99 < 100.00ms");
    }

    #[test]
    fn rejects_bad_slas() {
        for bad in [
            "read",
            "read.p42=1ms",
            "read.p99=abc",
            "read.p99=3h",
            "read.wire.p99=1ms",
            ".p99=1ms",
        ] {
            assert!(parse_sla(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn recommends_largest_concurrency_meeting_sla_and_plans_capacity() {
        // Seed-000 read p99 (ms) at c = 1, 2, 5, 10, 20, 50.
        let p99 = [38.81, 40.08, 42.93, 53.19, 98.45, 407.27];
        let cs = [1, 2, 5, 10, 20, 50];
        let steps: Vec<Step> = cs
            .iter()
            .zip(p99)
            .map(|(&c, ms)| {
                synthetic_step(
                    c,
                    &[(
                        "read",
                        20_000.0,
                        ms * 1000.0,
                        100.0 * f64::from(c).min(20.0),
                    )],
                )
            })
            .collect();
        let r = &recommend(&steps, &parse_slas(&["read.p99=100ms"]).unwrap())[0];
        assert_eq!(r.load, Some(20.0));
        assert_eq!(r.measured_us, vec![98_450.0]);
        let r50 = &recommend(&steps, &parse_slas(&["read.p99<50ms"]).unwrap())[0];
        assert_eq!(r50.load, Some(5.0));
        let none = &recommend(&steps, &parse_slas(&["read.p99<1ms"]).unwrap())[0];
        assert_eq!(none.load, None);
        // Tokens: synthetic step moves 128 tokens per op → 2000 ops/s × 128 at c = 20.
        let plan = plan_capacity(r, 1_000_000.0).unwrap();
        assert_eq!(plan.per_server_tokens_per_s, 2000.0 * 128.0);
        assert_eq!(plan.servers_needed, 4);
        assert!(plan_capacity(none, 1.0).is_none());
    }
}
