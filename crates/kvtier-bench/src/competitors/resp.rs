//! A minimal RESP2 client for the Redis competitor: one TCP connection, one request
//! at a time, `TCP_NODELAY`.
//!
//! Why hand-written: with the `redis` crate (multiplexed connection) the competitor
//! reached ~730 GET/s of 1.2 MB at c=8 where `redis-benchmark` reaches ~3,000/s
//! on the same machine (`notes/006-data-plane.md` measures both in one run:
//! `--competitor-client redis-rs`). This client does what `redis-benchmark` does: a
//! command goes out with one vectored write (header + payload, no user-space
//! concatenation of the payload) and a bulk reply is read with `read_exact`
//! into a buffer reused by the connection (no allocation or zeroing per reply).

use std::io::{Error, ErrorKind};

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Arguments at least this long go out as their own vectored-write part.
const INLINE_MAX: usize = 4096;

/// A reply, bulk data left in [`Resp::value`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n` (the bytes are in [`Resp::value`]); `None` for `$-1`.
    Bulk(Option<usize>),
    /// `*n`: the elements are read and discarded.
    Array(i64),
}

/// One RESP2 connection.
pub struct Resp {
    sock: TcpStream,
    rbuf: BytesMut,
    value: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidData, msg.into())
}

impl Resp {
    /// Connects to `host:port` (a `redis://host:port[/db]` URL is accepted too).
    pub async fn connect(url: &str) -> std::io::Result<Self> {
        let addr = url.trim_start_matches("redis://");
        let addr = addr.split('/').next().unwrap_or(addr);
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        Ok(Resp {
            sock,
            rbuf: BytesMut::with_capacity(64 << 10),
            value: Vec::new(),
        })
    }

    /// The bytes of the last bulk reply.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Sends one command and reads its reply.
    pub async fn cmd(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.send(args).await?;
        self.reply().await
    }

    async fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        // Small parts are formatted into owned buffers; long arguments are
        // referenced, so the payload is never copied in user space.
        let mut owned: Vec<Vec<u8>> = vec![format!("*{}\r\n", args.len()).into_bytes()];
        let mut order: Vec<(bool, usize)> = Vec::with_capacity(args.len() * 2 + 1);
        order.push((true, 0));
        for (i, a) in args.iter().enumerate() {
            let cur = owned.last_mut().expect("one buffer");
            cur.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            if a.len() < INLINE_MAX {
                cur.extend_from_slice(a);
                cur.extend_from_slice(b"\r\n");
            } else {
                order.push((false, i));
                owned.push(b"\r\n".to_vec());
                order.push((true, owned.len() - 1));
            }
        }
        let parts: Vec<&[u8]> = order
            .iter()
            .map(|&(own, i)| if own { &owned[i][..] } else { args[i] })
            .collect();
        kvtier_proto::wire::write_all_vectored(&mut self.sock, &parts).await
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(64 << 10);
        }
        if self.sock.read_buf(&mut self.rbuf).await? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    async fn line(&mut self) -> std::io::Result<BytesMut> {
        loop {
            if let Some(p) = self.rbuf.windows(2).position(|w| w == b"\r\n") {
                let mut l = self.rbuf.split_to(p + 2);
                l.truncate(p);
                return Ok(l);
            }
            self.fill().await?;
        }
    }

    fn int(l: &[u8]) -> std::io::Result<i64> {
        std::str::from_utf8(l)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(format!("bad integer {:?}", String::from_utf8_lossy(l))))
    }

    /// Reads one reply.
    pub async fn reply(&mut self) -> std::io::Result<Reply> {
        let l = self.line().await?;
        let (&t, rest) = l.split_first().ok_or_else(|| bad("empty reply line"))?;
        Ok(match t {
            b'+' => Reply::Simple(String::from_utf8_lossy(rest).into_owned()),
            b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
            b':' => Reply::Int(Self::int(rest)?),
            b'$' => {
                let n = Self::int(rest)?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let n = n as usize;
                // Keep the buffer's length so reuse needs no zeroing.
                if self.value.len() != n {
                    self.value.resize(n, 0);
                }
                let have = self.rbuf.len().min(n);
                self.value[..have].copy_from_slice(&self.rbuf[..have]);
                self.rbuf.advance(have);
                self.sock.read_exact(&mut self.value[have..]).await?;
                while self.rbuf.len() < 2 {
                    self.fill().await?;
                }
                if &self.rbuf[..2] != b"\r\n" {
                    return Err(bad("bulk reply not terminated by CRLF"));
                }
                self.rbuf.advance(2);
                Reply::Bulk(Some(n))
            }
            b'*' => {
                let n = Self::int(rest)?;
                for _ in 0..n.max(0) {
                    Box::pin(self.reply()).await?;
                }
                Reply::Array(n)
            }
            _ => return Err(bad(format!("unknown reply type {:?}", t as char))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A fake server answering canned bytes, in small pieces, to what it reads.
    #[tokio::test]
    async fn parses_replies_split_across_reads() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut canned =
            b"+OK\r\n:5\r\n$-1\r\n-ERR no\r\n*2\r\n$1\r\na\r\n:1\r\n$100000\r\n".to_vec();
        canned.extend_from_slice(&big);
        canned.extend_from_slice(b"\r\n");
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = vec![0u8; 64];
            let n = s.read(&mut req).await.unwrap();
            for c in canned.chunks(777) {
                s.write_all(c).await.unwrap();
                s.flush().await.unwrap();
            }
            req.truncate(n);
            req
        });
        let mut c = Resp::connect(&format!("redis://{addr}")).await.unwrap();
        assert_eq!(c.cmd(&[b"PING"]).await.unwrap(), Reply::Simple("OK".into()));
        assert_eq!(c.reply().await.unwrap(), Reply::Int(5));
        assert_eq!(c.reply().await.unwrap(), Reply::Bulk(None));
        assert_eq!(c.reply().await.unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(c.reply().await.unwrap(), Reply::Array(2));
        assert_eq!(c.reply().await.unwrap(), Reply::Bulk(Some(100_000)));
        assert_eq!(c.value(), &big[..]);
        assert_eq!(server.await.unwrap(), b"*1\r\n$4\r\nPING\r\n");
    }
}
