//! Shared helpers: start an in-process server on ephemeral loopback ports;
//! the limits tests' in [`limits`], the data-plane tests' in [`wire`].
#![allow(dead_code)]
pub mod limits;
pub mod wire;

use kvtier_client::{Client, ClientConfig};
use kvtier_server::Server;
use kvtier_server::config::Config;

pub fn test_config() -> Config {
    let mut cfg = Config::default();
    cfg.server.listen = vec!["127.0.0.1:0".into()];
    cfg.server.http_listen = "127.0.0.1:0".into();
    cfg
}

pub async fn start(cfg: Config) -> (Server, Client) {
    let server = Server::start(cfg).await.expect("server starts");
    let client = client_for(&server).await;
    (server, client)
}

pub async fn client_for(server: &Server) -> Client {
    let mut cc = ClientConfig::new(format!("http://{}", server.grpc_addrs[0]));
    cc.connections = 2;
    Client::connect(cc).await.expect("client connects")
}

/// One data-plane frame: header, metadata, data (docs/wire.md).
pub fn frame(kind: kvtier_proto::wire::Kind, id: u64, meta: &[u8], data: &[u8]) -> Vec<u8> {
    let mut f = kvtier_proto::wire::Header {
        kind,
        request_id: id,
        meta_len: meta.len() as u32,
        data_len: data.len() as u32,
    }
    .encode()
    .to_vec();
    f.extend_from_slice(meta);
    f.extend_from_slice(data);
    f
}

pub fn raw_endpoint(server: &Server) -> String {
    format!("http://{}", server.grpc_addrs[0])
}

/// The server's `/metrics` text (its HTTP listener must be on).
pub async fn metrics(server: &Server) -> String {
    let addr = server.http_addr.expect("HTTP listener on");
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The server's `kvtier_shed_total` (requests refused for overload).
pub async fn shed_total(server: &Server) -> f64 {
    let m = metrics(server).await;
    m.lines()
        .find_map(|l| l.strip_prefix("kvtier_shed_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no kvtier_shed_total in {m}"))
}

/// Two tenants' tokens (`a/` and `b/`, read-write), for tests that play one
/// against the other.
pub const TWO_TENANTS: &str = r#"
[[tokens]]
token = "token-for-tenant-a-0001"
namespaces = ["a/"]
access = "read-write"

[[tokens]]
token = "token-for-tenant-b-0002"
namespaces = ["b/"]
access = "read-write"
"#;
