//! Client of the bulk data plane (docs/wire.md): Read and Write payloads over
//! a pool of connections (TCP, TLS or the same-host socket), one request in
//! flight per connection. `Client` uses it automatically when the server
//! advertises a data-plane address (`Stats.data_listen`) or a same-host
//! socket (`Stats.local_listen`, docs/local.md) and `ClientConfig::data_plane`
//! is on. On the same-host socket payloads move through shared memory
//! (`local`).
use crate::{ClientError, ReadResult, Result, WriteBlock, WriteResult, to_read_block_checked};
use bytes::Bytes;
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use parking_lot::Mutex;
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

mod conn;
mod frame;
mod into;
mod local;
mod mapped;

pub use conn::{Conn, Target, WireTls};
use frame::{Frame, Sink, exchange};
pub use into::{FilledBlock, ReadIntoResult};
pub use mapped::MappedRead;

/// A pool of data-plane connections. Cheap to clone.
#[derive(Clone)]
pub struct WireClient {
    addr: Target,
    /// The server's segments mapped in this process (same-host socket).
    maps: Arc<local::Maps>,
    /// Whether payloads may move through shared memory (the same-host socket, until the
    /// server says it cannot share memory with this process).
    copies: Arc<std::sync::atomic::AtomicBool>,
    /// The process that opened the pool: a forked child must not use its
    /// parent's connections (their requests and replies would mix with the
    /// parent's), so it dials its own.
    owner: Arc<AtomicU64>,
    idle: Arc<Mutex<Vec<Conn>>>,
    slots: Arc<Semaphore>,
    next_id: Arc<AtomicU64>,
    timeout: Duration,
    /// Bound on opening one connection (TCP connect, TLS handshake, Hello).
    connect_timeout: Duration,
    /// TCP congestion control for new connections (`None`: system default).
    congestion: Option<Arc<str>>,
    /// Bearer token sent in a Hello frame on every new connection (docs/security.md).
    token: Option<Arc<str>>,
    /// TLS for every connection, when the server requires it.
    tls: Option<WireTls>,
    /// Connections in the pool (`slots`' permits).
    pool: usize,
    /// Most stripes one read is split into (1: never split).
    max_stripes: usize,
    /// Largest request the server accepts: writes are split to fit.
    max_request: Arc<AtomicU64>,
    /// The uid a same-host server may run as besides ours and root's
    /// (crate::listener).
    server_uid: Option<u32>,
}

fn transport(e: impl std::fmt::Display, addr: impl std::fmt::Display) -> ClientError {
    ClientError::Unreachable {
        addr: addr.to_string(),
        reason: e.to_string(),
    }
}

impl WireClient {
    /// Opens `connections` connections to `addr` (system default congestion
    /// control), each within `timeout`.
    pub async fn connect(
        addr: impl Into<Target>,
        connections: usize,
        timeout: Duration,
    ) -> Result<Self> {
        Self::connect_with(addr, connections, timeout, None).await
    }

    /// Opens `connections` connections to `addr` using TCP congestion control
    /// `congestion` where the kernel allows it (the system default otherwise).
    pub async fn connect_with(
        addr: impl Into<Target>,
        connections: usize,
        timeout: Duration,
        congestion: Option<&str>,
    ) -> Result<Self> {
        Self::connect_authenticated(addr, connections, timeout, congestion, None).await
    }

    /// Like [`WireClient::connect_with`], authenticating every connection with
    /// `token` (a Hello frame, docs/wire.md) when one is given.
    pub async fn connect_authenticated(
        addr: impl Into<Target>,
        connections: usize,
        timeout: Duration,
        congestion: Option<&str>,
        token: Option<&str>,
    ) -> Result<Self> {
        Self::connect_tls(addr, connections, timeout, timeout, congestion, token, None).await
    }

    /// Like [`WireClient::connect_authenticated`], over TLS when `tls` is
    /// given. The connections are opened at once, each (TCP connect, TLS
    /// handshake and Hello) within `connect_timeout`, as is every connection
    /// opened later to replace a dropped one: a listener that accepts and
    /// never answers, or an address nobody answers, fails with `UNAVAILABLE`
    /// after `connect_timeout` instead of hanging.
    pub async fn connect_tls(
        addr: impl Into<Target>,
        connections: usize,
        timeout: Duration,
        connect_timeout: Duration,
        congestion: Option<&str>,
        token: Option<&str>,
        tls: Option<WireTls>,
    ) -> Result<Self> {
        let uid = crate::listener::expected_uid(None)?;
        Self::open(
            addr.into(),
            connections,
            timeout,
            connect_timeout,
            congestion,
            token,
            tls,
            uid,
        )
        .await
    }

    /// The largest request the server accepts (`Stats.max_message_size`;
    /// default 256 MiB, the server's default): writes are split to fit.
    pub fn with_max_request(self, bytes: u64) -> Self {
        if bytes > 0 {
            self.max_request
                .store(bytes.min(u64::from(u32::MAX)), Ordering::Relaxed);
        }
        self
    }

    /// Splits long reads over at most `n` connections (1: never; the default
    /// is [`MAX_STRIPES`], bounded by the pool). See [`WireClient::read`].
    pub fn with_max_stripes(mut self, n: usize) -> Self {
        self.max_stripes = n.max(1);
        self
    }

    /// How many stripes a read of `blocks` keys is split into: one per
    /// [`STRIPE_MIN_BLOCKS`] keys, at most one per pooled connection and at
    /// most the configured maximum.
    pub fn stripes_for(&self, blocks: usize) -> usize {
        (blocks / STRIPE_MIN_BLOCKS)
            .min(self.pool)
            .min(self.max_stripes)
            .max(1)
    }

    /// Where the server's data plane is.
    pub fn addr(&self) -> &Target {
        &self.addr
    }

    /// Whether payloads move through shared memory (the same-host socket,
    /// and the server can share it with this process) rather than through
    /// the socket.
    pub fn copies_by_memory(&self) -> bool {
        self.copies.load(Ordering::Relaxed)
    }

    /// Idle connections, unless this is a forked child of the process that
    /// opened them: then none (the child dials its own).
    fn take_idle(&self) -> Option<Conn> {
        let me = u64::from(std::process::id());
        if self.owner.swap(me, Ordering::AcqRel) != me {
            for c in std::mem::take(&mut *self.idle.lock()) {
                c.abandon();
            }
            return None;
        }
        self.idle.lock().pop()
    }

    /// One request/response exchange on a pooled connection, all of it
    /// (waiting for a connection included) before `deadline`.
    async fn call(
        &self,
        kind: Kind,
        meta: Vec<u8>,
        data: &[Bytes],
        deadline: Instant,
    ) -> Result<Frame> {
        self.call_into(kind, meta, data, deadline, &mut Sink::Owned)
            .await
    }

    /// [`WireClient::call`], a ReadReply's payloads going where `sink` says.
    async fn call_into(
        &self,
        kind: Kind,
        meta: Vec<u8>,
        data: &[Bytes],
        deadline: Instant,
        sink: &mut Sink<'_, '_>,
    ) -> Result<Frame> {
        let r = tokio::time::timeout_at(deadline.into(), async {
            let (_slot, mut sock) = self.checkout(deadline).await?;
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match exchange(&mut sock, kind, id, meta, data, sink).await {
                Ok(f) => {
                    if reusable(&f) {
                        self.idle.lock().push(sock);
                    }
                    Ok(f)
                }
                // The connection's state is unknown after an error: drop it.
                // A transport failure usually means the server restarted or
                // went away, so the idle connections go too and a retry dials fresh.
                Err(e) => {
                    self.idle.lock().clear();
                    Err(transport(e, &self.addr))
                }
            }
        })
        .await;
        match r {
            Ok(r) => r,
            Err(_) => Err(ClientError::Status(tonic::Status::deadline_exceeded(
                format!(
                    "data plane {}: no answer within {:?}",
                    self.addr, self.timeout
                ),
            ))),
        }
    }

    /// Reads `keys` in order, stopping at the first missing block.
    ///
    /// A long read is striped: the keys are cut into contiguous runs
    /// ([`WireClient::stripes_for`]) read at once over separate pooled
    /// connections, so one TCP stream's window does not cap a long prefix
    /// across a real round-trip time (seed 003, notes/019). The caller still
    /// gets one prefix, in order: the runs are joined until the first one
    /// that stopped short, whose reason and `partial` the result carries;
    /// what later runs read past that point is dropped. Any run's transport
    /// error fails the whole read (the client's retry repeats it).
    ///
    /// A reply that reaches its size limit (reason `size`, docs/wire.md) is
    /// continued with a new request for the keys after it, within the same
    /// deadline; the result is the concatenation, with the server timings summed.
    pub async fn read(&self, ns: &str, keys: &[Key], lease_id: u64) -> Result<ReadResult> {
        self.read_by(ns, keys, lease_id, Instant::now() + self.timeout)
            .await
    }

    /// [`WireClient::read`], all of it before `deadline` (a caller retrying
    /// within one deadline).
    pub async fn read_by(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        deadline: Instant,
    ) -> Result<ReadResult> {
        let n = self.stripes_for(keys.len());
        if n <= 1 {
            return self.read_run(ns, keys, lease_id, deadline).await;
        }
        let runs = stripe_bounds(keys.len(), n);
        let parts = futures::future::join_all(
            runs.iter()
                .map(|r| self.read_run(ns, &keys[r.clone()], lease_id, deadline)),
        )
        .await;
        let mut out = ReadResult {
            blocks: Vec::with_capacity(keys.len()),
            partial: false,
            reason: String::new(),
            timing: Default::default(),
        };
        for (range, part) in runs.into_iter().zip(parts) {
            let part = part?;
            let complete = part.blocks.len() == range.len();
            out.blocks.extend(part.blocks.into_iter().map(|mut b| {
                b.index += range.start;
                b
            }));
            add_timing(&mut out.timing, &part.timing);
            out.reason = part.reason;
            if !complete {
                break;
            }
        }
        out.partial = out.blocks.len() < keys.len();
        Ok(out)
    }

    /// Reads one run of keys over one connection at a time, continuing
    /// replies that stopped for size.
    async fn read_run(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        deadline: Instant,
    ) -> Result<ReadResult> {
        let mut out = self.read_once(ns, keys, lease_id, deadline).await?;
        while out.reason == SIZE && out.blocks.len() < keys.len() {
            let from = out.blocks.len();
            let more = self
                .read_once(ns, &keys[from..], lease_id, deadline)
                .await?;
            if more.blocks.is_empty() && more.reason == SIZE {
                return Err(transport(
                    "a reply ended for size without a block",
                    &self.addr,
                ));
            }
            out.blocks.extend(more.blocks.into_iter().map(|mut b| {
                b.index += from;
                b
            }));
            add_timing(&mut out.timing, &more.timing);
            out.reason = more.reason;
        }
        out.partial = out.blocks.len() < keys.len();
        Ok(out)
    }

    /// One Read request (one reply frame).
    async fn read_once(
        &self,
        ns: &str,
        keys: &[Key],
        lease_id: u64,
        deadline: Instant,
    ) -> Result<ReadResult> {
        let req = read_request(ns, keys, lease_id, deadline);
        let f = self
            .call(Kind::Read, req.encode_to_vec(), &[], deadline)
            .await?;
        expect(f.header.kind, Kind::ReadReply, &f.meta)?;
        let reply = f
            .read_reply
            .ok_or_else(|| transport("read reply", &self.addr))?;
        if reply.blocks.len() != f.payloads.len() {
            return Err(transport(
                format!(
                    "read reply has {} blocks but {} payloads",
                    reply.blocks.len(),
                    f.payloads.len()
                ),
                &self.addr,
            ));
        }
        let mut out = ReadResult {
            blocks: Vec::with_capacity(reply.blocks.len()),
            partial: false,
            reason: String::new(),
            timing: Default::default(),
        };
        for (mut b, (p, crc)) in reply.blocks.into_iter().zip(f.payloads) {
            if let Some(blk) = b.block.as_mut() {
                blk.payload = p;
            }
            out.blocks.push(to_read_block_checked(b, crc)?);
        }
        if let Some(d) = reply.done {
            out.partial = d.partial;
            out.reason = d.reason;
            out.timing = d.timing.unwrap_or_default();
        }
        Ok(out)
    }

    /// Writes blocks (checksums computed here, verified by the server).
    pub async fn write(&self, ns: &str, blocks: &[WriteBlock]) -> Result<WriteResult> {
        self.write_by(ns, blocks, Instant::now() + self.timeout)
            .await
    }

    /// [`WireClient::write`], all of it before `deadline`. A batch larger
    /// than the server takes in one request ([`WireClient::with_max_request`])
    /// goes as several requests, one after another; each is stored whole or
    /// not at all, and a failed one fails the call, whatever the others stored.
    pub async fn write_by(
        &self,
        ns: &str,
        blocks: &[WriteBlock],
        deadline: Instant,
    ) -> Result<WriteResult> {
        self.write_split(ns, blocks, deadline).await
    }
}

/// `ReadDone.reason` of a reply that reached its size limit.
const SIZE: &str = "size";

/// Fewest keys per stripe: shorter reads are not split (a stripe costs a
/// request and a connection; 8 × 1.2 MB blocks is ~10 MB, several windows).
pub const STRIPE_MIN_BLOCKS: usize = 8;

/// Most stripes per read by default.
pub const MAX_STRIPES: usize = 8;

/// `len` keys cut into `n` contiguous runs whose lengths differ by at most 1.
fn stripe_bounds(len: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let (q, r) = (len / n, len % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let end = start + q + usize::from(i < r);
            let run = start..end;
            start = end;
            run
        })
        .collect()
}

/// The server's default `server.max_message_size`, until it says otherwise.
const DEFAULT_MAX_REQUEST: u64 = 256 << 20;

/// Largest read reply accepted (as the gRPC clients' message limit).
const MAX_REPLY: u64 = 512 << 20;

/// 90% of the time left until `deadline`, in ms (at least 1).
fn server_timeout_ms(deadline: Instant) -> u32 {
    let left = deadline.saturating_duration_since(Instant::now());
    (left.as_millis() * 9 / 10).clamp(1, u32::MAX as u128) as u32
}

/// Adds `b`'s server timing to `a` (a read continued over several replies,
/// or the parts of a cluster call).
pub(crate) fn add_timing(a: &mut pb::ServerTiming, b: &pb::ServerTiming) {
    a.queue_us += b.queue_us;
    a.service_us += b.service_us;
    a.storage_memory_us += b.storage_memory_us;
    a.storage_disk_us += b.storage_disk_us;
    a.storage_object_us += b.storage_object_us;
    a.storage_peer_us += b.storage_peer_us;
    a.total_us += b.total_us;
}

/// A Read's metadata (Read, MapRead): the server stops at 90% of the time
/// left so its partial answer arrives before the client gives up waiting.
fn read_request(ns: &str, keys: &[Key], lease_id: u64, deadline: Instant) -> pb::WireReadRequest {
    pb::WireReadRequest {
        request: Some(pb::ReadRequest {
            namespace: ns.to_string(),
            keys: keys.iter().map(Key::bytes).collect(),
            lease_id,
        }),
        timeout_ms: server_timeout_ms(deadline),
        max_reply_bytes: MAX_REPLY,
    }
}

/// The metadata key of an error frame's `reason` (docs/wire.md), when it has one.
pub(crate) const REASON: &str = "kvtier-reason";

/// Turns an `Error` frame into the status it carries.
fn expect(got: Kind, want: Kind, meta: &Bytes) -> Result<()> {
    if got == want {
        return Ok(());
    }
    if got == Kind::Error {
        let e = pb::WireError::decode(meta.clone()).unwrap_or_default();
        let mut status = tonic::Status::new(tonic::Code::from(e.code), e.message);
        if e.retry_pushback_ms > 0 {
            // The same hint a gRPC refusal carries, where retries look for it.
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", e.retry_pushback_ms.into());
        }
        if let Ok(reason) = e.reason.parse() {
            // Matched exactly where a client acts on it (into.rs: no_copies).
            status.metadata_mut().insert(REASON, reason);
        }
        return Err(ClientError::Status(status));
    }
    Err(ClientError::Status(tonic::Status::internal(format!(
        "data plane answered {got:?}, expected {want:?}"
    ))))
}

/// Whether the connection a reply came on can carry another request. The
/// server closes a connection after most Error frames (a frame over its
/// size limit, a request over its memory budget, an unauthenticated
/// request; docs/wire.md); only a shed request (`UNAVAILABLE`, its
/// connection kept) is sure to leave it open, and reopening connections to
/// an overloaded server would add to its load. Any other Error frame drops
/// the connection: the next request dials a fresh one.
fn reusable(f: &Frame) -> bool {
    f.header.kind != Kind::Error
        || pb::WireError::decode(f.meta.clone())
            .is_ok_and(|e| tonic::Code::from(e.code) == tonic::Code::Unavailable)
}

#[cfg(test)]
mod tests {
    use super::conn::dial;
    use super::*;

    /// A shed request's Error frame carries the server's retry hint; the
    /// client hands it on as gRPC's `grpc-retry-pushback-ms`, where the
    /// retry loops (and the bench's workers) look for it.
    #[test]
    fn an_error_frame_hands_on_the_retry_hint() {
        let frame = |ms| {
            Bytes::from(
                pb::WireError {
                    code: tonic::Code::Unavailable as i32,
                    message: "server overloaded".into(),
                    retry_pushback_ms: ms,
                    reason: String::new(),
                }
                .encode_to_vec(),
            )
        };
        let status = |meta: &Bytes| match expect(Kind::Error, Kind::ReadReply, meta) {
            Err(ClientError::Status(s)) => s,
            other => panic!("expected a status, got {other:?}"),
        };
        let shed = status(&frame(150));
        assert_eq!(shed.code(), tonic::Code::Unavailable);
        assert_eq!(crate::pushback(&shed), Some(Duration::from_millis(150)));
        assert_eq!(crate::pushback(&status(&frame(0))), None, "0: no hint");
    }

    #[tokio::test]
    async fn a_transport_failure_drops_the_idle_connections() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let mut socks = Vec::new();
            for _ in 0..4 {
                socks.push(l.accept().await.unwrap().0);
            }
            socks // dropped by the caller: every connection closes, as in a restart
        });
        let w = WireClient::connect(addr, 4, Duration::from_secs(5))
            .await
            .unwrap();
        drop(accept.await.unwrap());
        assert_eq!(w.idle.lock().len(), 4);
        let err = w.read("n", &[Key::new(&b"k"[..]).unwrap()], 0).await;
        let err = err.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Unavailable));
        // A dead connection is not an answer: never taken for a shed request.
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err:?}");
        assert!(err.retry_pause(0).is_some(), "retried like UNAVAILABLE");
        assert!(
            w.idle.lock().is_empty(),
            "the other (equally dead) connections are not handed to the retry"
        );
    }

    #[tokio::test]
    async fn dial_sets_the_congestion_control_and_tolerates_unknown_names() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let cc = |s: &Conn| {
            let v = socket2::SockRef::from(s.tcp().unwrap())
                .tcp_congestion()
                .unwrap();
            String::from_utf8_lossy(&v)
                .trim_end_matches('\0')
                .to_string()
        };
        let addr = Target::Tcp(addr);
        let s = dial(&addr, Some("reno"), None, None, None).await.unwrap();
        assert_eq!(cc(&s), "reno");
        // Unknown: the connection still works, on the system default.
        let s = dial(&addr, Some("nosuchcc"), None, None, None)
            .await
            .unwrap();
        assert!(!cc(&s).is_empty());
        let s = dial(&addr, None, None, None, None).await.unwrap();
        assert!(!cc(&s).is_empty());
    }
}
