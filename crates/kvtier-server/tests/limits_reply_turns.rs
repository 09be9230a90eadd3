//! A load bigger than `server.reply_memory` is served in turn, not
//! refused (docs/security.md, "Threats and their guards"). Apart from
//! limits_pending_replies.rs, whose RSS measure this load would disturb.
mod common;

use common::limits::block;
use kvtier_server::Server;

/// A load bigger than the reply budget, striped by the client over four
/// connections, is served in turn: a Read with no room waits for it
/// (holding no block) instead of being refused, since the budget bounds
/// what is held at once, not what a load may add up to. Refused at once,
/// the later stripes failed the same way on every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_bigger_than_the_reply_budget_is_served_in_turn() {
    let mut cfg = common::test_config();
    cfg.server.reply_memory = kvtier_core::ByteSize::mib(32);
    cfg.engine.memory_capacity = kvtier_core::ByteSize::mib(512);
    cfg.engine.max_block_size = kvtier_core::ByteSize::mib(64);
    let s = Server::start(cfg).await.unwrap();
    let mut cc = kvtier_client::ClientConfig::new(format!("http://{}", s.grpc_addrs[0]));
    cc.connections = 4;
    let c = kvtier_client::Client::connect(cc).await.unwrap();
    let names: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    let blocks: Vec<_> = names.iter().map(|k| block(k, 16 << 20)).collect();
    for part in blocks.chunks(4) {
        c.write("load", part).await.expect("blocks stored");
    }
    let keys: Vec<_> = blocks.iter().map(|b| b.key.clone()).collect();
    drop(blocks);
    for round in 0..3 {
        let got = c
            .read("load", &keys, 0)
            .await
            .expect("the whole load is served");
        assert_eq!(got.blocks.len(), 16, "round {round}: {}", got.reason);
        assert!(
            got.blocks.iter().all(|b| b.payload.len() == 16 << 20),
            "round {round}"
        );
    }
}
