//! Capacity-share series on `/metrics` (docs/security.md, "Capacity shares"):
//!
//! * `kvtier_share_resident_bytes{tier,share}`: bytes each share holds in
//!   the memory and disk tiers;
//! * `kvtier_share_evictions_total{tier,share,by}`: its blocks evicted to
//!   make room for its own writes (`by="own"`: it was the tenant most over
//!   its share) or for another tenant's (`by="other"`).
//!
//! Namespaces are unbounded, so the `share` label is a configured
//! `[[tenants.shares]]` name or `other` for everything else: the series count
//! is fixed by the config, not by what clients send.
use kvtier_core::Engine;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabel {
    tier: &'static str,
    share: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabel {
    tier: &'static str,
    share: String,
    by: &'static str,
}

/// Writes the share series of `engine`'s local tiers.
pub(crate) fn encode(engine: &Engine, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    let stats = engine.share_stats();
    let mut fam = encoder.encode_descriptor(
        "share_resident_bytes",
        "Bytes a capacity share (tenants.shares name, or other) holds per tier",
        None,
        MetricType::Gauge,
    )?;
    for (tier, shares) in &stats {
        for s in shares {
            let l = ShareLabel {
                tier: tier.name(),
                share: s.name.clone(),
            };
            ConstGauge::new(s.bytes as i64).encode(fam.encode_family(&l)?)?;
        }
    }
    let mut fam = encoder.encode_descriptor(
        "share_evictions",
        "Blocks of a capacity share evicted per tier, for its own writes (by=own) or another's (by=other)",
        None,
        MetricType::Counter,
    )?;
    for (tier, shares) in &stats {
        for s in shares {
            for (by, n) in [("own", s.evicted_by_own), ("other", s.evicted_by_other)] {
                let l = EvictionLabel {
                    tier: tier.name(),
                    share: s.name.clone(),
                    by,
                };
                ConstCounter::new(n).encode(fam.encode_family(&l)?)?;
            }
        }
    }
    Ok(())
}
