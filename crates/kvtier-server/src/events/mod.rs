//! KV events for cache-aware routers (docs/events.md): every block that
//! becomes resident in, or leaves, this node's memory or disk, or that this
//! node writes to (or deletes from) the object store, is published on a ZMQ
//! PUB socket in vLLM's own format, so llm-d's indexer, Dynamo's router and
//! vLLM's decoder read kvtier like one more engine.
//!
//! The tiers report changes to the [`EventHub`] (a
//! [`kvtier_core::events::EventSink`]) under their locks, so it only queues
//! them; the write fronts queue each block's token ids (`Block.token_ids`)
//! before the block is stored. One task ([`publish`]) owns everything else:
//! the catalogue of which tiers hold which block and its tokens, batching,
//! the sockets and the replay buffer.
pub mod encode;
mod publish;

use crate::config::EventsSection;
use kvtier_core::events::{EventSink, Medium};
use kvtier_core::{BlockId, Key};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use tokio::sync::mpsc;

pub use publish::Publisher;

/// What the tiers and fronts queue for the publisher.
#[derive(Debug)]
enum Msg {
    /// A block's tokens, sent before the block is stored.
    Tokens { id: BlockId, tokens: Arc<[u32]> },
    /// A residency change.
    Change {
        medium: Medium,
        stored: bool,
        id: BlockId,
        parent: Option<Key>,
    },
}

/// Counters on `/metrics` (`kvtier_events_*`).
#[derive(Clone, Default)]
pub struct EventCounters {
    /// Events published.
    pub published: Counter,
    /// Changes dropped because the queue was full (consumers are then
    /// inexact until the blocks change again).
    pub dropped: Counter,
    /// Blocks announced without token ids (their writer sent none).
    pub untokened: Counter,
}

impl EventCounters {
    /// Adds the counters to `registry`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "events_published",
            "KV events published (docs/events.md)",
            self.published.clone(),
        );
        registry.register(
            "events_dropped",
            "Residency changes dropped because the event queue was full",
            self.dropped.clone(),
        );
        registry.register(
            "events_untokened",
            "Blocks announced without token ids (their writer sent none)",
            self.untokened.clone(),
        );
    }
}

/// The sink the engine reports to, and the fronts' way to attach tokens.
pub struct EventHub {
    tx: mpsc::Sender<Msg>,
    cfg: EventsSection,
    /// Shared with the publisher.
    pub counters: EventCounters,
}

impl EventHub {
    /// A hub queueing up to `cfg.queue` changes, and the receiving end the
    /// [`Publisher`] takes.
    pub fn new(cfg: &EventsSection) -> (Arc<Self>, HubReceiver) {
        let (tx, rx) = mpsc::channel(cfg.queue);
        let hub = Arc::new(Self {
            tx,
            cfg: cfg.clone(),
            counters: EventCounters::default(),
        });
        (hub, HubReceiver(rx))
    }

    fn send(&self, m: Msg) {
        if self.tx.try_send(m).is_err() {
            self.counters.dropped.inc();
        }
    }
}

impl EventSink for EventHub {
    /// Token ids of a block about to be written (or recovered from disk);
    /// ignored for namespaces that are not published.
    fn tokens(&self, id: &BlockId, tokens: Arc<[u32]>) {
        if !tokens.is_empty() && self.cfg.publishes(id.namespace.as_str()) {
            self.send(Msg::Tokens {
                id: id.clone(),
                tokens,
            });
        }
    }

    fn change(&self, medium: Medium, stored: bool, id: &BlockId, parent: Option<&Key>) {
        if self.cfg.publishes(id.namespace.as_str()) {
            self.send(Msg::Change {
                medium,
                stored,
                id: id.clone(),
                parent: parent.cloned(),
            });
        }
    }
}

/// The publisher's end of the hub's queue.
pub struct HubReceiver(mpsc::Receiver<Msg>);

/// The hub for `cfg`, when `[events]` is on: made before the engine, so the
/// engine reports to it from its first change (the disk tier's records).
pub fn hub_for(cfg: &EventsSection) -> Option<(Arc<EventHub>, HubReceiver)> {
    cfg.enabled().then(|| EventHub::new(cfg))
}

/// This node's name (`[events] node`, else its cluster name, else its first
/// gRPC listener) and, with `[events]` on, the hub publishing from now on
/// with the server's metrics counting it.
pub async fn attach(
    cfg: &crate::config::Config,
    events: Option<(Arc<EventHub>, HubReceiver)>,
    peers: Option<&Arc<crate::cluster::GrpcPeers>>,
    engine: Arc<kvtier_core::Engine>,
    stop: tokio::sync::watch::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<(String, Option<(Arc<EventHub>, crate::metrics::Metrics)>)> {
    let node = match (&cfg.events.node, peers) {
        (n, _) if !n.is_empty() => n.clone(),
        (_, Some(p)) => p.me().to_string(),
        _ => cfg.server.listen[0].clone(),
    };
    let Some((hub, rx)) = events else {
        return Ok((node, None));
    };
    let mut metrics = crate::metrics::Metrics::with_cluster(engine, peers.map(|p| p.metrics()));
    hub.counters.register(&mut metrics.registry);
    let p = Publisher::start(&cfg.events, &node, rx, hub.counters.clone(), stop, tasks).await?;
    tracing::info!(
        endpoint = %p.endpoint,
        replay = p.replay.as_deref().unwrap_or(""),
        node,
        "KV events publishing over ZMQ PUB (vLLM's format, topic kv@{node}@NAMESPACE; docs/events.md)"
    );
    Ok((node, Some((hub, metrics))))
}
