//! A write says which of its blocks an admission policy kept in memory only
//! (`WriteResponse.deferred`, docs/cache-choice.md) over gRPC and the data
//! plane alike, and `/metrics` counts them per tier.
mod common;

use common::limits::block;
use kvtier_client::{Client, ClientConfig};
use kvtier_server::Server;

const BLOCK: usize = 4 << 20;

async fn client(s: &Server, data_plane: bool) -> Client {
    let mut cc = ClientConfig::new(common::raw_endpoint(s));
    cc.data_plane = data_plane;
    Client::connect(cc).await.expect("client connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_report_the_blocks_kept_in_memory_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::test_config();
    cfg.disk.dir = dir.path().display().to_string();
    cfg.disk.admission = "reuse".into();
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(256);
    let s = Server::start(cfg).await.unwrap();
    for (data_plane, ns) in [(true, "dp"), (false, "grpc")] {
        let c = client(&s, data_plane).await;
        let blocks: Vec<_> = (0..3).map(|i| block(&format!("b{i}"), BLOCK)).collect();
        let w = c.write(ns, &blocks).await.expect("stored");
        assert_eq!(
            (w.stored, w.deferred),
            (3, 3),
            "{ns}: first writes are deferred"
        );
        // Used again: a re-write of one is admitted, and written through
        // (stored: new on disk).
        let w = c.write(ns, &blocks[..1]).await.expect("stored");
        assert_eq!(
            (w.stored + w.existing, w.deferred),
            (1, 0),
            "{ns}: a second use is admitted"
        );
    }
    let m = common::metrics(&s).await;
    let value = |series: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {m}"))
    };
    assert_eq!(
        value("kvtier_tier_admission_blocks_total{tier=\"disk\",outcome=\"deferred\"}"),
        6.0
    );
    assert_eq!(
        value("kvtier_tier_admission_blocks_total{tier=\"disk\",outcome=\"admitted\"}"),
        2.0
    );
    assert_eq!(
        value("kvtier_tier_written_bytes_total{tier=\"disk\"}"),
        2.0 * BLOCK as f64
    );
    assert_eq!(
        value("kvtier_tier_admission_policy{tier=\"disk\",policy=\"reuse\"}"),
        1.0
    );
}

#[tokio::test]
async fn an_unknown_admission_policy_fails_the_config_naming_the_choices() {
    let mut cfg = common::test_config();
    cfg.disk.admission = "lfu".into();
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("disk.admission"), "{e}");
    let mut cfg = common::test_config();
    cfg.object_store.admission = "sometimes".into();
    let e = format!("{:#}", cfg.validate().unwrap_err());
    assert!(e.contains("all, reuse or tinylfu"), "{e}");
}
