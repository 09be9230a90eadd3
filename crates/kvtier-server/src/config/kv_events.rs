//! `[events]`: KV events for cache-aware routers (docs/events.md), off
//! unless `endpoint` is set.
//!
//! The events carry each block's token ids, which are the prompt's text in
//! another form, and no authentication exists on a ZMQ socket that the
//! routers speak. So the endpoint is operator-only: it binds loopback or an
//! `ipc://` path unless `insecure_remote` says the network is the
//! operator's own (docs/security.md, "KV events").
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[events]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EventsSection {
    /// ZMQ PUB endpoint bound for subscribers, `tcp://HOST:PORT` or
    /// `ipc://PATH`; "" = no events (`--kv-events`).
    pub endpoint: String,
    /// ZMQ ROUTER endpoint answering replay requests as vLLM's
    /// `ZmqEventPublisher` does; "" = none (`--kv-events-replay`).
    pub replay_endpoint: String,
    /// This node's name in topics (`kv@NODE@NAMESPACE`) and in `ownership`;
    /// "" = the cluster name (`--cluster-self`), else the first gRPC listener.
    pub node: String,
    /// Publish only these namespaces (exact, or a prefix ending in `/` or
    /// `:`); empty = every namespace.
    pub namespaces: Vec<String>,
    /// The model name a router knows a namespace by, the "model" of its
    /// topic (`kv@NODE@MODEL`): a namespace, or a prefix ending in `/` or
    /// `:` (the longest wins) → the model name. Unlisted: the namespace.
    /// llm-d seeds its keys with the topic's model, so kvtier's blocks match
    /// the engines' only under the engines' model name.
    pub models: std::collections::BTreeMap<String, String>,
    /// Allow a non-loopback endpoint: anyone who can connect reads every
    /// published namespace's token ids.
    pub insecure_remote: bool,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// Residency changes queued for the publisher; past it they are dropped
    /// and counted (`kvtier_events_dropped_total`).
    pub queue: usize,
    /// How long changes gather into one batch per namespace.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for EventsSection {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            replay_endpoint: String::new(),
            node: String::new(),
            namespaces: Vec::new(),
            models: Default::default(),
            insecure_remote: false,
            buffer_steps: 10_000,
            queue: 1 << 20,
            interval: Duration::from_millis(10),
        }
    }
}

impl EventsSection {
    /// True when events are published.
    pub fn enabled(&self) -> bool {
        !self.endpoint.is_empty()
    }

    /// Refuses what would publish where the operator did not mean to.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !self.enabled() {
            anyhow::ensure!(
                self.replay_endpoint.is_empty(),
                "events.replay_endpoint needs events.endpoint"
            );
            return Ok(());
        }
        for (name, e) in [
            ("events.endpoint", &self.endpoint),
            ("events.replay_endpoint", &self.replay_endpoint),
        ] {
            if e.is_empty() {
                continue;
            }
            check_endpoint(e, self.insecure_remote)
                .map_err(|m| anyhow::anyhow!("{name} {e:?}: {m}"))?;
        }
        anyhow::ensure!(
            self.buffer_steps > 0,
            "events.buffer_steps must be at least 1"
        );
        anyhow::ensure!(self.queue > 0, "events.queue must be at least 1");
        anyhow::ensure!(
            !self.node.contains('@'),
            "events.node {:?}: '@' separates a topic's parts (kv@NODE@NAMESPACE)",
            self.node
        );
        for (ns, model) in &self.models {
            anyhow::ensure!(
                !model.contains('@') && !model.is_empty(),
                "events.models {ns:?} = {model:?}: a model name must be non-empty and without '@' \
                 (it is the last part of kv@NODE@MODEL)"
            );
        }
        Ok(())
    }

    /// The "model" of `ns`'s topic: its [`EventsSection::models`] entry (exact,
    /// else the longest prefix), else the namespace itself.
    pub fn model_of<'a>(&'a self, ns: &'a str) -> &'a str {
        if let Some(m) = self.models.get(ns) {
            return m;
        }
        self.models
            .iter()
            .filter(|(p, _)| (p.ends_with('/') || p.ends_with(':')) && ns.starts_with(p.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map_or(ns, |(_, m)| m.as_str())
    }

    /// Whether events of `ns` are published.
    pub fn publishes(&self, ns: &str) -> bool {
        self.namespaces.is_empty()
            || self.namespaces.iter().any(|p| {
                p == ns || ((p.ends_with('/') || p.ends_with(':')) && ns.starts_with(p.as_str()))
            })
    }
}

/// `tcp://HOST:PORT` with a loopback host (any host with `insecure_remote`),
/// or `ipc://PATH`.
fn check_endpoint(e: &str, insecure_remote: bool) -> Result<(), String> {
    if let Some(path) = e.strip_prefix("ipc://") {
        return if path.is_empty() {
            Err("an ipc:// endpoint needs a path".into())
        } else {
            Ok(())
        };
    }
    let Some(hp) = e.strip_prefix("tcp://") else {
        return Err("must be tcp://HOST:PORT or ipc://PATH".into());
    };
    let (host, port) = hp
        .rsplit_once(':')
        .ok_or_else(|| "must be tcp://HOST:PORT".to_string())?;
    port.parse::<u16>()
        .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback && !insecure_remote {
        return Err(format!(
            "{host} is not loopback; events carry every published namespace's token ids to \
             whoever connects, without authentication: bind loopback (a router on the same \
             host, or a sidecar that forwards them), or set events.insecure_remote = true if \
             the network is yours alone (docs/security.md, \"KV events\")"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(endpoint: &str, insecure: bool) -> EventsSection {
        EventsSection {
            endpoint: endpoint.into(),
            insecure_remote: insecure,
            ..Default::default()
        }
    }

    #[test]
    fn a_non_loopback_endpoint_needs_insecure_remote() {
        let e = with("tcp://0.0.0.0:5557", false).validate().unwrap_err();
        assert!(e.to_string().contains("insecure_remote"), "{e}");
        with("tcp://0.0.0.0:5557", true).validate().unwrap();
        with("tcp://127.0.0.1:5557", false).validate().unwrap();
        with("tcp://[::1]:5557", false).validate().unwrap();
        with("ipc:///run/kvtier/events", false).validate().unwrap();
        assert!(with("udp://127.0.0.1:1", false).validate().is_err());
        assert!(with("tcp://127.0.0.1:x", false).validate().is_err());
    }

    #[test]
    fn a_namespace_is_published_under_its_model_name() {
        let s = EventsSection {
            models: [
                ("vllm/".to_string(), "generic".to_string()),
                (
                    "vllm/llama/".to_string(),
                    "meta-llama/Llama-3.1-8B".to_string(),
                ),
                ("solo".to_string(), "solo-model".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(s.model_of("vllm/llama/abc"), "meta-llama/Llama-3.1-8B");
        assert_eq!(s.model_of("vllm/other/abc"), "generic");
        assert_eq!(s.model_of("solo"), "solo-model");
        assert_eq!(s.model_of("acme/x"), "acme/x");
        let bad = EventsSection {
            endpoint: "tcp://127.0.0.1:1".into(),
            models: [("a".to_string(), "x@y".to_string())].into(),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn namespace_filter_matches_exact_names_and_prefixes() {
        let s = EventsSection {
            namespaces: vec!["acme/".into(), "solo".into()],
            ..Default::default()
        };
        assert!(s.publishes("acme/llama"));
        assert!(s.publishes("solo"));
        assert!(!s.publishes("solo2"));
        assert!(!s.publishes("other/x"));
        assert!(EventsSection::default().publishes("anything"));
    }
}
