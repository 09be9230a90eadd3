//! Helpers the data-plane tests share (`wire_*.rs`): a block to write, and a
//! raw connection that sends frames and reads replies on one socket.
use bytes::Bytes;
use kvtier_client::WriteBlock;
use kvtier_core::Key;
use kvtier_proto::wire::{HEADER_LEN, Header, Kind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A block of `payload` under `key`, without a parent.
pub fn blk(key: &[u8], payload: Bytes) -> WriteBlock {
    WriteBlock {
        token_ids: Vec::new(),
        key: Key::new(Bytes::copy_from_slice(key)).unwrap(),
        parent: None,
        token_count: 0,
        payload,
        ttl_ms: 0,
    }
}

/// A raw connection that sends frames and reads replies on the same socket.
pub struct Raw(tokio::net::TcpStream);

impl Raw {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        Raw(tokio::net::TcpStream::connect(addr).await.unwrap())
    }

    pub async fn send(&mut self, kind: Kind, id: u64, meta: &[u8], data: &[u8]) -> (Header, Bytes) {
        self.exchange(&super::frame(kind, id, meta, data)).await
    }

    /// Writes `bytes`, reads one reply frame; returns its header and metadata.
    pub async fn exchange(&mut self, bytes: &[u8]) -> (Header, Bytes) {
        self.0.write_all(bytes).await.unwrap();
        let mut raw = [0u8; HEADER_LEN];
        self.0.read_exact(&mut raw).await.unwrap();
        let h = Header::decode(&raw).unwrap();
        let mut m = vec![0u8; h.meta_len as usize];
        self.0.read_exact(&mut m).await.unwrap();
        let mut d = vec![0u8; h.data_len as usize];
        self.0.read_exact(&mut d).await.unwrap();
        (h, Bytes::from(m))
    }
}
