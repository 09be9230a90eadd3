//! The noisy-neighbour attack on a real server (docs/security.md, "Capacity
//! shares"): tenant A caches a 16-block prefix of 4 MiB blocks in a 128 MiB
//! memory tier, tenant B (its own token, its own namespaces) writes four
//! times the tier, and A's prefix must still be found whole and read back.
//! With `tenants.fair_shares = false` the same flood evicts A's prefix, which
//! is what shows the test can fail.
mod common;

use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::{ByteSize, HashFn, Key};
use kvtier_server::Server;
use kvtier_server::config::ShareEntry;

const A: &str = "token-for-tenant-a-0001";
const B: &str = "token-for-tenant-b-0002";
const TOKENS: &str = r#"
[[tokens]]
token = "token-for-tenant-a-0001"
namespaces = ["a/"]
access = "read-write"

[[tokens]]
token = "token-for-tenant-b-0002"
namespaces = ["b/"]
access = "read-write"
"#;

const MIB: usize = 1 << 20;
const BLOCK: usize = 4 * MIB;

async fn server(fair: bool) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, TOKENS).unwrap();
    let mut cfg = common::test_config();
    cfg.auth.tokens_file = path.to_string_lossy().into();
    cfg.engine.memory_capacity = ByteSize::mib(128);
    cfg.tenants.fair_shares = fair;
    cfg.tenants.shares = vec![ShareEntry {
        name: "tenant-a".into(),
        prefix: "a/".into(),
        weight: 1,
    }];
    (Server::start(cfg).await.expect("starts"), dir)
}

async fn client(s: &Server, token: &str) -> Client {
    let mut c = ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    c.connections = 1;
    c.token = Some(token.to_string());
    Client::connect(c).await.unwrap()
}

/// A chain of `n` 4 MiB blocks keyed by the real chained hash of `seed`'s tokens.
fn chain(n: usize, seed: u32) -> (Vec<Key>, Vec<WriteBlock>) {
    let tokens: Vec<u32> = (0..(256 * n) as u32).map(|t| t ^ (seed << 20)).collect();
    let keys = HashFn::Xxh3_64V1.chain(&tokens, 256).unwrap();
    let payload = Bytes::from(vec![seed as u8; BLOCK]);
    let wb = keys
        .iter()
        .enumerate()
        .map(|(i, k)| WriteBlock {
            token_ids: Vec::new(),
            key: k.clone(),
            parent: (i > 0).then(|| keys[i - 1].clone()),
            token_count: 256,
            payload: payload.clone(),
            ttl_ms: 0,
        })
        .collect();
    (keys, wb)
}

/// A's prefix hits found after B's flood, and the server's metrics text.
async fn attack(fair: bool) -> (usize, String) {
    let (s, _dir) = server(fair).await;
    let (a, b) = (client(&s, A).await, client(&s, B).await);
    let (keys, prefix) = chain(16, 1);
    for part in prefix.chunks(4) {
        assert_eq!(a.write("a/llama", part).await.unwrap().stored, 4);
    }
    assert_eq!(a.lookup("a/llama", &keys, None).await.unwrap().found, 16);
    // B: 4 × 128 MiB, as 4-block chains spread over namespaces of its own.
    for i in 0..32u32 {
        let (_, wb) = chain(4, 100 + i);
        b.write(&format!("b/{}", i % 8), &wb).await.unwrap();
    }
    let found = a.lookup("a/llama", &keys, None).await.unwrap().found;
    if found == 16 {
        let got = a.read("a/llama", &keys, 0).await.unwrap().blocks;
        assert_eq!(got.len(), 16);
        assert!(
            got.iter()
                .all(|b| b.payload.len() == BLOCK && b.payload[0] == 1)
        );
    }
    (found, common::metrics(&s).await)
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_cannot_evict_another_tenants_prefix() {
    let (found, m) = attack(true).await;
    assert_eq!(
        found, 16,
        "tenant A's prefix lost blocks to tenant B's writes"
    );
    let a_bytes = metric(
        &m,
        r#"kvtier_share_resident_bytes{tier="memory",share="tenant-a"}"#,
    );
    assert!(a_bytes >= (16 * BLOCK) as f64, "{a_bytes}");
    // B paid for its writes with its own blocks.
    let own = metric(
        &m,
        r#"kvtier_share_evictions_total{tier="memory",share="other",by="own"}"#,
    );
    assert!(own >= 64.0, "{own}");
    let a_lost = metric(
        &m,
        r#"kvtier_share_evictions_total{tier="memory",share="tenant-a",by="other"}"#,
    );
    assert_eq!(a_lost, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_shares_the_same_flood_evicts_the_prefix() {
    let (found, _) = attack(false).await;
    assert_eq!(
        found, 0,
        "one tier-wide LRU: B's writes take all of A's prefix"
    );
}
