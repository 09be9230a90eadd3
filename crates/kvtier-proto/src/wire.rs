//! Framing of the bulk data plane (docs/wire.md).
//!
//! ```text
//!   header (24 bytes, little-endian)
//!     magic "KVW1" | kind u8 | flags u8 | reserved u16 | request id u64 | meta_len u32 | data_len u32
//!   meta:  meta_len bytes, a protobuf message chosen by `kind`
//!   data:  data_len raw payload bytes, blocks concatenated in order
//! ```
//! The payload bytes are written straight from the store's buffers with
//! vectored writes and read into one buffer that is sliced per block, so the
//! server never copies a payload in user space.
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Frame magic.
pub const MAGIC: [u8; 4] = *b"KVW1";
/// Header length.
pub const HEADER_LEN: usize = 24;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client → server: `WireReadRequest`.
    Read = 1,
    /// Client → server: `WireWriteRequest` + payloads.
    Write = 2,
    /// Client → server: `WireHello` (authentication, first on a connection).
    Hello = 3,
    /// Client → server, same-host front only: `WireReadRequest`, answered
    /// with where each block is in shared memory (docs/local.md).
    MapRead = 6,
    /// Client → server, same-host front only: `WireRelease`.
    Release = 7,
    /// Client → server, same-host front only: `WireLend`.
    Lend = 8,
    /// Client → server, same-host front only: `WireWriteRequest` whose
    /// payloads are in the connection's lent segment.
    WriteLent = 9,
    /// Server → client: `WireReadReply` + payloads.
    ReadReply = 0x81,
    /// Server → client: `WriteResponse`.
    WriteReply = 0x82,
    /// Server → client: the Hello was accepted (empty metadata).
    HelloReply = 0x83,
    /// Server → client: `WireMapReadReply` (+ the inline payloads, if any).
    MapReadReply = 0x86,
    /// Server → client: the leases were released (empty metadata).
    ReleaseReply = 0x87,
    /// Server → client: `WireLent`.
    LendReply = 0x88,
    /// Server → client: `WireError`.
    Error = 0xff,
}

impl Kind {
    /// Parses the kind byte.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Read,
            2 => Kind::Write,
            3 => Kind::Hello,
            6 => Kind::MapRead,
            7 => Kind::Release,
            8 => Kind::Lend,
            9 => Kind::WriteLent,
            0x81 => Kind::ReadReply,
            0x82 => Kind::WriteReply,
            0x83 => Kind::HelloReply,
            0x86 => Kind::MapReadReply,
            0x87 => Kind::ReleaseReply,
            0x88 => Kind::LendReply,
            0xff => Kind::Error,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Echoed in the reply.
    pub request_id: u64,
    /// Metadata length.
    pub meta_len: u32,
    /// Raw payload length.
    pub data_len: u32,
}

impl Header {
    /// Encodes into 24 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = BytesMut::with_capacity(HEADER_LEN);
        b.put_slice(&MAGIC);
        b.put_u8(self.kind as u8);
        b.put_u8(0);
        b.put_u16_le(0);
        b.put_u64_le(self.request_id);
        b.put_u32_le(self.meta_len);
        b.put_u32_le(self.data_len);
        b[..].try_into().expect("24 bytes")
    }

    /// Decodes 24 bytes; explains what is wrong otherwise.
    pub fn decode(raw: &[u8; HEADER_LEN]) -> Result<Self, String> {
        if raw[..4] != MAGIC {
            return Err(format!(
                "bad frame magic {:02x?}: not a kvtier data-plane peer",
                &raw[..4]
            ));
        }
        let kind =
            Kind::from_u8(raw[4]).ok_or_else(|| format!("unknown frame kind {:#04x}", raw[4]))?;
        let mut b = &raw[8..];
        let request_id = b.get_u64_le();
        let meta_len = b.get_u32_le();
        let data_len = b.get_u32_le();
        Ok(Self {
            kind,
            request_id,
            meta_len,
            data_len,
        })
    }
}

/// Checks that payload `lengths` (from a peer's metadata) add up to the
/// frame's `data_len` without overflowing; the error says what is wrong.
pub fn check_lengths(lengths: &[u64], data_len: u64) -> Result<(), String> {
    match lengths.iter().try_fold(0u64, |a, &l| a.checked_add(l)) {
        Some(t) if t == data_len => Ok(()),
        Some(t) => Err(format!(
            "payload lengths add up to {t} bytes but the frame carries {data_len}"
        )),
        None => Err(format!(
            "payload lengths overflow (the frame carries {data_len} bytes)"
        )),
    }
}

/// Splits `data` into consecutive payloads of `lengths` (zero-copy), checking the total.
pub fn split_payloads(mut data: Bytes, lengths: &[u64]) -> Result<Vec<Bytes>, String> {
    check_lengths(lengths, data.len() as u64)?;
    Ok(lengths.iter().map(|&l| data.split_to(l as usize)).collect())
}

/// Reads exactly `n` bytes into a fresh buffer without zero-filling it first
/// (`read_buf` into uninitialised capacity; a 1.2 MB `BytesMut::zeroed` costs a
/// memset of the whole payload before the socket overwrites it). Never reads
/// past `n`, so the next frame stays in the socket.
pub async fn read_exact_bytes<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    n: usize,
) -> std::io::Result<Bytes> {
    use tokio::io::AsyncReadExt;
    let mut buf = BytesMut::with_capacity(n);
    while buf.len() < n {
        let want = n - buf.len();
        if r.read_buf(&mut (&mut buf).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

/// Reads the frame's data section, `lengths` consecutive payloads, into one
/// buffer (uninitialised capacity, as [`read_exact_bytes`]) and returns the
/// payloads with the CRC32C of each, computed **as the bytes arrive**: each
/// chunk the socket hands over is checksummed while it is still in cache and
/// while the peer is still sending the rest, so verification overlaps the
/// transfer instead of following it as a ~60 µs pass over a 1.2 MB buffer
/// (notes/001). Never reads past the data section.
pub async fn read_payloads_checked<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    lengths: &[u64],
) -> std::io::Result<Vec<(Bytes, u32)>> {
    use tokio::io::AsyncReadExt;
    let invalid = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let total = lengths
        .iter()
        .try_fold(0u64, |a, &l| a.checked_add(l))
        .and_then(|t| usize::try_from(t).ok())
        .ok_or_else(|| invalid("payload lengths overflow"))?;
    let mut buf = BytesMut::with_capacity(total);
    let mut crcs = Vec::with_capacity(lengths.len());
    // Segment being checksummed: its index, where it starts in `buf`, its running CRC.
    let (mut seg, mut seg_start, mut crc) = (0usize, 0usize, 0u32);
    let mut done = 0usize; // bytes of `buf` already checksummed
    let mut advance = |buf: &BytesMut, crcs: &mut Vec<u32>| {
        while seg < lengths.len() {
            let seg_end = seg_start + lengths[seg] as usize;
            let upto = seg_end.min(buf.len());
            crc = crc32c::crc32c_append(crc, &buf[done..upto]);
            done = upto;
            if done < seg_end {
                break;
            }
            crcs.push(crc);
            (seg, seg_start, crc) = (seg + 1, seg_end, 0);
        }
    };
    advance(&buf, &mut crcs); // zero-length leading payloads
    while buf.len() < total {
        let want = total - buf.len();
        if r.read_buf(&mut (&mut buf).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        advance(&buf, &mut crcs);
    }
    let payloads = split_payloads(buf.freeze(), lengths).map_err(|e| invalid(&e))?;
    Ok(payloads.into_iter().zip(crcs).collect())
}

/// Reads and drops `n` bytes (the data section of a frame that is answered
/// with an error but keeps the connection usable).
pub async fn discard<R: tokio::io::AsyncRead + Unpin>(r: &mut R, n: u64) -> std::io::Result<()> {
    let copied = tokio::io::copy(
        &mut tokio::io::AsyncReadExt::take(r, n),
        &mut tokio::io::sink(),
    )
    .await?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Writes every part with vectored writes, handling partial writes; the parts
/// (header, metadata, payloads) are never concatenated in user space.
pub async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let (mut idx, mut off) = (0usize, 0usize);
    // Skip leading empty parts.
    while idx < parts.len() && parts[idx].is_empty() {
        idx += 1;
    }
    while idx < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[idx][off..])
            .chain(parts[idx + 1..].iter().copied())
            .take(64)
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while idx < parts.len() && n >= parts[idx].len() - off {
            n -= parts[idx].len() - off;
            idx += 1;
            off = 0;
        }
        off += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn header_roundtrip_and_rejects_garbage() {
        let h = Header {
            kind: Kind::ReadReply,
            request_id: 7,
            meta_len: 12,
            data_len: 1_200_000,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = h.encode();
        bad[4] = 0x40;
        assert!(Header::decode(&bad).unwrap_err().contains("kind"));
        let parts = split_payloads(Bytes::from_static(b"abcdef"), &[2, 0, 4]).unwrap();
        assert_eq!(
            parts,
            vec![
                Bytes::from_static(b"ab"),
                Bytes::new(),
                Bytes::from_static(b"cdef")
            ]
        );
        assert!(split_payloads(Bytes::from_static(b"abc"), &[2]).is_err());
        // Lengths from a peer that overflow when summed are an error, not a panic or a wrap.
        let e = check_lengths(&[u64::MAX, 2], 1).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        assert!(split_payloads(Bytes::from_static(b"a"), &[u64::MAX, 2]).is_err());
    }

    #[tokio::test]
    async fn read_exact_bytes_stops_at_n() {
        let (mut a, mut b) = tokio::io::duplex(5);
        let w = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut a, b"0123456789abc")
                .await
                .unwrap();
        });
        assert_eq!(
            &read_exact_bytes(&mut b, 10).await.unwrap()[..],
            b"0123456789"
        );
        assert_eq!(&read_exact_bytes(&mut b, 3).await.unwrap()[..], b"abc");
        w.await.unwrap();
        assert!(read_exact_bytes(&mut b, 1).await.is_err());
        assert!(read_exact_bytes(&mut b, 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn checked_payloads_match_a_one_pass_crc_across_chunk_boundaries() {
        // A 3-byte pipe makes every read cross (or stop short of) a payload boundary.
        let payloads: Vec<Vec<u8>> = vec![
            vec![],
            (0..100u8).collect(),
            vec![],
            b"x".to_vec(),
            (0..=255u8).cycle().take(1000).collect(),
            vec![],
        ];
        let lengths: Vec<u64> = payloads.iter().map(|p| p.len() as u64).collect();
        let all = payloads.concat();
        let (mut a, mut b) = tokio::io::duplex(3);
        let w = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut a, &all)
                .await
                .unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut a, b"next")
                .await
                .unwrap();
            a
        });
        let got = read_payloads_checked(&mut b, &lengths).await.unwrap();
        assert_eq!(got.len(), payloads.len());
        for ((bytes, crc), want) in got.iter().zip(&payloads) {
            assert_eq!(&bytes[..], &want[..]);
            assert_eq!(*crc, crc32c::crc32c(want));
        }
        // The next frame is untouched.
        assert_eq!(&read_exact_bytes(&mut b, 4).await.unwrap()[..], b"next");
        let a = w.await.unwrap();
        drop(a);
        // A short data section is an error, not a hang or a short payload.
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"abc")
            .await
            .unwrap();
        drop(a);
        assert!(read_payloads_checked(&mut b, &[2, 5]).await.is_err());
        assert!(read_payloads_checked(&mut b, &[u64::MAX, 2]).await.is_err());
        let (mut a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"abcdef")
            .await
            .unwrap();
        discard(&mut b, 4).await.unwrap();
        assert_eq!(&read_exact_bytes(&mut b, 2).await.unwrap()[..], b"ef");
        drop(a);
        assert!(discard(&mut b, 1).await.is_err());
    }

    #[tokio::test]
    async fn vectored_writes_survive_partial_writes() {
        // A duplex pipe with a tiny buffer forces many partial writes.
        let (mut a, mut b) = tokio::io::duplex(7);
        let parts: Vec<Vec<u8>> = vec![
            vec![],
            b"header".to_vec(),
            vec![],
            (0..200u8).collect(),
            b"x".to_vec(),
            vec![],
        ];
        let want: Vec<u8> = parts.concat();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut b, &mut got)
                .await
                .unwrap();
            got
        });
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        write_all_vectored(&mut a, &refs).await.unwrap();
        drop(a);
        assert_eq!(reader.await.unwrap(), want);
    }
}
