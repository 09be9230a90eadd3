//! Metrics, declared in one place and exposed as Prometheus text on `/metrics`.
//!
//! * `kvtier_requests_total{api,op,code}`: requests by outcome.
//! * `kvtier_request_duration_seconds{api,op}`: server total (queue + service),
//!   log-linear 1-2-5 buckets from 10 µs to 50 s.
//! * `kvtier_tier_{blocks,bytes,capacity_bytes}{tier}`: gauges read from the engine at scrape.
//! * `kvtier_tier_{hits,misses,evictions,expirations}_total{tier}`: counters read at scrape.
//! * `kvtier_active_leases`, `kvtier_lease_pinned_bytes`, `kvtier_inflight_requests`.
//! * `kvtier_shed_total`: requests refused for overload;
//!   `kvtier_concurrency_limit{front}`: each front's current limit.
//! * `kvtier_auth_denied_total{reason}`: requests refused by authentication
//!   (`unauthenticated`) or access control (`permission_denied`).
//! * `kvtier_stalled_replies_total{front}`: replies dropped (`server.write_timeout`).
//! * `kvtier_engine_{degraded_writes,demotions,demotion_failures}_total`: engine counters.
//! * `kvtier_share_*`, `kvtier_tier_{admission_*,written_bytes_*}`: their own modules.
//! * In the `kvtier` binary (jemalloc): `kvtier_allocator_{allocated,resident}_bytes`,
//!   `kvtier_allocator_purges_total`, and `kvtier_process_resident_bytes` (RSS)
//!   against `kvtier_resident_limit_bytes` (docs/operations.md, "Memory").
//! * With a disk tier: `kvtier_disk_recovered_{blocks,bytes}`, `kvtier_disk_recovery_seconds`,
//!   `kvtier_disk_recovery_dropped_files{reason}` (the recovery report of the start),
//!   `kvtier_disk_{corrupt_on_read,write_exhausted,write_errors}_total`,
//!   `kvtier_disk_reserved_bytes`, `kvtier_disk_pending_unlinks`.
//! * With an object store: `kvtier_object_writeback_queue_{depth,capacity}`,
//!   `kvtier_object_upload_lag_seconds` (age of the oldest block not yet
//!   uploaded), `kvtier_object_{uploads,upload_retries,uploads_superseded,
//!   write_failures,lookup_degraded,lookup_checks,promotions_to_disk,fetches,
//!   fetches_joined,prefetched}_total`,
//!   requests `kvtier_object_{gets,heads,head_cache_hits,puts,deletes,corrupt,errors,put_*}_total`.
use kvtier_core::Engine;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// Labels of per-request series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// `v1`, `kvstore` or `http`.
    pub api: &'static str,
    /// Operation name.
    pub op: &'static str,
}

/// Labels of per-request outcome counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `v1`, `kvstore` or `http`.
    pub api: &'static str,
    /// Operation name.
    pub op: &'static str,
    /// `ok` or the status code name.
    pub code: String,
}

/// Labels of per-front series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrontLabels {
    /// `grpc`, `http` or `data`.
    pub front: &'static str,
}

/// Labels of refused requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeniedLabels {
    /// `unauthenticated` or `permission_denied`.
    pub reason: &'static str,
}

/// All server metrics.
pub struct Metrics {
    pub(crate) registry: Registry,
    requests: Family<OutcomeLabels, Counter>,
    denied: Family<DeniedLabels, Counter>,
    latency: Family<OpLabels, Histogram>,
    /// Requests being served now.
    pub inflight: Gauge,
    /// Requests shed for overload (server.max_queued / queue_timeout, or
    /// the adaptive concurrency limit).
    pub shed: Counter,
    limits: Family<FrontLabels, Gauge>,
    /// Payload bytes received in writes.
    pub bytes_in: Counter,
    /// Payload bytes sent in reads.
    pub bytes_out: Counter,
}

fn latency_histogram() -> Histogram {
    // Log-linear 1-2-5 buckets from 10 µs to 50 s.
    let mut buckets = Vec::new();
    for exp in -5..=1 {
        for m in [1.0, 2.0, 5.0] {
            buckets.push(m * 10f64.powi(exp));
        }
    }
    Histogram::new(buckets)
}

impl Metrics {
    /// Creates the registry; `engine` is read at every scrape.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self::with_cluster(engine, None)
    }

    /// [`Metrics::new`] plus the cluster's families (`kvtier_cluster_*`).
    pub fn with_cluster(
        engine: Arc<Engine>,
        cluster: Option<&crate::cluster::ClusterMetrics>,
    ) -> Self {
        let mut registry = Registry::with_prefix("kvtier");
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests by API, operation and outcome",
            requests.clone(),
        );
        let latency = Family::<OpLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "request_duration_seconds",
            "Server time per request (queue + service)",
            latency.clone(),
        );
        let limits = Family::<FrontLabels, Gauge>::default();
        registry.register(
            "concurrency_limit",
            "Requests a front serves at once before shedding (server.concurrency_limit)",
            limits.clone(),
        );
        let inflight = Gauge::default();
        registry.register(
            "inflight_requests",
            "Requests being served now",
            inflight.clone(),
        );
        let bytes_in = Counter::default();
        registry.register(
            "write_payload_bytes",
            "Payload bytes received by writes",
            bytes_in.clone(),
        );
        let bytes_out = Counter::default();
        registry.register(
            "read_payload_bytes",
            "Payload bytes sent by reads",
            bytes_out.clone(),
        );
        let denied = Family::<DeniedLabels, Counter>::default();
        registry.register(
            "auth_denied",
            "Requests refused by authentication or access control",
            denied.clone(),
        );
        let shed = Counter::default();
        registry.register(
            "shed",
            "Requests refused for overload (UNAVAILABLE / 503, with a retry hint)",
            shed.clone(),
        );
        let s = crate::limits::STALLED.clone();
        registry.register("stalled_replies", "Replies dropped (write_timeout)", s);
        registry.register_collector(Box::new(EngineCollector(engine)));
        if let Some(c) = cluster {
            c.register(&mut registry);
        }
        Self {
            shed,
            limits,
            registry,
            requests,
            denied,
            latency,
            inflight,
            bytes_in,
            bytes_out,
        }
    }

    /// The gauge showing `front`'s concurrency limit.
    pub fn concurrency_limit(&self, front: &'static str) -> Gauge {
        self.limits.get_or_create(&FrontLabels { front }).clone()
    }

    /// Records one finished request.
    pub fn observe(&self, api: &'static str, op: &'static str, code: &str, total: Duration) {
        self.requests
            .get_or_create(&OutcomeLabels {
                api,
                op,
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&OpLabels { api, op })
            .observe(total.as_secs_f64());
    }

    /// Counts one refused request.
    pub fn observe_denied(&self, d: &crate::auth::Denied) {
        let reason = match d {
            crate::auth::Denied::Unauthenticated(_) => "unauthenticated",
            crate::auth::Denied::PermissionDenied(_) => "permission_denied",
        };
        self.denied.get_or_create(&DeniedLabels { reason }).inc();
    }

    /// Prometheus / OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encode metrics");
        out
    }
}

struct EngineCollector(Arc<Engine>);

/// What the process's allocator reports, when it can (jemalloc, in the
/// `kvtier` binary): bytes allocated and resident, and the purges its
/// resident-limit watcher made.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllocatorStats {
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes of physical memory the allocator holds (live, free-but-kept, metadata).
    pub resident: u64,
    /// Times the freed pages were handed back because `resident` passed `server.resident_limit`.
    pub purges: u64,
    /// The process's resident memory (`VmRSS`: what `server.resident_limit` bounds), if readable.
    pub process_resident: Option<u64>,
    /// `server.resident_limit` (its default resolved).
    pub resident_limit: u64,
    /// How long the allocator keeps freed pages before its own decay hands
    /// them back (jemalloc's `opt.dirty_decay_ms`; -1: never, only the
    /// resident-limit watcher does); `None` when it cannot be read.
    pub dirty_decay_ms: Option<i64>,
}

static ALLOCATOR: std::sync::OnceLock<fn() -> AllocatorStats> = std::sync::OnceLock::new();

/// Installs the allocator probe behind `kvtier_allocator_*` (once per process).
pub fn set_allocator_probe(probe: fn() -> AllocatorStats) {
    let _ = ALLOCATOR.set(probe);
}

impl std::fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineCollector")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Disk-tier series: the recovery report of the last open and the disk counters.
fn encode_disk(
    disk: &kvtier_core::DiskTier,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType;
    let rep = disk.recovery_report();
    ConstGauge::new(rep.blocks as i64).encode(encoder.encode_descriptor(
        "disk_recovered_blocks",
        "Blocks recovered by the disk tier's index rebuild at start",
        None,
        MetricType::Gauge,
    )?)?;
    ConstGauge::new(rep.bytes as i64).encode(encoder.encode_descriptor(
        "disk_recovered_bytes",
        "Bytes (charged) recovered by the disk tier's index rebuild at start",
        None,
        MetricType::Gauge,
    )?)?;
    ConstGauge::new(rep.elapsed.as_secs_f64()).encode(encoder.encode_descriptor(
        "disk_recovery_seconds",
        "Wall time of the disk tier's index rebuild at start",
        None,
        MetricType::Gauge,
    )?)?;
    let dropped: [(&'static str, u64); 6] = [
        ("torn", rep.dropped_torn),
        ("corrupt", rep.dropped_corrupt),
        ("expired", rep.dropped_expired),
        ("superseded", rep.dropped_superseded),
        ("over_capacity", rep.evicted_over_capacity),
        ("temp_file", rep.temp_files_removed),
    ];
    let mut fam = encoder.encode_descriptor(
        "disk_recovery_dropped_files",
        "Files deleted by the disk tier's index rebuild at start, by reason",
        None,
        MetricType::Gauge,
    )?;
    for (reason, n) in dropped {
        ConstGauge::new(n as i64).encode(fam.encode_family(&ReasonLabel { reason })?)?;
    }
    let ds = disk.disk_stats();
    let counters: [(&str, &str, u64); 3] = [
        (
            "disk_corrupt_on_read",
            "Disk records found corrupt or unreadable on read (served as misses)",
            ds.corrupt_on_read,
        ),
        (
            "disk_write_exhausted",
            "Disk writes refused for lack of space (full tier or ENOSPC)",
            ds.write_exhausted,
        ),
        (
            "disk_write_errors",
            "Disk writes that failed with another I/O error",
            ds.write_errors,
        ),
    ];
    for (name, help, v) in counters {
        ConstCounter::new(v).encode(encoder.encode_descriptor(
            name,
            help,
            None,
            MetricType::Counter,
        )?)?;
    }
    ConstGauge::new(ds.reserved_bytes as i64).encode(encoder.encode_descriptor(
        "disk_reserved_bytes",
        "Disk bytes reserved by writes in flight",
        None,
        MetricType::Gauge,
    )?)?;
    ConstGauge::new(ds.pending_unlinks as i64).encode(encoder.encode_descriptor(
        "disk_pending_unlinks",
        "Removed disk records whose files are still queued for unlinking",
        None,
        MetricType::Gauge,
    )?)?;
    Ok(())
}

/// Object-store series: the write-back queue and the engine's and tier's counters.
fn encode_object(
    o: &kvtier_core::ObjectStats,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType;
    ConstGauge::new(o.queue_depth as i64).encode(encoder.encode_descriptor(
        "object_writeback_queue_depth",
        "Blocks acknowledged but not yet uploaded to the object store (write-back)",
        None,
        MetricType::Gauge,
    )?)?;
    ConstGauge::new(o.queue_capacity as i64).encode(encoder.encode_descriptor(
        "object_writeback_queue_capacity",
        "Write-back queue capacity; writes wait (then fail UNAVAILABLE) when it is full",
        None,
        MetricType::Gauge,
    )?)?;
    ConstGauge::new(o.upload_lag.as_secs_f64()).encode(encoder.encode_descriptor(
        "object_upload_lag_seconds",
        "Age of the oldest block waiting for upload to the object store (0 when none)",
        None,
        MetricType::Gauge,
    )?)?;
    let mut counters: Vec<(&str, &str, u64)> = vec![
        (
            "object_uploads",
            "Blocks uploaded by the write-back queue",
            o.uploads,
        ),
        (
            "object_upload_retries",
            "Write-back upload attempts that failed and were retried",
            o.upload_retries,
        ),
        (
            "object_uploads_superseded",
            "Queued uploads skipped for a newer value of the same key",
            o.uploads_superseded,
        ),
        (
            "object_write_failures",
            "Writes refused because the object store failed or the queue stayed full",
            o.write_failures,
        ),
        (
            "object_lookup_degraded",
            "Lookups answered from local tiers only (store error or deadline)",
            o.lookup_degraded,
        ),
        (
            "object_lookup_checks",
            "Existence checks a lookup sent to the object tier",
            o.lookup_checks,
        ),
        (
            "object_promotions_to_disk",
            "Blocks read from the object store and copied to disk",
            o.promotions_to_disk,
        ),
        (
            "object_fetches",
            "Block reads started against the object store (one per block at a time)",
            o.fetches,
        ),
        (
            "object_fetches_joined",
            "Reads that waited for a fetch of the same block already under way",
            o.fetches_joined,
        ),
        (
            "object_prefetched",
            "Blocks read into memory by lookups' prefetches",
            o.prefetched,
        ),
    ];
    counters.extend(o.tier_counters.iter().copied());
    for (name, help, v) in counters {
        ConstCounter::new(v).encode(encoder.encode_descriptor(
            name,
            help,
            None,
            MetricType::Counter,
        )?)?;
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let alloc = ALLOCATOR.get().map(|probe| probe());
        let stats = self.0.stats();
        type Get = fn(&kvtier_core::TierStats) -> u64;
        let gauges: [(&str, &str, Get); 3] = [
            ("tier_blocks", "Blocks held per tier", |s| s.blocks),
            ("tier_bytes", "Bytes held per tier", |s| s.bytes),
            ("tier_capacity_bytes", "Byte budget per tier", |s| {
                s.capacity_bytes
            }),
        ];
        for (name, help, get) in gauges {
            let mut fam = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (kind, s) in &stats.tiers {
                let g = ConstGauge::new(get(s) as i64);
                g.encode(fam.encode_family(&TierLabel { tier: kind.name() })?)?;
            }
        }
        let counters: [(&str, &str, Get); 4] = [
            (
                "tier_hits",
                "Reads that found the block in this tier",
                |s| s.hits,
            ),
            (
                "tier_misses",
                "Reads that did not find the block in this tier",
                |s| s.misses,
            ),
            ("tier_evictions", "Blocks evicted to make room", |s| {
                s.evictions
            }),
            (
                "tier_expirations",
                "Blocks removed because their TTL passed",
                |s| s.expirations,
            ),
        ];
        for (name, help, get) in counters {
            let mut fam = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (kind, s) in &stats.tiers {
                let c = ConstCounter::new(get(s));
                c.encode(fam.encode_family(&TierLabel { tier: kind.name() })?)?;
            }
        }
        let engine_counters: [(&str, &str, u64); 4] = [
            (
                "engine_degraded_writes",
                "Writes acknowledged memory-only because the disk tier refused them",
                stats.degraded_writes,
            ),
            (
                "engine_demotions",
                "Blocks evicted from memory and written to the disk tier",
                stats.demotions,
            ),
            (
                "engine_demotion_failures",
                "Demotions to the disk tier that failed (block dropped)",
                stats.demotion_failures,
            ),
            (
                "lease_refusals",
                "Leases cut short or refused by engine.max_pinned / max_pinned_per_namespace",
                stats.lease_refusals,
            ),
        ];
        let mut engine_counters = engine_counters.to_vec();
        if let Some(a) = alloc {
            engine_counters.push((
                "allocator_purges",
                "Freed pages handed back because resident memory passed server.resident_limit",
                a.purges,
            ));
        }
        for (name, help, v) in engine_counters {
            ConstCounter::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?)?;
        }
        crate::share_metrics::encode(&self.0, &mut encoder)?;
        crate::admission_metrics::encode(&self.0, &mut encoder)?;
        if let Some(disk) = self.0.disk() {
            encode_disk(disk, &mut encoder)?;
        }
        if let Some(o) = &stats.object {
            encode_object(o, &mut encoder)?;
        }
        let gauges: [(&str, &str, i64); 2] = [
            (
                "active_leases",
                "Leases currently pinning blocks",
                stats.active_leases as i64,
            ),
            (
                "lease_pinned_bytes",
                "Bytes leases pin (charged against engine.max_pinned)",
                stats.pinned_bytes as i64,
            ),
        ];
        let mut gauges = gauges.to_vec();
        if let Some(a) = alloc {
            gauges.push((
                "allocator_allocated_bytes",
                "Bytes in live allocations",
                a.allocated as i64,
            ));
            gauges.push((
                "allocator_resident_bytes",
                "Physical memory the allocator holds",
                a.resident as i64,
            ));
            gauges.push((
                "resident_limit_bytes",
                "server.resident_limit: the line the process's resident memory is held under",
                a.resident_limit as i64,
            ));
            if let Some(rss) = a.process_resident {
                gauges.push((
                    "process_resident_bytes",
                    "The process's resident memory (VmRSS)",
                    rss as i64,
                ));
            }
            if let Some(ms) = a.dirty_decay_ms {
                gauges.push((
                    "allocator_dirty_decay_ms",
                    "How long freed pages are kept before the allocator's own decay returns them (-1: never; server.resident_limit bounds them)",
                    ms,
                ));
            }
        }
        for (name, help, v) in gauges {
            ConstGauge::new(v).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}
