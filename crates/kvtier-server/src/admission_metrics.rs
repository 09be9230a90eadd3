//! Admission series on `/metrics` (docs/cache-choice.md, "Admission to the
//! lower tiers"), for the disk tier and the object store when configured:
//!
//! * `kvtier_tier_admission_policy{tier,policy}`: 1 for the policy in force;
//! * `kvtier_tier_admission_blocks_total{tier,outcome}`: blocks written down
//!   (`admitted`; every write down under `all`), writes kept in memory only
//!   (`deferred`), and blocks that left memory before being admitted, never
//!   written to the tier (`rejected`);
//! * `kvtier_tier_written_bytes_total{tier}`: payload bytes written down
//!   to the tier (for the object store: uploaded or queued for upload).
use kvtier_core::Engine;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    tier: &'static str,
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    tier: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

/// Writes the admission series of `engine`'s lower tiers.
pub(crate) fn encode(engine: &Engine, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    let stats = engine.admission_stats();
    if stats.is_empty() {
        return Ok(());
    }
    let mut fam = encoder.encode_descriptor(
        "tier_admission_policy",
        "The admission policy of a lower tier (1 for the one in force)",
        None,
        MetricType::Gauge,
    )?;
    for (tier, policy, _) in &stats {
        let l = PolicyLabel {
            tier: tier.name(),
            policy: policy.name(),
        };
        ConstGauge::new(1i64).encode(fam.encode_family(&l)?)?;
    }
    let mut fam = encoder.encode_descriptor(
        "tier_admission_blocks",
        "Blocks written down to a lower tier (admitted), kept in memory only by a write (deferred), \
         or gone from memory before being admitted (rejected)",
        None,
        MetricType::Counter,
    )?;
    for (tier, _, s) in &stats {
        for (outcome, n) in [
            ("admitted", s.admitted),
            ("deferred", s.deferred),
            ("rejected", s.rejected),
        ] {
            let l = OutcomeLabel {
                tier: tier.name(),
                outcome,
            };
            ConstCounter::new(n).encode(fam.encode_family(&l)?)?;
        }
    }
    let mut fam = encoder.encode_descriptor(
        "tier_written_bytes",
        "Payload bytes written down to a lower tier (the object store: uploaded or queued)",
        None,
        MetricType::Counter,
    )?;
    for (tier, _, s) in &stats {
        let l = TierLabel { tier: tier.name() };
        ConstCounter::new(s.admitted_bytes).encode(fam.encode_family(&l)?)?;
    }
    Ok(())
}
