//! The Rust client in a dozen lines: store the KV blocks of a 256-token
//! prompt, look the prompt up (pinning the hit), read the blocks back.
//!
//! ```sh
//! kvtier serve &                                   # loopback defaults
//! cargo run -q -p kvtier-client --example quickstart
//! ```
//! The server address comes from `KVTIER_SERVER` (default `http://127.0.0.1:50051`).
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("KVTIER_SERVER").unwrap_or("http://127.0.0.1:50051".into());
    let client = Client::connect(ClientConfig::new(server)).await?;
    let tokens: Vec<u32> = (0..256).collect(); // two 128-token blocks
    let kv: Vec<Bytes> = vec![Bytes::from(vec![1u8; 4096]), Bytes::from(vec![2u8; 4096])];
    client.write_tokens("quickstart", &tokens, &kv).await?; // one payload per full block
    let hit = client
        .lookup_tokens("quickstart", &tokens, Some(5_000))
        .await?; // pin 5 s
    let read = client
        .read("quickstart", &hit.keys[..hit.found], hit.lease_id)
        .await?;
    println!(
        "{} of {} blocks cached; read back {} bytes",
        hit.found,
        hit.keys.len(),
        read.blocks.iter().map(|b| b.payload.len()).sum::<usize>()
    );
    Ok(())
}
