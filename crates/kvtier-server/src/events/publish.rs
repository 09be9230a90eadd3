//! The publisher task: applies queued changes to the catalogue, batches the
//! resulting events per namespace, and sends them on the PUB socket as vLLM's
//! `ZmqEventPublisher` does (multipart `[topic, seq, payload]`, one sequence
//! counter per process), keeping the last `buffer_steps` batches for replay.
//!
//! The catalogue holds, for each block resident in this node's memory or
//! disk, which of the two hold it and its token ids (given by its writer),
//! and for a minute after it left both.
//! That is what lets a block demoted to disk or promoted back be announced
//! with its tokens, and a removal be announced only for a tier that held
//! the block (a consumer never sees a removal it cannot match). Its size is
//! bounded by the local tiers' block count plus a minute of evictions. The object store is not
//! tracked: it has no capacity to evict from, so its events are the puts
//! and deletes this node made.
use super::encode::{Event, encode_batch, hash_of};
use super::{EventCounters, HubReceiver, Msg};
use crate::config::EventsSection;
use bytes::Bytes;
use kvtier_core::BlockId;
use kvtier_core::events::Medium;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Tokens of a block no tier holds (a refused write, or one evicted and not
/// demoted) are forgotten after this.
const PENDING_FOR: Duration = Duration::from_secs(60);
/// Most events in one batch.
const MAX_BATCH: usize = 1024;
/// vLLM's end-of-replay marker: -1 as an 8-byte big-endian signed integer.
const END_SEQ: [u8; 8] = [0xff; 8];

/// Sent batches kept for replay: `(seq, topic, payload)`.
type Ring = Arc<Mutex<VecDeque<(u64, Bytes, Bytes)>>>;

#[derive(Debug)]
struct Entry {
    tokens: Option<Arc<[u32]>>,
    /// Bit 0: memory, bit 1: disk.
    media: u8,
}

fn bit(m: Medium) -> u8 {
    match m {
        Medium::Memory => 1,
        Medium::Disk => 2,
        Medium::Object => 0,
    }
}

/// The catalogue and the batches being gathered.
struct State {
    catalogue: HashMap<BlockId, Entry>,
    pending: VecDeque<(Instant, BlockId)>,
    batches: BTreeMap<String, Vec<Event>>,
    counters: EventCounters,
}

impl State {
    fn apply(&mut self, m: Msg) {
        match m {
            Msg::Tokens { id, tokens } => {
                let e = self.catalogue.entry(id.clone()).or_insert(Entry {
                    tokens: None,
                    media: 0,
                });
                e.tokens.get_or_insert(tokens);
                if e.media == 0 {
                    self.pending.push_back((Instant::now(), id));
                }
            }
            Msg::Change {
                medium,
                stored: true,
                id,
                parent,
            } => {
                let b = bit(medium);
                let e = self.catalogue.entry(id.clone()).or_insert(Entry {
                    tokens: None,
                    media: 0,
                });
                if b != 0 && e.media & b != 0 {
                    return; // already announced for this tier
                }
                e.media |= b;
                let tokens = e.tokens.clone();
                if e.media == 0 && e.tokens.is_none() {
                    self.catalogue.remove(&id);
                }
                if tokens.is_none() {
                    self.counters.untokened.inc();
                }
                let parent = parent.map(|p| hash_of(&BlockId::new(id.namespace.clone(), p)));
                self.push(
                    &id,
                    Event::Stored {
                        hash: hash_of(&id),
                        parent,
                        tokens,
                        medium,
                    },
                );
            }
            Msg::Change {
                medium,
                stored: false,
                id,
                ..
            } => {
                let b = bit(medium);
                if b != 0 {
                    let Some(e) = self.catalogue.get_mut(&id) else {
                        return;
                    };
                    if e.media & b == 0 {
                        return; // never announced here: nothing to take back
                    }
                    e.media &= !b;
                    if e.media == 0 {
                        // Kept a while: a block evicted from memory is
                        // written to disk right after, and is announced
                        // there with its tokens (llm-d forgets a block no
                        // tier holds, and cannot match a token-less one).
                        self.pending.push_back((Instant::now(), id.clone()));
                    }
                }
                self.push(
                    &id,
                    Event::Removed {
                        hash: hash_of(&id),
                        medium,
                    },
                );
            }
        }
    }

    fn push(&mut self, id: &BlockId, e: Event) {
        self.batches
            .entry(id.namespace.as_str().to_string())
            .or_default()
            .push(e);
    }

    /// Forgets tokens no tier took within [`PENDING_FOR`] (a refused write).
    fn sweep(&mut self, now: Instant) {
        while let Some((t, _)) = self.pending.front() {
            if now.duration_since(*t) < PENDING_FOR {
                break;
            }
            let (_, id) = self.pending.pop_front().expect("non-empty");
            if self.catalogue.get(&id).is_some_and(|e| e.media == 0) {
                self.catalogue.remove(&id);
            }
        }
    }
}

/// The running publisher: where it listens.
pub struct Publisher {
    /// The PUB endpoint as bound.
    pub endpoint: String,
    /// The replay endpoint as bound, if any.
    pub replay: Option<String>,
}

impl Publisher {
    /// Binds the sockets and spawns the tasks into `tasks`; they end when
    /// `stop` turns true, after sending what was gathered.
    pub async fn start(
        cfg: &EventsSection,
        node: &str,
        rx: HubReceiver,
        counters: EventCounters,
        stop: watch::Receiver<bool>,
        tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
    ) -> anyhow::Result<Self> {
        let mut pub_sock = zeromq::PubSocket::new();
        let bound = pub_sock
            .bind(&cfg.endpoint)
            .await
            .map_err(|e| anyhow::anyhow!("events.endpoint {:?}: {e}", cfg.endpoint))?;
        let ring: Ring = Arc::default();
        let replay = if cfg.replay_endpoint.is_empty() {
            None
        } else {
            let mut router = zeromq::RouterSocket::new();
            let at = router.bind(&cfg.replay_endpoint).await.map_err(|e| {
                anyhow::anyhow!("events.replay_endpoint {:?}: {e}", cfg.replay_endpoint)
            })?;
            tasks.spawn(serve_replay(router, ring.clone(), stop.clone()));
            Some(at.to_string())
        };
        let me = Self {
            endpoint: bound.to_string(),
            replay,
        };
        let run = Run {
            cfg: cfg.clone(),
            sock: pub_sock,
            ring,
            keep: cfg.buffer_steps,
            seq: 0,
            node: node.to_string(),
            ownership: format!("kvtier:{node}"),
            state: State {
                catalogue: HashMap::new(),
                pending: VecDeque::new(),
                batches: BTreeMap::new(),
                counters,
            },
        };
        tasks.spawn(run.run(rx, cfg.interval, stop));
        Ok(me)
    }
}

struct Run {
    cfg: EventsSection,
    sock: zeromq::PubSocket,
    ring: Ring,
    keep: usize,
    seq: u64,
    node: String,
    ownership: String,
    state: State,
}

impl Run {
    async fn run(
        mut self,
        mut rx: HubReceiver,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        // Whatever a consumer knew of this node is gone with the process:
        // say so first (the disk tier's records are announced after it).
        let star = "*".to_string();
        self.send(&star, &[Event::Cleared]).await;
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                m = rx.0.recv() => match m {
                    Some(m) => self.state.apply(m),
                    None => break,
                },
                _ = tick.tick() => self.flush().await,
                _ = sweep.tick() => self.state.sweep(Instant::now()),
                r = stop.changed() => if r.is_err() || *stop.borrow() { break },
            }
        }
        while let Ok(m) = rx.0.try_recv() {
            self.state.apply(m);
        }
        self.flush().await;
        Ok(())
    }

    async fn flush(&mut self) {
        let batches = std::mem::take(&mut self.state.batches);
        for (ns, events) in batches {
            for chunk in events.chunks(MAX_BATCH) {
                self.send(&ns, chunk).await;
            }
        }
    }

    async fn send(&mut self, ns: &str, events: &[Event]) {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let topic = Bytes::from(format!("kv@{}@{}", self.node, self.cfg.model_of(ns)));
        let payload = Bytes::from(encode_batch(ts, events, &self.ownership));
        let seq = self.seq;
        self.seq += 1;
        let msg = ZmqMessage::try_from(vec![
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload.clone(),
        ])
        .expect("three frames");
        // PUB drops for slow or absent subscribers; replay is the catch-up.
        if let Err(e) = self.sock.send(msg).await {
            tracing::debug!(error = %e, "KV event batch not sent");
        }
        self.state.counters.published.inc_by(events.len() as u64);
        let mut ring = self.ring.lock();
        ring.push_back((seq, topic, payload));
        while ring.len() > self.keep {
            ring.pop_front();
        }
    }
}

/// Answers replay requests as vLLM's `ZmqEventPublisher._service_replay`:
/// `[identity, "", start seq]` gets every kept batch from that sequence on,
/// then the end marker.
async fn serve_replay(
    mut router: zeromq::RouterSocket,
    ring: Ring,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    loop {
        let req = tokio::select! {
            r = router.recv() => r,
            r = stop.changed() => if r.is_err() || *stop.borrow() { return Ok(()) } else { continue },
        };
        let Ok(req) = req else { continue };
        let frames: Vec<Bytes> = req.into_vec();
        let (id, start) = match frames.as_slice() {
            [id, empty, seq] if empty.is_empty() && seq.len() == 8 => (
                id.clone(),
                u64::from_be_bytes(seq[..].try_into().expect("8 bytes")),
            ),
            _ => {
                tracing::warn!(frames = frames.len(), "invalid KV event replay request");
                continue;
            }
        };
        let kept: Vec<_> = ring
            .lock()
            .iter()
            .filter(|(s, _, _)| *s >= start)
            .cloned()
            .collect();
        for (seq, topic, payload) in kept {
            let m = ZmqMessage::try_from(vec![
                id.clone(),
                Bytes::new(),
                topic,
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ])
            .expect("frames");
            if router.send(m).await.is_err() {
                break;
            }
        }
        let end = ZmqMessage::try_from(vec![
            id,
            Bytes::new(),
            Bytes::new(),
            Bytes::copy_from_slice(&END_SEQ),
            Bytes::new(),
        ])
        .expect("frames");
        let _ = router.send(end).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::{Key, Namespace};

    fn id(k: &str) -> BlockId {
        BlockId::new(
            Namespace::new("ns").unwrap(),
            Key::new(k.as_bytes().to_vec()).unwrap(),
        )
    }

    fn state() -> State {
        State {
            catalogue: HashMap::new(),
            pending: VecDeque::new(),
            batches: BTreeMap::new(),
            counters: EventCounters::default(),
        }
    }

    fn change(medium: Medium, stored: bool, k: &str) -> Msg {
        Msg::Change {
            medium,
            stored,
            id: id(k),
            parent: None,
        }
    }

    #[test]
    fn demotion_carries_tokens_and_removals_only_follow_announcements() {
        let mut s = state();
        s.apply(Msg::Tokens {
            id: id("a"),
            tokens: vec![1, 2].into(),
        });
        s.apply(change(Medium::Memory, true, "a"));
        // A removal for a tier that never held the block says nothing.
        s.apply(change(Medium::Disk, false, "a"));
        // Demotion: memory out, disk in, with the tokens still known.
        s.apply(change(Medium::Memory, false, "a"));
        s.apply(change(Medium::Disk, true, "a"));
        s.apply(change(Medium::Disk, true, "a")); // a duplicate says nothing
        s.apply(change(Medium::Disk, false, "a"));
        let ev = &s.batches["ns"];
        let tokens: Option<Arc<[u32]>> = Some(vec![1, 2].into());
        let h = hash_of(&id("a"));
        assert_eq!(
            ev,
            &vec![
                Event::Stored {
                    hash: h,
                    parent: None,
                    tokens: tokens.clone(),
                    medium: Medium::Memory
                },
                Event::Removed {
                    hash: h,
                    medium: Medium::Memory
                },
                Event::Stored {
                    hash: h,
                    parent: None,
                    tokens,
                    medium: Medium::Disk
                },
                Event::Removed {
                    hash: h,
                    medium: Medium::Disk
                },
            ]
        );
        s.sweep(Instant::now() + PENDING_FOR);
        assert!(s.catalogue.is_empty(), "a block in no tier is forgotten");
    }

    #[test]
    fn tokens_of_a_block_no_tier_took_are_forgotten() {
        let mut s = state();
        s.apply(Msg::Tokens {
            id: id("x"),
            tokens: vec![9].into(),
        });
        s.sweep(Instant::now());
        assert_eq!(s.catalogue.len(), 1);
        s.sweep(Instant::now() + PENDING_FOR);
        assert!(s.catalogue.is_empty());
    }
}
