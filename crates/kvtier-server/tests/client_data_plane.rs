//! The Rust client's data plane against servers that misbehave or refuse:
//! an advertised address that never answers (fallback to gRPC within the
//! connect timeout), a connection the server closed after an Error frame
//! (not reused), and retries that share the call's one deadline.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_server::{KvTier, KvTierServer};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// A gRPC server that advertises `data_listen` as its data plane and
/// stores nothing: Write answers "stored" (counted in `writes`), the rest
/// is unimplemented.
struct Fake {
    data_listen: String,
    writes: Arc<AtomicUsize>,
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<pb::ReadResponse, Status>> + Send>>;

#[tonic::async_trait]
impl KvTier for Fake {
    async fn lookup(
        &self,
        _: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    type ReadStream = ReadStream;
    async fn read(&self, _: Request<pb::ReadRequest>) -> Result<Response<ReadStream>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::WriteResponse {
            stored: r.into_inner().blocks.len() as u32,
            ..Default::default()
        }))
    }
    async fn write_stream(
        &self,
        _: Request<Streaming<pb::WriteRequest>>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn lease(
        &self,
        _: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn stats(
        &self,
        _: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        Ok(Response::new(pb::StatsResponse {
            data_listen: self.data_listen.clone(),
            ..Default::default()
        }))
    }
}

/// Starts a [`Fake`] advertising `data`; its gRPC endpoint and write count.
async fn fake_server(data: std::net::SocketAddr) -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let writes = Arc::new(AtomicUsize::new(0));
    let fake = Fake {
        data_listen: data.to_string(),
        writes: writes.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(KvTierServer::new(fake))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    (format!("http://{addr}"), writes)
}

fn block(k: &str, n: usize) -> WriteBlock {
    WriteBlock {
        token_ids: Vec::new(),
        key: Key::new(k.as_bytes().to_vec()).unwrap(),
        parent: None,
        token_count: 0,
        payload: Bytes::from(vec![7u8; n]),
        ttl_ms: 0,
    }
}

/// An advertised data plane that accepts connections and never answers
/// their Hello: `Client::connect` gives up on it within the connect timeout
/// and sends Read/Write over gRPC, as with a server that offers none.
#[tokio::test]
async fn an_advertised_data_plane_that_never_answers_falls_back_to_grpc() {
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let (endpoint, writes) = fake_server(data).await;
    let mut cc = ClientConfig::new(endpoint);
    cc.token = Some("a-token".into()); // a Hello on every data-plane connection
    cc.connect_timeout = Duration::from_millis(300);
    let t = Instant::now();
    let c = tokio::time::timeout(Duration::from_secs(10), Client::connect(cc))
        .await
        .expect("connect hung on a data plane that never answers")
        .expect("connects, over gRPC only");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(c.data_plane().is_none(), "the data plane is not used");
    let w = c.write("ns", &[block("k", 100)]).await.unwrap();
    assert_eq!(w.stored, 1);
    assert_eq!(
        writes.load(Ordering::Relaxed),
        1,
        "the write went over gRPC"
    );
}

/// An advertised data plane that refuses connections (nobody listens):
/// the same fallback.
#[tokio::test]
async fn an_advertised_data_plane_that_refuses_connections_falls_back_to_grpc() {
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data = gone.local_addr().unwrap();
    drop(gone);
    let (endpoint, writes) = fake_server(data).await;
    let c = Client::connect(ClientConfig::new(endpoint))
        .await
        .expect("connects, over gRPC only");
    assert!(c.data_plane().is_none());
    c.write("ns", &[block("k", 100)]).await.unwrap();
    assert_eq!(writes.load(Ordering::Relaxed), 1);
}

/// The server closes a data-plane connection after refusing a request over
/// its memory budget (docs/wire.md). The client must not hand that
/// connection to the next request: with one connection and no retries, a
/// small read right after the refused write succeeds.
#[tokio::test]
async fn a_connection_closed_after_an_error_frame_is_not_reused() {
    let mut cfg = common::test_config();
    cfg.server.request_memory = kvtier_core::ByteSize(64 << 10);
    let server = kvtier_server::Server::start(cfg).await.unwrap();
    let mut cc = ClientConfig::new(common::raw_endpoint(&server));
    cc.data_connections = 1;
    cc.retries = 0;
    let c = Client::connect(cc).await.unwrap();
    assert!(c.data_plane().is_some());
    c.write("ns", &[block("small", 1000)]).await.unwrap();

    let err = c.write("ns", &[block("big", 256 << 10)]).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::ResourceExhausted), "{err}");
    // Let the server's close reach the client's socket.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = c
        .read("ns", &[Key::new(&b"small"[..]).unwrap()], 0)
        .await
        .expect("the next request gets a working connection");
    assert_eq!(r.blocks.len(), 1);
}

/// A data-plane call's retries share its one deadline: an attempt that
/// fails late (the connection dropped after most of the timeout) leaves
/// the retry only what is left of it, not a fresh timeout.
#[tokio::test]
async fn data_plane_retries_share_the_calls_deadline() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut first = true;
        while let Ok((mut s, _)) = l.accept().await {
            if std::mem::take(&mut first) {
                // The first connection takes a request, then drops after 1.5 s.
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    let _ = s.read(&mut b).await;
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                });
            } else {
                held.push(s); // every later one never answers
            }
        }
    });
    let (endpoint, _) = fake_server(data).await;
    let mut cc = ClientConfig::new(endpoint);
    cc.data_connections = 1;
    cc.timeout = Duration::from_secs(2);
    cc.retries = 2;
    let c = Client::connect(cc).await.unwrap();
    assert!(c.data_plane().is_some());
    let t = Instant::now();
    let err = c
        .read("ns", &[Key::new(&b"k"[..]).unwrap()], 0)
        .await
        .unwrap_err();
    let took = t.elapsed();
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    // A fresh 2 s per attempt would take 1.5 s + 2 s at least; the margin
    // to the shared deadline's 2 s is a second, for a loaded machine.
    assert!(
        took < Duration::from_millis(3000),
        "a 2 s call took {took:?}"
    );
}
