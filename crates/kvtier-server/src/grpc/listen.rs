//! Serving a gRPC listener: the connection cap and idle timeout
//! ([`limits::Capped`]), TLS handshakes, graceful shutdown, and listeners on
//! their own pinned runtimes.
use crate::{GrpcRouter, limits, numa, tls};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::watch;

/// Serves one gRPC listener on its own runtime, every worker pinned to
/// `cpus`; the returned future ends when that runtime's thread does.
pub(crate) fn serve_grpc_pinned(
    router: GrpcRouter,
    std_listener: std::net::TcpListener,
    rx: watch::Receiver<bool>,
    addr: SocketAddr,
    cpus: Vec<usize>,
    accept: GrpcAccept,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>> + use<>> {
    let pin = cpus.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus.len())
        .thread_name(format!("kvtier-{}", addr.port()))
        .on_thread_start(move || {
            if let Err(e) = numa::pin_current_thread(&pin) {
                tracing::warn!(error = %e, "could not pin listener thread");
            }
        })
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name(format!("kvtier-listener-{}", addr.port()))
        .spawn(move || {
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                serve_grpc(router, listener, rx, addr, accept).await
            })
        })?;
    Ok(async move {
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("listener thread for {addr} panicked"))?
    })
}

/// How a gRPC listener admits connections.
pub(crate) struct GrpcAccept {
    /// The listener's connection table (`server.max_connections`, per client).
    pub(crate) conns: limits::Conns,
    /// A connection with no request in service this long is closed.
    pub(crate) idle: Duration,
    /// TLS, with the certificate current at each accept.
    pub(crate) tls: Option<tls::Acceptor>,
    /// A TLS handshake must complete within this (`server.read_timeout`).
    pub(crate) handshake_timeout: Duration,
}

pub(crate) async fn serve_grpc(
    router: GrpcRouter,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    addr: SocketAddr,
    accept: GrpcAccept,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    // Receive stamps on every connection: a request's wait in its socket
    // counts as queue time (crate::grpc::late).
    crate::rx_stamp::enable(&listener);
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)));
    let (conns, idle, stop_conn) = (accept.conns.clone(), accept.idle, stop.clone());
    let capped = incoming.filter_map(move |r| {
        let (conns, stop_conn) = (conns.clone(), stop_conn.clone());
        async move {
            match r {
                Ok(io) => match conns.admit(io.peer_addr().ok().map(|a| a.ip())) {
                    Ok(slot) => Some(Ok::<_, std::io::Error>(limits::Capped::new(
                        io,
                        slot,
                        idle,
                        stop_conn.clone(),
                    ))),
                    Err(full) => {
                        tracing::debug!(%addr, "gRPC: connection closed at accept: {full}");
                        None
                    }
                },
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "gRPC: accept failed");
                    None
                }
            }
        }
    });
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let served = match accept.tls {
        None => router.serve_with_incoming_shutdown(capped, shutdown).await,
        Some(acceptor) => {
            // Handshakes run concurrently, each bounded, so a slow or silent
            // client holds only its own connection slot.
            let timeout = accept.handshake_timeout;
            let handshaken = capped
                .map(move |io| {
                    let acceptor = acceptor.clone();
                    async move {
                        let io = io.ok()?;
                        match tokio::time::timeout(timeout, acceptor.accept(io)).await {
                            Ok(Ok(tls)) => Some(Ok::<_, std::io::Error>(tls)),
                            Ok(Err(e)) => {
                                tracing::debug!(%addr, error = %e, "gRPC: TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(%addr, "gRPC: TLS handshake timed out");
                                None
                            }
                        }
                    }
                })
                .buffer_unordered(1024)
                .filter_map(std::future::ready);
            router
                .serve_with_incoming_shutdown(handshaken, shutdown)
                .await
        }
    };
    served.with_context(|| format!("gRPC server on {addr}"))
}
