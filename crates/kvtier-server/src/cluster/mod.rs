//! Cluster mode (`docs/cluster.md`): the `[cluster]` settings, who the
//! members are (a static list, or every address a DNS name resolves to,
//! re-resolved periodically), and the gRPC link through which the engine
//! reaches the other nodes ([`peers::GrpcPeers`]).
//!
//! A request one node forwards to another carries the metadata entry
//! [`FORWARDED`]; the receiving node serves it from its engine's local twin
//! (memory and disk only), so requests never travel further than one hop.
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub mod peers;

pub use peers::{ClusterMetrics, GrpcPeers};

/// gRPC metadata marking a request forwarded by another node: `1`, or
/// `replace` for a key/value put that replaces an older value.
pub const FORWARDED: &str = "kvtier-forwarded";

/// `[cluster]`: off unless `nodes` or `dns` is set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// Every node, `grpc://host:port` (this one included).
    pub nodes: Vec<String>,
    /// This node, as the others name it (`grpc://host:port`).
    #[serde(rename = "self")]
    pub self_: String,
    /// Owners of each block in memory/disk (the object store holds every block once).
    pub replicas: usize,
    /// `name:port`: every address the name resolves to is a node (a
    /// Kubernetes headless Service); instead of `nodes`.
    pub dns: String,
    /// How often `dns` is resolved again.
    #[serde(with = "humantime_serde")]
    pub dns_interval: Duration,
    /// Accept sending `KVTIER_CLUSTER_TOKEN` in plaintext to every address
    /// `dns` resolves to ([`check_dns_token`]).
    pub insecure_dns: bool,
    /// Longest wait for one call to another node (less when the request's
    /// own deadline is nearer).
    #[serde(with = "humantime_serde")]
    pub peer_timeout: Duration,
    /// A node whose call failed (refused, timed out) is skipped this long
    /// before it is tried again.
    #[serde(with = "humantime_serde")]
    pub down_for: Duration,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            self_: String::new(),
            replicas: 2,
            dns: String::new(),
            dns_interval: Duration::from_secs(5),
            insecure_dns: false,
            peer_timeout: Duration::from_secs(2),
            down_for: Duration::from_secs(3),
        }
    }
}

impl ClusterSection {
    /// True when this node is part of a cluster.
    pub fn enabled(&self) -> bool {
        !self.nodes.is_empty() || !self.dns.is_empty()
    }

    /// Refuses settings that cannot work, naming the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        anyhow::ensure!(
            self.nodes.is_empty() || self.dns.is_empty(),
            "cluster.nodes and cluster.dns are alternatives: set one"
        );
        anyhow::ensure!(
            !self.self_.is_empty(),
            "cluster.self (--cluster-self) must name this node as the others reach it, e.g. grpc://10.0.0.1:50051"
        );
        let me = node_name(&self.self_)?;
        let names = self
            .nodes
            .iter()
            .map(|n| node_name(n))
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(
            self.nodes.is_empty() || names.contains(&me),
            "cluster.self {} is not one of cluster.nodes ({})",
            self.self_,
            self.nodes.join(", ")
        );
        if !self.dns.is_empty() {
            dns_target(&self.dns)?;
        }
        anyhow::ensure!(self.replicas >= 1, "cluster.replicas must be at least 1");
        anyhow::ensure!(
            !self.peer_timeout.is_zero(),
            "cluster.peer_timeout must be > 0"
        );
        Ok(())
    }
}

/// A node's name in placement ([`kvtier_core::cluster::node_name`], shared
/// with the clients).
pub fn node_name(addr: &str) -> anyhow::Result<String> {
    Ok(kvtier_core::cluster::node_name(addr)?)
}

/// `(name, port)` of `cluster.dns`.
pub fn dns_target(s: &str) -> anyhow::Result<(String, u16)> {
    let (h, p) = s
        .rsplit_once(':')
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| anyhow::anyhow!("cluster.dns {s:?} is not name:port"))?;
    let port = p
        .parse::<u16>()
        .map_err(|_| anyhow::anyhow!("cluster.dns {s:?}: bad port {p:?}"))?;
    Ok((h.to_string(), port))
}

/// Refuses `cluster.dns` with a cluster token unless `cluster.insecure_dns`:
/// the node asks every address the name resolves to for its name, and calls
/// its members, with the token that may read and write every namespace, in
/// plaintext (peers have no TLS, docs/cluster.md). Whoever can add an
/// address behind the name (a DNS record, a pod matching a headless
/// Service's selector) or watch the network would receive it.
pub fn check_dns_token(cluster: &ClusterSection, token: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        cluster.dns.is_empty() || !token || cluster.insecure_dns,
        "cluster.dns with KVTIER_CLUSTER_TOKEN: this node would send the cluster token, which may \
         read and write every namespace, in plaintext to every address {:?} resolves to, so \
         whoever can add an address behind that name receives it. List the nodes in \
         cluster.nodes instead, or, if the name and the network are yours alone, set \
         cluster.insecure_dns = true (docs/cluster.md)",
        cluster.dns
    );
    Ok(())
}

/// `KVTIER_CLUSTER_TOKEN`, if set and not empty.
pub fn token() -> Option<String> {
    std::env::var("KVTIER_CLUSTER_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
}

/// The other nodes, when `cluster` is on, with messages of up to
/// `max_message` bytes (`server.max_message_size`). `KVTIER_CLUSTER_TOKEN`,
/// if set, is the bearer token this node presents to them (docs/cluster.md).
pub fn peers_for(
    cluster: &ClusterSection,
    max_message: u64,
) -> anyhow::Result<Option<std::sync::Arc<GrpcPeers>>> {
    if !cluster.enabled() {
        return Ok(None);
    }
    let max = max_message.min(usize::MAX as u64) as usize;
    Ok(Some(GrpcPeers::new(cluster, max, token())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_drop_the_scheme_and_need_a_port() {
        assert_eq!(
            node_name("grpc://10.0.0.1:50051").unwrap(),
            "10.0.0.1:50051"
        );
        assert_eq!(node_name("kvtier-0.svc:7").unwrap(), "kvtier-0.svc:7");
        assert_eq!(node_name("grpc://[::1]:5/").unwrap(), "[::1]:5");
        for bad in ["grpc://host", "host:0", ":50051", "grpc://h:x"] {
            assert!(node_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_that_cannot_work_are_refused_by_name() {
        let mut c = ClusterSection {
            nodes: vec!["grpc://a:1".into(), "grpc://b:1".into()],
            ..Default::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("cluster.self")
        );
        c.self_ = "grpc://c:1".into();
        assert!(c.validate().unwrap_err().to_string().contains("not one of"));
        c.self_ = "grpc://b:1".into();
        c.validate().unwrap();
        c.dns = "x:1".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("alternatives")
        );
        c.nodes.clear();
        c.validate().unwrap();
        c.dns = "x".into();
        assert!(c.validate().unwrap_err().to_string().contains("name:port"));
    }

    #[test]
    fn dns_with_a_cluster_token_needs_insecure_dns() {
        let mut c = ClusterSection {
            dns: "kvtier-headless:50051".into(),
            self_: "grpc://kvtier-0:50051".into(),
            ..Default::default()
        };
        let e = check_dns_token(&c, true).unwrap_err().to_string();
        assert!(
            e.contains("plaintext") && e.contains("cluster.insecure_dns = true"),
            "{e}"
        );
        check_dns_token(&c, false).unwrap();
        c.insecure_dns = true;
        check_dns_token(&c, true).unwrap();
        c.insecure_dns = false;
        c.dns.clear();
        c.nodes = vec!["grpc://kvtier-0:50051".into()];
        check_dns_token(&c, true).unwrap();
    }
}
