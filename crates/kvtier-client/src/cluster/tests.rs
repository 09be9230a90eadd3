//! Unit tests of the cluster client's pure parts: node names (against the
//! golden vectors the Python SDK and the server share), address lists,
//! picking a node, summing stats. Calls against real nodes are tested in
//! crates/kvtier/tests/cluster_client.rs.
use super::*;

fn vectors() -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/vectors/placement.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).expect("placement vectors")).unwrap()
}

#[test]
fn node_names_match_the_golden_vectors() {
    let v = vectors();
    let cases = v["node_names"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        let addr = c["addr"].as_str().unwrap();
        assert_eq!(
            node_name(addr).unwrap(),
            c["name"].as_str().unwrap(),
            "{addr}"
        );
    }
    for bad in v["bad_node_names"].as_array().unwrap() {
        let bad = bad.as_str().unwrap();
        assert!(node_name(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn an_address_list_splits_on_commas() {
    assert_eq!(
        split_nodes(" grpc://a:1, b:2,,\thttp://c:3 ,"),
        ["grpc://a:1", "b:2", "http://c:3"]
    );
    let c = ClusterConfig::new("grpc://a:1,grpc://b:2");
    assert_eq!(c.nodes, ["grpc://a:1", "grpc://b:2"]);
    assert_eq!(c.replicas, DEFAULT_REPLICAS);
    assert!(split_nodes("").is_empty());
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused() {
    let refused = |cfg: ClusterConfig| async move {
        match ClusterClient::connect(cfg).await {
            Err(ClientError::Invalid(m)) => m,
            Err(e) => panic!("not refused as invalid: {e}"),
            Ok(_) => panic!("accepted"),
        }
    };
    assert!(
        refused(ClusterConfig::new(""))
            .await
            .contains("at least one")
    );
    assert!(
        refused(ClusterConfig::new("grpc://a:1,a:1"))
            .await
            .contains("twice")
    );
    assert!(
        refused(ClusterConfig::new("grpc://a"))
            .await
            .contains("port")
    );
    let mut c = ClusterConfig::new("a:1");
    c.replicas = 0;
    assert!(refused(c).await.contains("replicas"));
}

#[tokio::test]
async fn no_node_answering_is_unavailable() {
    // Two ports nothing listens on (bound, then released).
    let ports: Vec<u16> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let mut c = ClusterConfig::new(&format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]));
    c.client.connect_timeout = Duration::from_secs(1);
    c.client.timeout = Duration::from_secs(2);
    let e = ClusterClient::connect(c)
        .await
        .expect_err("no node answers");
    assert!(unreachable(&e), "{e}");
}

#[test]
fn the_first_live_owner_is_picked_and_a_down_one_is_the_last_resort() {
    let ranked = [2, 0, 1];
    let none = [false; 3];
    assert_eq!(ClusterClient::pick(&ranked, &none, &none, &[]), Some(2));
    assert_eq!(
        ClusterClient::pick(&ranked, &[false, false, true], &none, &[]),
        Some(0)
    );
    assert_eq!(
        ClusterClient::pick(&ranked, &none, &[false, false, true], &[0]),
        Some(1)
    );
    // Every node down: the first one not failed, anyway.
    assert_eq!(
        ClusterClient::pick(&ranked, &[true; 3], &none, &[]),
        Some(2)
    );
    assert_eq!(
        ClusterClient::pick(&ranked, &[true; 3], &[false, false, true], &[]),
        Some(0)
    );
    assert_eq!(ClusterClient::pick(&ranked, &none, &[true; 3], &[]), None);
}

#[test]
fn stats_add_up_by_tier() {
    let node = |blocks: u64, version: &str| pb::StatsResponse {
        tiers: vec![
            pb::TierStats {
                tier: crate::Tier::Memory as i32,
                blocks,
                bytes: blocks * 10,
                hits: 1,
                ..Default::default()
            },
            pb::TierStats {
                tier: crate::Tier::Disk as i32,
                blocks: 2 * blocks,
                ..Default::default()
            },
        ],
        active_leases: 1,
        version: version.into(),
        data_listen: "127.0.0.1:1".into(),
        timing: Some(ServerTiming {
            service_us: 5,
            ..Default::default()
        }),
        ..Default::default()
    };
    let s = sum_stats(vec![node(1, "0.1.0"), node(2, "0.1.0"), node(3, "0.2.0")]);
    let mem = s
        .tiers
        .iter()
        .find(|t| t.tier == crate::Tier::Memory as i32)
        .unwrap();
    assert_eq!((mem.blocks, mem.bytes, mem.hits), (6, 60, 3));
    let disk = s
        .tiers
        .iter()
        .find(|t| t.tier == crate::Tier::Disk as i32)
        .unwrap();
    assert_eq!(disk.blocks, 12);
    assert_eq!(s.active_leases, 3);
    assert_eq!(s.version, "0.1.0,0.2.0");
    assert_eq!(s.data_listen, "");
    assert_eq!(s.timing.unwrap().service_us, 15);
}

/// A shed request (UNAVAILABLE with a retry hint) is an answer from a node
/// that is up but busy: not failed over, the node not marked down. An
/// UNAVAILABLE without a hint (a node not answering) still is.
#[test]
fn a_node_that_shed_a_request_is_not_unreachable() {
    let mut shed = tonic::Status::unavailable("server overloaded");
    shed.metadata_mut()
        .insert("grpc-retry-pushback-ms", "200".parse().unwrap());
    assert!(!unreachable(&ClientError::Status(shed)));
    assert!(unreachable(&ClientError::Status(
        tonic::Status::unavailable("connection refused")
    )));
    assert!(unreachable(&ClientError::Unreachable {
        addr: "10.0.0.1:50052".into(),
        reason: "connection reset".into(),
    }));
}
