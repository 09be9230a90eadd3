//! A cluster with authentication on (docs/cluster.md): nodes call each other
//! with `KVTIER_CLUSTER_TOKEN`, and refuse to start without it; a client's
//! own token is checked on the node it calls and works across the cluster;
//! a client claiming to be another node (`kvtier-forwarded`) is not served as
//! one, so it cannot replace an immutable block; with `cluster.dns` the token
//! would go in plaintext to whatever the name resolves to, so that needs
//! `cluster.insecure_dns = true`.
mod common;

use bytes::Bytes;
use common::cluster::{Node, chain, keys, nodes};
use common::{BIN, ready};
use kvtier_client::{Client, ClientConfig};
use kvtier_proto::v1 as pb;
use kvtier_proto::v1::kv_tier_client::KvTierClient;
use kvtier_proto::v1::kv_tier_server::{KvTier, KvTierServer};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::{Request, Response, Status};

const NS: &str = "acme/model";
const CLIENT: &str = "acme-client-token-0123456789";
const PEER: &str = "cluster-peer-token-0123456789";

fn launch(
    n: &Node,
    members: &[String],
    tokens: &std::path::Path,
    peer_token: Option<&str>,
) -> Result<std::process::Child, String> {
    launch_with(n, &n.config(None, members), tokens, peer_token)
}

/// Starts `n` with config `text` plus `[auth]` on `tokens`.
fn launch_with(
    n: &Node,
    text: &str,
    tokens: &std::path::Path,
    peer_token: Option<&str>,
) -> Result<std::process::Child, String> {
    let cfg = n.dir.join("kvtier.toml");
    let text = format!("{text}\n[auth]\ntokens_file = \"{}\"\n", tokens.display());
    std::fs::write(&cfg, text).unwrap();
    let log = n.dir.join("log");
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--ready-json", "--config"])
        .arg(&cfg)
        .env("NO_COLOR", "1")
        .env_remove("KVTIER_CLUSTER_TOKEN")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(t) = peer_token {
        cmd.env("KVTIER_CLUSTER_TOKEN", t);
    }
    let mut child = cmd.spawn().unwrap();
    match ready(&mut child) {
        Some(_) => Ok(child),
        None => {
            let _ = child.wait();
            Err(std::fs::read_to_string(&log).unwrap_or_default())
        }
    }
}

async fn client(n: &Node) -> Client {
    let mut cc = ClientConfig::new(format!("http://{}", n.grpc));
    cc.timeout = Duration::from_secs(10);
    cc.retries = 0;
    cc.token = Some(CLIENT.into());
    Client::connect(cc).await.expect("client connects")
}

/// A Write of `block` to `n` claiming to be a forwarded replace, with `token`.
async fn forged_replace(
    n: &Node,
    token: &str,
    key: Bytes,
    payload: Bytes,
) -> Result<(), tonic::Status> {
    let mut c = KvTierClient::connect(format!("http://{}", n.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::WriteRequest {
        namespace: NS.into(),
        blocks: vec![pb::Block {
            token_ids: Vec::new(),
            key,
            parent_key: Bytes::new(),
            token_count: 0,
            crc32c: crc32c::crc32c(&payload),
            payload,
            ttl_ms: 0,
        }],
    });
    req.metadata_mut()
        .insert("kvtier-forwarded", "replace".parse().unwrap());
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    c.write(req).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_use_the_cluster_token_and_clients_cannot_pose_as_peers() {
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[tokens]]\ntoken = \"{CLIENT}\"\nnamespaces = [\"acme/\"]\naccess = \"read-write\"\n\n\
             [[tokens]]\ntoken = \"{PEER}\"\nnamespaces = [\"\"]\naccess = \"read-write\"\n"
        ),
    )
    .unwrap();
    let ns = nodes(tmp.path(), 2);
    let members: Vec<String> = ns.iter().map(Node::name).collect();

    // Authentication on and no token to present to the other nodes: refused at start.
    let err = launch(&ns[0], &members, &tokens, None).expect_err("must not start");
    assert!(err.contains("KVTIER_CLUSTER_TOKEN"), "{err}");
    // A cluster token the other nodes would refuse (not in the tokens file,
    // or without read-write access to every namespace): refused at start too.
    for bad in ["not-a-token-of-the-file-0123456789", CLIENT] {
        let err = launch(&ns[0], &members, &tokens, Some(bad)).expect_err("must not start");
        assert!(
            err.contains("KVTIER_CLUSTER_TOKEN") && err.contains("namespaces = [\"\"]"),
            "{err}"
        );
    }

    let mut procs = Vec::new();
    for n in &ns {
        procs.push(launch(n, &members, &tokens, Some(PEER)).expect("node starts"));
    }
    let (c0, c1) = (client(&ns[0]).await, client(&ns[1]).await);
    let blocks = chain(1, 8);
    c0.write(NS, &blocks).await.unwrap();
    // Each node owns every block (R = 2 of 2): node 0 put them on node 1 with the peer token.
    let r = c1.read(NS, &keys(&blocks), 0).await.unwrap();
    assert_eq!(r.blocks.len(), 8);
    for (got, want) in r.blocks.iter().zip(&blocks) {
        assert_eq!(got.payload, want.payload);
    }

    // A client posing as a peer is served as the client it is: the write is
    // an ordinary immutable write, and a different payload is refused.
    let key = blocks[0].key.bytes();
    let other = Bytes::from(vec![7u8; 100]);
    let st = forged_replace(&ns[1], CLIENT, key.clone(), other.clone())
        .await
        .expect_err("a client cannot replace an immutable block");
    assert_eq!(st.code(), tonic::Code::FailedPrecondition, "{st:?}");
    let r = c1.read(NS, &keys(&blocks[..1]), 0).await.unwrap();
    assert_eq!(
        r.blocks[0].payload, blocks[0].payload,
        "the block is untouched"
    );
    // The same request with the peer token is a peer's (the gate is the token).
    forged_replace(&ns[1], PEER, key, other.clone())
        .await
        .unwrap();

    for mut p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// A kvtier.v1 server that is not a node: it answers Stats with a name and
/// keeps the `authorization` each Stats carried (what an attacker who got
/// an address behind the cluster's DNS name would see).
struct Listener {
    heard: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl KvTier for Listener {
    async fn lookup(
        &self,
        _: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    type ReadStream = tonic::codegen::BoxStream<pb::ReadResponse>;
    async fn read(
        &self,
        _: Request<pb::ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    async fn write(
        &self,
        _: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    async fn write_stream(
        &self,
        _: Request<tonic::Streaming<pb::WriteRequest>>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    async fn delete(
        &self,
        _: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    async fn lease(
        &self,
        _: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        Err(Status::unimplemented("not a node"))
    }
    async fn stats(
        &self,
        r: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let auth = r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.heard
            .lock()
            .unwrap()
            .push(auth.unwrap_or_default().to_string());
        Ok(Response::new(pb::StatsResponse {
            cluster_self: "grpc://attacker:1".into(),
            ..Default::default()
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_with_a_cluster_token_is_refused_unless_insecure_dns() {
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!("[[tokens]]\ntoken = \"{PEER}\"\nnamespaces = [\"\"]\naccess = \"read-write\"\n"),
    )
    .unwrap();
    // The attacker listens on the port `localhost` (the cluster's DNS name
    // here) is asked on.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let fake = Listener {
        heard: heard.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(KvTierServer::new(fake))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    let ns = nodes(tmp.path(), 1);
    let dns = |insecure: bool| {
        ns[0].config(None, &[]).replace(
            "nodes = []",
            &format!(
                "dns = \"localhost:{port}\"\ndns_interval = \"100ms\"\ninsecure_dns = {insecure}"
            ),
        )
    };
    let err = match launch_with(&ns[0], &dns(false), &tokens, Some(PEER)) {
        Ok(mut p) => {
            let _ = p.kill();
            let _ = p.wait();
            panic!("a node with cluster.dns and a cluster token started without insecure_dns");
        }
        Err(e) => e,
    };
    assert!(
        err.contains("plaintext") && err.contains("cluster.insecure_dns = true"),
        "{err}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        heard.lock().unwrap().is_empty(),
        "the token left a node that refused to start"
    );

    // Said explicitly, the node starts, and every address behind the name
    // hears the token: what the flag accepts.
    let mut p = launch_with(&ns[0], &dns(true), &tokens, Some(PEER)).expect("starts");
    let t = std::time::Instant::now();
    while heard.lock().unwrap().is_empty() && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = p.kill();
    let _ = p.wait();
    assert_eq!(
        heard.lock().unwrap().first().map(String::as_str),
        Some(format!("Bearer {PEER}").as_str())
    );
}
