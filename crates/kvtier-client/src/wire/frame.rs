//! One request/response exchange on a data-plane connection: the request
//! frame written with vectored writes, the reply's header, metadata and
//! payloads read back (into fresh buffers, or the caller's: [`Sink`]).
use bytes::Bytes;
use kvtier_proto::v1 as pb;
use kvtier_proto::wire::{
    HEADER_LEN, Header, Kind, check_lengths, read_exact_bytes, read_payloads_checked,
    write_all_vectored,
};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// Where a ReadReply's payloads go.
pub(super) enum Sink<'a, 'b> {
    /// Into fresh buffers (the frame's `payloads`).
    Owned,
    /// Into the caller's buffers, payload `i` into the regions `dests[i]`,
    /// filled in order.
    Into(&'a mut [Vec<&'b mut [u8]>]),
}

/// Bytes received per read into a caller's buffer before they are
/// checksummed (while still in cache).
const RECV_CHUNK: usize = 256 << 10;

/// Receives `lengths` payloads into `dests`, checksumming each chunk as it
/// lands. A payload larger than its regions together is drained (the
/// connection stays usable) and reported as `Err(index)`.
pub(super) async fn receive<R: AsyncRead + Unpin>(
    r: &mut R,
    lengths: &[u64],
    dests: &mut [Vec<&mut [u8]>],
) -> std::io::Result<Vec<std::result::Result<(usize, u32), usize>>> {
    let mut out = Vec::with_capacity(lengths.len());
    for (i, &len) in lengths.iter().enumerate() {
        let len = len as usize;
        match dests.get_mut(i) {
            Some(parts) if parts.iter().map(|p| p.len()).sum::<usize>() >= len => {
                let mut crc = 0u32;
                let mut left = len;
                for d in parts.iter_mut() {
                    let mut done = 0usize;
                    let want = d.len().min(left);
                    while done < want {
                        let end = (done + RECV_CHUNK).min(want);
                        r.read_exact(&mut d[done..end]).await?;
                        crc = crc32c::crc32c_append(crc, &d[done..end]);
                        done = end;
                    }
                    left -= want;
                    if left == 0 {
                        break;
                    }
                }
                out.push(Ok((len, crc)));
            }
            _ => {
                kvtier_proto::wire::discard(r, len as u64).await?;
                out.push(Err(i));
            }
        }
    }
    Ok(out)
}

/// One reply frame. A `ReadReply`'s payloads are checksummed while they
/// arrive (`payloads`: each with its CRC32C), so verification overlaps the
/// transfer.
pub(super) struct Frame {
    pub(super) header: Header,
    pub(super) meta: Bytes,
    /// Decoded metadata of a `ReadReply`.
    pub(super) read_reply: Option<pb::WireReadReply>,
    pub(super) payloads: Vec<(Bytes, u32)>,
    /// A ReadReply received into the caller's buffers: each payload's
    /// length and CRC32C (`Sink::Into`), or the caller's buffer that was too
    /// small for it (its index: the payloads were drained, the connection
    /// stays usable).
    pub(super) filled: Vec<std::result::Result<(usize, u32), usize>>,
}

pub(super) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    kind: Kind,
    id: u64,
    meta: Vec<u8>,
    data: &[Bytes],
    sink: &mut Sink<'_, '_>,
) -> std::io::Result<Frame> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let data_len: usize = data.iter().map(Bytes::len).sum();
    let header = Header {
        kind,
        request_id: id,
        meta_len: meta.len() as u32,
        data_len: data_len as u32,
    }
    .encode();
    let mut parts: Vec<&[u8]> = vec![&header, &meta];
    parts.extend(data.iter().map(|b| &b[..]));
    write_all_vectored(sock, &parts).await?;
    let mut raw = [0u8; HEADER_LEN];
    sock.read_exact(&mut raw).await?;
    let h = Header::decode(&raw).map_err(invalid)?;
    if h.request_id != id && h.kind != Kind::Error {
        return Err(invalid(format!(
            "reply to request {} while waiting for {id}",
            h.request_id
        )));
    }
    // Into uninitialised buffers: no memset of the payload before the socket fills it.
    let m = read_exact_bytes(sock, h.meta_len as usize).await?;
    let read_reply = match h.kind {
        Kind::ReadReply => Some(
            pb::WireReadReply::decode(m.clone())
                .map_err(|e| invalid(format!("bad read reply: {e}")))?,
        ),
        _ => None,
    };
    let whole = [u64::from(h.data_len)];
    let lengths = read_reply
        .as_ref()
        .map_or(&whole[..], |r| &r.payload_lengths);
    check_lengths(lengths, h.data_len.into()).map_err(invalid)?;
    let (payloads, filled) = match sink {
        Sink::Into(dests) if h.kind == Kind::ReadReply => {
            (Vec::new(), receive(sock, lengths, dests).await?)
        }
        _ => (read_payloads_checked(sock, lengths).await?, Vec::new()),
    };
    Ok(Frame {
        header: h,
        meta: m,
        read_reply,
        payloads,
        filled,
    })
}
