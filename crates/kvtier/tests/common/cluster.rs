//! Cluster nodes for the binary's integration tests: `kvtier serve`
//! processes on loopback, configured as one cluster (R = 2), sharing an
//! object store (an Azurite container the test starts) or none; and the
//! chains of blocks the cluster tests write.
use super::{BIN, ready, scrape};
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, Tier, WriteBlock};
use kvtier_core::Key;
use kvtier_object::testing::Emulator;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Payload bytes of a block of [`chain`].
pub const SIZE: usize = 16 << 10;

/// Free loopback ports, outside the ephemeral range (see there).
pub use kvtier_object::testing::free_ports;

/// One node: its addresses (gRPC, data plane, HTTP), its directory (config,
/// disk, log) and its process while it runs.
pub struct Node {
    pub grpc: String,
    pub data: String,
    pub http: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
}

impl Node {
    /// The node's name in placement (`host:port`).
    pub fn name(&self) -> String {
        self.grpc.clone()
    }

    /// The node's config: cluster `nodes` (names), R = 2, a 64 MiB memory
    /// tier, a disk, and `em`'s container as the object store (write-through)
    /// when given.
    pub fn config(&self, em: Option<&Emulator>, nodes: &[String]) -> String {
        let list: Vec<String> = nodes.iter().map(|n| format!("\"grpc://{n}\"")).collect();
        let store = match em {
            Some(em) => {
                let opts: Vec<String> = em
                    .options()
                    .into_iter()
                    .map(|(k, v)| format!("{k} = \"{v}\""))
                    .collect();
                format!(
                    r#"
[object_store]
url = "{url}"
write_policy = "write-through"
timeout = "5s"
request_timeout = "3s"
connect_timeout = "500ms"
max_retries = 2
negative_cache_ttl = "0s"

[object_store.options]
{opts}
"#,
                    url = em.url("kvtier", "cluster"),
                    opts = opts.join("\n"),
                )
            }
            None => String::new(),
        };
        format!(
            r#"
[server]
listen = ["{grpc}"]
http_listen = "{http}"
data_listen = "{data}"

[engine]
memory_capacity = "64MiB"

[disk]
dir = "{dir}"
capacity = "256MiB"
{store}
[cluster]
nodes = [{list}]
self = "grpc://{grpc}"
replicas = 2
peer_timeout = "1s"
down_for = "2s"
"#,
            grpc = self.grpc,
            http = self.http,
            data = self.data,
            dir = self.dir.join("disk").display(),
            list = list.join(", "),
        )
    }

    /// Starts the node as a member of `nodes`, `em`'s container its object store.
    pub fn start(&mut self, em: &Emulator, nodes: &[String]) {
        self.launch(Some(em), nodes);
    }

    /// Starts the node as a member of `nodes`, with no object store.
    pub fn start_without_store(&mut self, nodes: &[String]) {
        self.launch(None, nodes);
    }

    fn launch(&mut self, em: Option<&Emulator>, nodes: &[String]) {
        let cfg = self.dir.join("kvtier.toml");
        std::fs::write(&cfg, self.config(em, nodes)).unwrap();
        let log = std::fs::File::create(self.dir.join("log")).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--ready-json", "--config"])
            .arg(&cfg)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        assert!(
            ready(&mut child).is_some(),
            "node {} did not start: {}",
            self.grpc,
            std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
        );
        self.child = Some(child);
    }

    /// SIGKILL, and wait for the process to go.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// A single-address client of this node (10 s deadline, no retries).
    pub async fn client(&self) -> Client {
        let mut cc = ClientConfig::new(format!("http://{}", self.grpc));
        cc.timeout = Duration::from_secs(10);
        cc.retries = 0;
        Client::connect(cc).await.expect("client connects")
    }

    /// Calls this node forwarded to other nodes so far (`op`: `lookup`,
    /// `get`, `put`, `delete`), from its `/metrics`.
    pub fn forwarded(&self, op: &str) -> u64 {
        scrape(
            &self.http,
            "kvtier_cluster_forwarded_requests_total{",
            &[&format!("op=\"{op}\"")],
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `n` nodes (not started) on free loopback ports, each with a directory under `tmp`.
pub fn nodes(tmp: &Path, n: usize) -> Vec<Node> {
    let ports = free_ports(3 * n);
    (0..n)
        .map(|i| {
            let dir = tmp.join(format!("node{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            Node {
                grpc: format!("127.0.0.1:{}", ports[3 * i]),
                data: format!("127.0.0.1:{}", ports[3 * i + 1]),
                http: format!("127.0.0.1:{}", ports[3 * i + 2]),
                dir,
                child: None,
            }
        })
        .collect()
}

/// Chain `c` of `n` blocks of [`SIZE`] bytes (keys and payloads derived from `c`).
pub fn chain(c: u32, n: usize) -> Vec<WriteBlock> {
    let mut out: Vec<WriteBlock> = Vec::new();
    for i in 0..n {
        let mut k = c.to_be_bytes().to_vec();
        k.extend((i as u32).to_be_bytes());
        let payload: Vec<u8> = (0..SIZE)
            .map(|j| {
                (j as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(c * 31 + i as u32) as u8
            })
            .collect();
        out.push(WriteBlock {
            token_ids: Vec::new(),
            key: Key::new(Bytes::from(k)).unwrap(),
            parent: out.last().map(|p| p.key.clone()),
            token_count: 128,
            payload: Bytes::from(payload),
            ttl_ms: 0,
        });
    }
    out
}

/// The keys of a chain.
pub fn keys(c: &[WriteBlock]) -> Vec<Key> {
    c.iter().map(|b| b.key.clone()).collect()
}

/// Blocks a node holds in `tier`.
pub async fn held_in(c: &Client, tier: Tier) -> u64 {
    let s = c.stats().await.unwrap();
    s.tiers
        .iter()
        .find(|t| t.tier == tier as i32)
        .map_or(0, |t| t.blocks)
}

/// Blocks a node holds on disk (every write is written through).
pub async fn held(c: &Client) -> u64 {
    held_in(c, Tier::Disk).await
}
