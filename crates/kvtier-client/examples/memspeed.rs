//! How fast the Rust client core moves a prefix into and out of a buffer the
//! caller allocated: `n` blocks of `size` bytes written from one buffer and
//! read back into another, `repeat` times, over the data plane at `TARGET`
//! (`host:port`, or `unix:///path` for the same-host socket, docs/local.md).
//! Prints one JSON line per repeat: `{"op", "seconds", "bytes"}`. Given the
//! server's gRPC address too (`GRPC`), each repeat's blocks are deleted after
//! it, so the runs leave the server as they found it.
//! scripts/bench-memory-speed.py runs it beside the Python client and the floor.
//!
//! ```sh
//! cargo run --release -p kvtier-client --example memspeed -- unix:///tmp/k.sock 128 4194304 5
//! ```
use bytes::Bytes;
use kvtier_client::WriteBlock;
use kvtier_client::wire::{Target, WireClient};
use kvtier_core::Key;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(5..=6).contains(&args.len()) {
        eprintln!("usage: memspeed TARGET BLOCKS SIZE REPEAT [GRPC]");
        std::process::exit(2);
    }
    let cleanup = match args.get(5) {
        Some(g) => {
            let mut cc = kvtier_client::ClientConfig::new(g.clone());
            cc.data_plane = false;
            Some(
                kvtier_client::Client::connect(cc)
                    .await
                    .expect("gRPC connect"),
            )
        }
        None => None,
    };
    let target = match kvtier_client::transport::local_path(&args[1]) {
        Some(p) => Target::Unix(p.into()),
        None => Target::Tcp(args[1].parse().expect("TARGET: host:port or unix:///path")),
    };
    let (n, size, repeat): (usize, usize, usize) = (
        args[2].parse().expect("BLOCKS"),
        args[3].parse().expect("SIZE"),
        args[4].parse().expect("REPEAT"),
    );
    let w = WireClient::connect(target, 8, Duration::from_secs(60))
        .await
        .expect("connect");
    // The caller's buffers: one for the saved prefix, one to load into.
    let src: Vec<u8> = (0..n * size).map(|i| (i % 251) as u8).collect();
    let src = Bytes::from(src);
    // Touched, as a caller's buffer in use is: page faults are not the copy's.
    let mut dst = vec![1u8; n * size];
    let ns = format!("memspeed-{}", std::process::id());
    for r in 0..repeat {
        let keys: Vec<Key> = (0..n)
            .map(|i| Key::new(Bytes::from(format!("r{r}-b{i:06}").into_bytes())).unwrap())
            .collect();
        let blocks: Vec<WriteBlock> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| WriteBlock {
                token_ids: Vec::new(),
                key: k.clone(),
                parent: None,
                token_count: 128,
                payload: src.slice(i * size..(i + 1) * size),
                ttl_ms: 0,
            })
            .collect();
        let deadline = || Instant::now() + Duration::from_secs(120);
        let t = Instant::now();
        let wr = w.write_by(&ns, &blocks, deadline()).await.expect("write");
        let took = t.elapsed();
        assert_eq!(wr.stored as usize, n, "every block stored");
        println!(
            "{{\"op\": \"save\", \"seconds\": {}, \"bytes\": {}}}",
            took.as_secs_f64(),
            n * size
        );
        let mut dests: Vec<&mut [u8]> = dst.chunks_mut(size).collect();
        let t = Instant::now();
        let rd = w
            .read_into_by(&ns, &keys, 0, &mut dests, deadline())
            .await
            .expect("read");
        let took = t.elapsed();
        assert_eq!(rd.blocks.len(), n, "every block read");
        println!(
            "{{\"op\": \"load\", \"seconds\": {}, \"bytes\": {}}}",
            took.as_secs_f64(),
            n * size
        );
        assert!(dst == src[..], "the loaded bytes are the saved ones");
        if let Some(c) = &cleanup {
            c.delete(&ns, &keys).await.expect("delete");
        }
    }
}
