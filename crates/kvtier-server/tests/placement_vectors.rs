//! Node names against the golden vectors of `tests/vectors/placement.json`:
//! the server's `cluster::node_name` (what it hashes for placement) and the
//! Rust client's (what `ClusterClient` hashes) give every listed name and
//! refuse every listed bad one, as the Python SDK's `kvtier.keys.node_name`
//! does (python/tests/test_placement.py). Scores and rankings are checked in
//! crates/kvtier-core/tests/placement_vectors.rs.
use serde_json::Value;

fn vectors() -> Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/vectors/placement.json"
    );
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    serde_json::from_str(&text).expect("placement.json parses")
}

#[test]
fn server_and_client_name_nodes_as_the_vectors_say() {
    let v = vectors();
    let cases = v["node_names"].as_array().expect("node_names");
    assert!(!cases.is_empty());
    for c in cases {
        let addr = c["addr"].as_str().unwrap();
        let want = c["name"].as_str().unwrap();
        assert_eq!(
            kvtier_server::cluster::node_name(addr).unwrap(),
            want,
            "server: {addr}"
        );
        assert_eq!(
            kvtier_client::cluster::node_name(addr).unwrap(),
            want,
            "client: {addr}"
        );
    }
    let bad = v["bad_node_names"].as_array().expect("bad_node_names");
    assert!(!bad.is_empty());
    for b in bad {
        let b = b.as_str().unwrap();
        assert!(
            kvtier_server::cluster::node_name(b).is_err(),
            "server accepts {b:?}"
        );
        assert!(
            kvtier_client::cluster::node_name(b).is_err(),
            "client accepts {b:?}"
        );
    }
}
