//! Helpers the limits tests share (`limits_*.rs`): a server with given
//! request memory, connection cap and timeouts, raw data-plane and HTTP
//! replies read off a socket, whether the server closed it, and a gRPC-only
//! client with the blocks it writes.
use kvtier_proto::wire::Header;
use kvtier_server::Server;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The next frame's header and metadata, or None when the server closed.
pub async fn reply(sock: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut head = [0u8; 24];
    sock.read_exact(&mut head).await.ok()?;
    let h = Header::decode(&head).unwrap();
    let mut meta = vec![0u8; h.meta_len as usize];
    sock.read_exact(&mut meta).await.ok()?;
    Some((h, meta))
}

/// Whether the server closes `sock` (EOF or an error) within `within`.
pub async fn closed(sock: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(within, sock.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A server with `memory` bytes of request memory, at most `conns`
/// connections, and idle and read timeouts of `idle_ms` and `read_ms` (the
/// HTTP request-head timeout, `server.header_timeout`, and the reply's
/// `server.write_timeout` are `idle_ms` too).
pub async fn server(memory: u64, conns: usize, idle_ms: u64, read_ms: u64) -> Server {
    let mut cfg = super::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize(memory);
    cfg.server.max_connections = conns;
    cfg.server.idle_timeout = Duration::from_millis(idle_ms);
    cfg.server.write_timeout = Duration::from_millis(idle_ms);
    cfg.server.header_timeout = Duration::from_millis(idle_ms);
    cfg.server.read_timeout = Duration::from_millis(read_ms);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    Server::start(cfg).await.unwrap()
}

/// The status line and headers of an HTTP response, or None when closed.
pub async fn http_head(sock: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut b)).await {
            Ok(Ok(1)) => buf.push(b[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// A client of `s` over gRPC only (no data plane), without retries.
pub async fn grpc_client(s: &Server) -> kvtier_client::Client {
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.data_plane = false;
    cc.retries = 0;
    cc.timeout = Duration::from_secs(20);
    kvtier_client::Client::connect(cc).await.unwrap()
}

/// A block of `n` bytes under key `k`.
pub fn block(k: &str, n: usize) -> kvtier_client::WriteBlock {
    kvtier_client::WriteBlock {
        token_ids: Vec::new(),
        key: kvtier_core::Key::new(k.as_bytes().to_vec()).unwrap(),
        parent: None,
        token_count: 0,
        payload: bytes::Bytes::from(vec![3u8; n]),
        ttl_ms: 0,
    }
}

/// Waits until the server has read every byte `sock` sent it: the kernel's
/// receive queue of the server's end (`/proc/net/tcp`, found by the two
/// ports) is empty. A probe, not a sleep: what the server does next with
/// those bytes (mark the connection busy) follows in the same poll.
pub async fn until_read_by_server(sock: &TcpStream) {
    let (here, there) = (sock.local_addr().unwrap(), sock.peer_addr().unwrap());
    let want = format!(":{:04X} ", there.port());
    let from = format!(":{:04X} ", here.port());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let queued = table.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, remote) = (format!("{} ", f.get(1)?), format!("{} ", f.get(2)?));
            if !(local.ends_with(&want) && remote.ends_with(&from)) {
                return None;
            }
            let rx = f.get(4)?.split(':').nth(1)?;
            u64::from_str_radix(rx, 16).ok()
        });
        if queued == Some(0) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never read what was sent (receive queue {queued:?})"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
