//! A multi-turn chat workload against the seed's kvstore API
//! (`kvstore.KVStoreService`), shaped like the seed's playground.
//!
//! ```text
//! cargo run --release -p kvtier --example conversation -- [ADDR] [CONVERSATIONS] [TURNS]
//! ```
//! With no address it starts an in-process server on loopback. Each turn adds a
//! user message and a reply (~300 tokens), looks the whole conversation up,
//! reads the cached blocks, "computes" the rest and writes back full 128-token
//! blocks of ~1.2 MB. Prints hits, misses and latencies per turn.
use bytes::Bytes;
use kvtier_client::ClientConfig;
use kvtier_client::conversation::Conversation;
use kvtier_client::kvstore::KvStoreClient;
use std::time::Duration;

const BLOCK_BYTES: usize = 1_200_000;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut _server = None;
    let addr = match args.first().filter(|a| !a.is_empty() && *a != "-") {
        Some(a) => a.clone(),
        None => {
            let mut cfg = kvtier_server::config::Config::default();
            cfg.server.listen = vec!["127.0.0.1:0".into()];
            cfg.server.http_listen = String::new();
            let s = kvtier_server::Server::start(cfg).await?;
            let a = format!("http://{}", s.grpc_addrs[0]);
            _server = Some(s);
            a
        }
    };
    let conversations: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let turns: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let client =
        KvStoreClient::connect(ClientConfig::new(addr.clone()), "playground", "kvcache").await?;
    println!("conversation workload against {addr}: {conversations} conversations x {turns} turns");
    println!(
        "{:>4} {:>4} {:>6} {:>4} {:>6} {:>10} {:>12} {:>13}",
        "conv", "turn", "blocks", "hit", "miss", "lookup ms", "read ms/blk", "write ms/blk"
    );
    let (mut hits, mut misses) = (0, 0);
    for c in 0..conversations {
        let mut conv = Conversation::new(128);
        // A shared system prompt (2 blocks) then per-conversation messages.
        let system: Vec<i64> = (0..256).collect();
        for turn in 0..turns {
            let mut new: Vec<i64> = if turn == 0 {
                system.clone()
            } else {
                Vec::new()
            };
            new.extend((0..300).map(|i| 1_000_000 * (c as i64 + 1) + 1_000 * turn as i64 + i));
            let t = conv
                .turn(&client, &new, |i, hash| {
                    Bytes::from(vec![(hash as u8) ^ (i as u8); BLOCK_BYTES])
                })
                .await?;
            hits += t.hits;
            misses += t.misses;
            let avg = |v: &[Duration]| {
                if v.is_empty() {
                    0.0
                } else {
                    v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64
                }
            };
            println!(
                "{c:>4} {turn:>4} {:>6} {:>4} {:>6} {:>10.2} {:>12.2} {:>13.2}",
                t.blocks,
                t.hits,
                t.misses,
                ms(t.lookup),
                avg(&t.reads),
                avg(&t.writes)
            );
        }
    }
    println!("total: {hits} blocks served from cache, {misses} computed and written back");
    Ok(())
}
