//! A data-plane connection, plain TCP or TLS, as one stream type the
//! framing code reads and writes without caring which.

use super::splice::Splicer;
use bytes::Bytes;
use kvtier_proto::wire::write_all_vectored;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// TLS towards the data plane: a connector and the name the server's
/// certificate must carry.
#[derive(Clone)]
pub struct WireTls {
    /// rustls connector (roots, optional client certificate).
    pub connector: tokio_rustls::TlsConnector,
    /// The server's name (DNS name or IP address).
    pub server_name: rustls::pki_types::ServerName<'static>,
}

/// A data-plane connection, plain or TLS.
pub enum Conn {
    /// Plain TCP; large payloads are spliced, not copied (`super::splice`).
    Plain(TcpStream, Splicer),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Conn {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s, _) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }

    /// Sends one frame: `head` (header and metadata, written) and then the
    /// payloads, which a plain connection splices from the caller's memory
    /// when they are large. The caller keeps `data` alive, unchanged, until
    /// the peer has answered (`super::splice`).
    pub async fn send_frame(&mut self, head: &[&[u8]], data: &[Bytes]) -> std::io::Result<()> {
        match self {
            Conn::Plain(s, sp) if data.iter().any(|d| d.len() >= super::splice::SPLICE_MIN) => {
                write_all_vectored(s, head).await?;
                for (i, d) in data.iter().enumerate() {
                    sp.send(s, d, i + 1 < data.len()).await?;
                }
                Ok(())
            }
            _ => {
                let mut parts: Vec<&[u8]> = head.to_vec();
                parts.extend(data.iter().map(|b| &b[..]));
                write_all_vectored(self, &parts).await
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s, _) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
