//! The bulk data plane: Read and Write over a length-prefixed binary protocol
//! on its own TCP listener (framing in `kvtier_proto::wire`, spec in
//! `docs/wire.md`). Lookups and control stay on gRPC.
//!
//! Why it exists: HTTP/2 (tonic/hyper) moves a 1.2 MB payload through flow
//! control windows, 16 KiB–16 MiB DATA frames and extra buffer copies; the
//! measurements in `notes/006-data-plane.md` put it well below Redis for
//! MB-sized values. Here a reply is written with one vectored write straight
//! from the store's `Bytes` (no user-space copy) and a request's payloads are
//! read into one buffer sliced per block, each checksummed as its bytes arrive
//! (so verification overlaps the transfer instead of following it).
//!
//! One request at a time per connection, answered in order (clients keep a
//! pool of connections, like Redis clients). Errors come back as `Error`
//! frames carrying a gRPC status code and message; a malformed frame closes
//! the connection after the error frame.
use crate::auth::Principal;
use crate::refusal::{self, Refusal};
use crate::rx_stamp::{self, FrameStream};
use crate::state::Shared;
use crate::timing::Clock;
use bytes::Bytes;
use kvtier_proto::bounded;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{
    HEADER_LEN, Header, Kind, check_lengths, discard, read_exact_bytes, read_payloads_checked,
    write_all_vectored,
};
use prost::Message;
use std::time::{Duration, Instant};
use taken::Taken;
use tokio::io::AsyncWriteExt;

mod handlers;
mod hello;
mod linger;
mod reply;
mod shared_memory;
mod taken;
use handlers::{read, write, write_rejected};
use reply::{Reply, error_reply, status_reply};
use tokio::net::TcpListener;
use tokio::sync::watch;

const API: &str = "wire";

/// Accepts connections until `stop` flips.
pub async fn serve(
    listener: TcpListener,
    tls: Option<crate::tls::Acceptor>,
    shared: Shared,
    max_frame: u64,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    rx_stamp::enable(&listener);
    let mut stopping = stop.clone();
    let conns = shared.limits.conns(0);
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (sock, peer) = match r {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "data plane accept failed"); continue; }
                };
                // Past server.max_connections a new connection takes the oldest
                // idle one's slot; it is closed only when every one is busy
                // (each holds a descriptor and a task).
                let slot = match conns.admit(Some(peer.ip())) {
                    Ok(slot) => slot,
                    Err(full) => {
                        shared.observe(API, "connect", "resource_exhausted", &Clock::start(None));
                        tracing::debug!(%peer, "data plane: connection closed at accept: {full}");
                        continue;
                    }
                };
                let _ = sock.set_nodelay(true);
                let shared = shared.clone();
                let stop = stop.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let r = match tls {
                        None => connection(sock, shared, max_frame, stop, slot).await,
                        Some(acceptor) => {
                            let hs = tokio::time::timeout(shared.limits.read_timeout, acceptor.accept(sock)).await;
                            match hs {
                                Ok(Ok(s)) => connection(s, shared, max_frame, stop, slot).await,
                                Ok(Err(e)) => Err(e.into()),
                                Err(_) => Err(anyhow::anyhow!("TLS handshake timed out")),
                            }
                        }
                    };
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "data plane connection closed");
                    }
                });
            }
            _ = stopping.wait_for(|s| *s) => return Ok(()),
        }
    }
}

/// Sets the TCP congestion control on the listener; accepted connections
/// inherit it. A name the kernel refuses (unknown, or not allowed for this
/// user) is logged and the system default stays in effect.
pub fn set_congestion(listener: &TcpListener, name: &str) {
    if name.is_empty() {
        return;
    }
    match socket2::SockRef::from(listener).set_tcp_congestion(name.as_bytes()) {
        Ok(()) => tracing::debug!(congestion = name, "data plane congestion control"),
        Err(e) => tracing::warn!(
            congestion = name,
            error = %e,
            "server.data_tcp_congestion refused by the kernel; data-plane connections use the system default"
        ),
    }
}

/// Serves one connection (TCP or the same-host socket) until it closes; one
/// closed because its client stopped reading a reply is counted.
pub(crate) async fn connection<S: FrameStream>(
    sock: S,
    shared: Shared,
    max_frame: u64,
    stop: watch::Receiver<bool>,
    slot: crate::limits::Slot,
) -> anyhow::Result<()> {
    let write_timeout = shared.limits.write_timeout;
    let r = requests(sock, shared, max_frame, stop, slot).await;
    if let Err(e) = &r
        && taken::is_stalled(e)
    {
        crate::limits::stalled("data", write_timeout);
    }
    r
}

async fn requests<S: FrameStream>(
    mut sock: S,
    shared: Shared,
    max_frame: u64,
    mut stop: watch::Receiver<bool>,
    slot: crate::limits::Slot,
) -> anyhow::Result<()> {
    // Given to a newer connection while this one was idle: closed.
    let evicted = slot.evicted();
    tokio::pin!(evicted);
    // Who is on this connection: anyone when authentication is off, else
    // nobody until a Hello frame names a token (docs/wire.md, docs/security.md).
    let mut who = (!shared.auth.enabled()).then_some(Principal::Anyone);
    // A reply the client takes no byte of for this long (it stopped reading)
    // ends the connection and gives the request's admission and its
    // payloads back (docs/security.md, "Threats and their guards").
    let idle = shared.limits.write_timeout;
    // What this connection holds of the same-host front's shared memory
    // (mappings announced, leases, its lent segment): dropped with it.
    let mut shm = sock.shm().map(shared_memory::ShmConn::new);
    loop {
        let mut raw = [0u8; HEADER_LEN];
        let stamp = tokio::select! {
            r = tokio::time::timeout(shared.limits.idle_timeout, sock.read_header(&mut raw)) => match r {
                Ok(r) => r?,
                Err(_) => return Ok(()), // idle (or a header that never completed): closed
            },
            _ = stop.wait_for(|s| *s) => return Ok(()),
            _ = &mut evicted => return Ok(()),
        };
        // From when the kernel received the frame, where the socket says:
        // time spent waiting in the socket for a busy server is queue time.
        let now = Instant::now();
        let waited = rx_stamp::waited(stamp, shared.limits.idle_timeout);
        let arrived = now.checked_sub(waited).unwrap_or(now);
        // The rest of the frame must arrive within server.read_timeout of its
        // header being read (not of its stamp: a wall clock stepped forward
        // must not fail the read).
        let by = tokio::time::Instant::from_std(now + shared.limits.read_timeout);
        let header = match Header::decode(&raw) {
            Ok(h) => h,
            Err(e) => {
                // Not a frame (another protocol, a stray client): answered,
                // then whatever it sends drained before the close, so the
                // answer is not lost to a reset (how much is unknown:
                // bounded by linger's byte and time limits).
                let r = error_reply(refusal::Kind::InvalidArgument, e);
                let unread = crate::limits::refused::DRAIN_BYTES;
                linger::refuse(&mut sock, &shared.limits, 0, r, unread, "wire_header").await?;
                return Ok(());
            }
        };
        // Before Hello, nothing but a small Hello is read (hello.rs).
        if header.kind == Kind::Hello || who.is_none() {
            match hello::gate(&mut sock, &shared, &header, by).await? {
                Some(p) => {
                    who = Some(p);
                    continue;
                }
                None => return Ok(()),
            }
        }
        // Refused before the body is read: the answer, then a lingering
        // close (linger.rs). A frame over the limit never fits, busy or not.
        let frame = header.meta_len as u64 + header.data_len as u64;
        if frame > max_frame {
            let msg = format!(
                "frame of {frame} bytes exceeds the maximum message size of {max_frame} bytes (server.max_message_size)"
            );
            shared.observe(API, "admit", "invalid_argument", &Clock::start(None));
            let r = error_reply(refusal::Kind::InvalidArgument, msg);
            linger::refuse(
                &mut sock,
                &shared.limits,
                header.request_id,
                r,
                frame,
                "wire_frame",
            )
            .await?;
            return Ok(());
        }
        // Bytes about to be held in memory (metadata, and a Write's payloads)
        // are reserved before any is read. One larger than the whole budget
        // can never fit, busy or not: RESOURCE_EXHAUSTED, then a lingering
        // close. One that does not fit now is shed: its body discarded
        // unstored, UNAVAILABLE with a retry hint, the connection kept.
        let held = u64::from(header.meta_len)
            + if header.kind == Kind::Write {
                u64::from(header.data_len)
            } else {
                0
            };
        let _held = match shared.limits.reserve(held) {
            Ok(r) => r,
            Err(refusal) => {
                let clock = Clock::start(Some(arrived));
                shared.observe(API, "admit", refusal.label(), &clock);
                if refusal.kind == refusal::Kind::Overloaded {
                    // The answer first (the client reads it while it sends),
                    // then the body discarded; a body that stops arriving
                    // ends the connection at server.read_timeout.
                    crate::limits::refused::log("wire_busy", &refusal.message);
                    write_reply(&mut sock, idle, header.request_id, status_reply(refusal)).await?;
                    within(by, discard(&mut sock, frame)).await?;
                    continue;
                }
                let r = status_reply(refusal);
                linger::refuse(
                    &mut sock,
                    &shared.limits,
                    header.request_id,
                    r,
                    frame,
                    "wire_memory",
                )
                .await?;
                return Ok(());
            }
        };
        // Into uninitialised buffers: no memset of the payload before the socket fills it.
        let meta = within(by, read_exact_bytes(&mut sock, header.meta_len as usize)).await?;
        // In service until its reply is written: the slot is not given away.
        let _busy = slot.busy();
        let Some(who) = who.clone() else {
            return Ok(()); // not reached: hello::gate closes such a connection
        };
        // Shed before any work when the request already queued in its
        // socket longer than the front's limit allows (docs/operations.md).
        if matches!(
            header.kind,
            Kind::Read | Kind::Write | Kind::MapRead | Kind::WriteLent
        ) && shared.admission.too_late(waited)
        {
            within(by, discard(&mut sock, header.data_len.into())).await?;
            let status = shared.shed(crate::admission::Refused::Late);
            write_reply(&mut sock, idle, header.request_id, status_reply(status)).await?;
            continue;
        }
        let reply = match header.kind {
            Kind::Read => {
                within(by, discard(&mut sock, header.data_len.into())).await?;
                read(&shared, &who, meta, arrived, max_frame).await
            }
            // List lengths are checked before decoding (kvtier_proto::bounded).
            Kind::Write => match bounded::check::<pb::WireWriteRequest>(&meta)
                .map_err(|s| s.message().to_owned())
                .and_then(|()| pb::WireWriteRequest::decode(meta).map_err(|e| e.to_string()))
            {
                Ok(req) => match check_lengths(&req.payload_lengths, header.data_len.into())
                    .map_err(Refusal::invalid)
                    .and_then(|()| {
                        // Access is checked before a payload byte is read.
                        let ns = req.request.as_ref().map_or("", |w| w.namespace.as_str());
                        shared.allow(&who, ns, true)
                    }) {
                    Ok(()) => {
                        // Checksummed as the bytes arrive (verified against the
                        // request's crc32c values before anything is stored).
                        let payloads =
                            within(by, read_payloads_checked(&mut sock, &req.payload_lengths))
                                .await?;
                        write(&shared, req, payloads, arrived).await
                    }
                    Err(status) => {
                        within(by, discard(&mut sock, header.data_len.into())).await?;
                        write_rejected(&shared, arrived, status)
                    }
                },
                Err(e) => {
                    within(by, discard(&mut sock, header.data_len.into())).await?;
                    let status = Refusal::invalid(format!("bad write request: {e}"));
                    write_rejected(&shared, arrived, status)
                }
            },
            // Payloads through shared memory: only on the same-host front
            // (docs/local.md).
            Kind::MapRead | Kind::Release | Kind::Lend | Kind::WriteLent => {
                within(by, discard(&mut sock, header.data_len.into())).await?;
                match shm.as_mut() {
                    None => shared_memory::no_memory_copy(
                        "shared memory is served only on the same-host socket (server.local_listen)",
                    ),
                    Some(conn) => match header.kind {
                        Kind::MapRead => {
                            shared_memory::map_read(&shared, &who, meta, arrived, max_frame, conn)
                                .await
                        }
                        Kind::Release => shared_memory::release(meta, conn),
                        Kind::Lend => shared_memory::lend(meta, max_frame, conn),
                        _ => shared_memory::write_lent(&shared, &who, meta, arrived, conn).await,
                    },
                }
            }
            other => {
                within(by, discard(&mut sock, header.data_len.into())).await?;
                error_reply(
                    refusal::Kind::InvalidArgument,
                    format!("frame kind {other:?} is not a request"),
                )
            }
        };
        write_reply(&mut sock, idle, header.request_id, reply).await?;
    }
}

/// `io` finished by `by`, or a TimedOut error (the connection is then closed).
async fn within<T>(
    by: tokio::time::Instant,
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout_at(by, io).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "request not received within server.read_timeout",
        ))
    })
}

/// Header + meta + payloads with vectored writes: the payloads go from the
/// store's buffers to the socket without a user-space copy. A write that
/// waits `idle` for the client to take more bytes fails with TimedOut (the
/// connection is then closed, and the reply's admission and payloads given
/// back with it): a client that stops reading holds nothing for longer than
/// `server.write_timeout`, however slowly the one that reads takes a reply.
async fn write_reply<S: FrameStream>(
    sock: &mut S,
    idle: Duration,
    request_id: u64,
    r: Reply,
) -> std::io::Result<()> {
    let data_len: usize = r.data.iter().map(Bytes::len).sum();
    let header = Header {
        kind: r.kind,
        request_id,
        meta_len: r.meta.len() as u32,
        data_len: data_len as u32,
    }
    .encode();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(2 + r.data.len());
    // Descriptors go with the frame's first bytes (header and metadata, in
    // one message); the rest follows as usual.
    let mut first = Vec::new();
    if !r.fds.is_empty() {
        first.extend_from_slice(&header);
        first.extend_from_slice(&r.meta);
        let shared: Vec<std::os::fd::OwnedFd> = r
            .fds
            .iter()
            .map(|s| s.share())
            .collect::<std::io::Result<_>>()?;
        let fds: Vec<std::os::fd::BorrowedFd<'_>> =
            shared.iter().map(std::os::fd::AsFd::as_fd).collect();
        let sent = tokio::time::timeout(idle, sock.send_fds(&first, &fds))
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))?;
        parts.push(&first[sent..]);
    } else {
        parts.push(&header);
        parts.push(&r.meta);
    }
    parts.extend(r.data.iter().map(|b| &b[..]));
    let mut taken = Taken {
        io: sock,
        idle,
        stall: None,
    };
    write_all_vectored(&mut taken, &parts).await?;
    let flushed = taken.flush().await;
    // The reply budget is given back once the payloads are written (or, on
    // an error above, when the reply is dropped).
    drop(r.charge);
    flushed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_inherit_the_listeners_congestion_control() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        set_congestion(&l, "reno");
        let addr = l.local_addr().unwrap();
        let c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let cc = socket2::SockRef::from(&s).tcp_congestion().unwrap();
        assert_eq!(String::from_utf8_lossy(&cc).trim_end_matches('\0'), "reno");
        // A name the kernel does not know leaves the default in place (no panic, no error).
        set_congestion(&l, "nosuchcc");
        drop(c);
    }
}
