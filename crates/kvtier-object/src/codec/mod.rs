//! Compression of stored objects (docs/object-store.md#compression; the
//! format is in docs/disk-format.md#version-2-compressed-objects).
//!
//! An uncompressed object is a version-1 record: header, raw payload (what
//! every build before this one wrote, and still the default). A compressed
//! object is a version-2 record whose payload is a *codec frame*:
//!
//! ```text
//! off  len  field
//!   0    1  codec id (1 zstd-planes, 2 lz4-planes, 3 fp8-e4m3)
//!   1    1  dtype of the decoded values (fp8-e4m3: 1 bf16, 2 fp16; else 0)
//!   2    2  reserved, 0
//!   4    4  codec parameter (fp8-e4m3: values per scale; else 0)
//!   8    8  decoded length D
//!  16    4  crc32c of frame bytes [0, 16) followed by the body
//!  20    .  body (the codec's output)
//! ```
//!
//! The record header's CRC32C is that of the decoded payload: the original
//! block's for lossless codecs, the dequantized bytes' for `fp8-e4m3` (what
//! a read serves and the client verifies). Decoding refuses an unknown codec
//! id, a frame checksum mismatch, a decoded length above the caller's limit
//! (checked before anything is allocated) or different from what the codec
//! produced; the caller then checks the payload CRC32C.
pub mod fp8;
pub mod planes;
pub mod synth;

pub use fp8::Dtype;

/// Bytes of the codec frame before the body.
pub const FRAME_LEN: usize = 20;

/// How a namespace's objects are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Codec {
    /// Raw payload, a version-1 record (the default).
    #[default]
    Off,
    /// Lossless: byte planes, then zstd.
    ZstdPlanes,
    /// Lossless: byte planes, then LZ4 (faster, smaller gain).
    Lz4Planes,
    /// Lossy: E4M3 with a per-chunk f32 scale, served as `dtype`.
    Fp8E4m3(Dtype),
}

/// Every codec name the config accepts.
pub const NAMES: &[&str] = &["off", "zstd-planes", "lz4-planes", "fp8-e4m3"];

impl Codec {
    /// Parses a config name; `dtype` is required for (and only for) `fp8-e4m3`.
    pub fn parse(name: &str, dtype: Option<&str>) -> Result<Self, String> {
        let c = match name {
            "off" => Codec::Off,
            "zstd-planes" => Codec::ZstdPlanes,
            "lz4-planes" => Codec::Lz4Planes,
            "fp8-e4m3" => {
                let d = match dtype {
                    Some("bf16") => Dtype::Bf16,
                    Some("fp16") => Dtype::Fp16,
                    Some(o) => {
                        return Err(format!("dtype {o:?} is not one of \"bf16\", \"fp16\""));
                    }
                    None => {
                        return Err("fp8-e4m3 needs dtype = \"bf16\" or \"fp16\" \
                                    (the payload's 16-bit float type)"
                            .into());
                    }
                };
                return Ok(Codec::Fp8E4m3(d));
            }
            other => {
                return Err(format!(
                    "unknown codec {other:?}; valid: {}",
                    NAMES.join(", ")
                ));
            }
        };
        match dtype {
            Some(_) => Err(format!("dtype applies to fp8-e4m3 only, not {name}")),
            None => Ok(c),
        }
    }

    /// Config name.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Off => "off",
            Codec::ZstdPlanes => "zstd-planes",
            Codec::Lz4Planes => "lz4-planes",
            Codec::Fp8E4m3(_) => "fp8-e4m3",
        }
    }

    /// Whether decoding gives back other bytes than were encoded.
    pub fn is_lossy(self) -> bool {
        matches!(self, Codec::Fp8E4m3(_))
    }

    fn id(self) -> u8 {
        match self {
            Codec::Off => 0,
            Codec::ZstdPlanes => 1,
            Codec::Lz4Planes => 2,
            Codec::Fp8E4m3(_) => 3,
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::Fp8E4m3(d) => write!(f, "fp8-e4m3 ({})", d.name()),
            c => f.write_str(c.name()),
        }
    }
}

/// A compressed payload, ready to follow a version-2 header.
#[derive(Debug)]
pub struct Framed {
    /// Frame then body.
    pub bytes: Vec<u8>,
    /// CRC32C of the payload a read of it serves (goes in the header).
    pub served_crc: u32,
}

/// Compresses `payload` (whose CRC32C is `crc`) with `codec`; `None` when it
/// should be stored raw: codec `off`, a payload the codec does not take
/// (fp8: odd length, NaN/Inf), or no gain (framed ≥ raw).
pub fn compress(payload: &[u8], crc: u32, codec: Codec) -> Option<Framed> {
    let (body, served_crc, dtype, param) = match codec {
        Codec::Off => return None,
        Codec::ZstdPlanes => (
            planes::zstd_planes_encode(payload, planes::ZSTD_LEVEL).ok()?,
            crc,
            0,
            0,
        ),
        Codec::Lz4Planes => (planes::lz4_planes_encode(payload), crc, 0, 0),
        Codec::Fp8E4m3(d) => {
            let e = fp8::encode(payload, d, fp8::CHUNK)?;
            (e.body, e.served_crc, d.id(), fp8::CHUNK as u32)
        }
    };
    if FRAME_LEN + body.len() >= payload.len() {
        return None;
    }
    let mut bytes = Vec::with_capacity(FRAME_LEN + body.len());
    bytes.push(codec.id());
    bytes.push(dtype);
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(&param.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let sum = crc32c::crc32c_append(crc32c::crc32c(&bytes), &body);
    bytes.extend_from_slice(&sum.to_le_bytes());
    bytes.extend_from_slice(&body);
    Some(Framed { bytes, served_crc })
}

/// Decodes a codec frame into the payload; `max_len` bounds the decoded
/// length before any allocation. Errors name what is wrong.
pub fn decompress(framed: &[u8], max_len: u64) -> Result<Vec<u8>, String> {
    if framed.len() < FRAME_LEN {
        return Err(format!("codec frame truncated ({} bytes)", framed.len()));
    }
    let le4 =
        |o: usize| u32::from_le_bytes([framed[o], framed[o + 1], framed[o + 2], framed[o + 3]]);
    let stored_sum = le4(16);
    let body = &framed[FRAME_LEN..];
    let sum = crc32c::crc32c_append(crc32c::crc32c(&framed[..16]), body);
    if sum != stored_sum {
        return Err(format!(
            "codec frame crc32c mismatch (stored {stored_sum:#010x}, computed {sum:#010x})"
        ));
    }
    let (id, dtype, reserved, param) = (framed[0], framed[1], [framed[2], framed[3]], le4(4));
    let mut d8 = [0u8; 8];
    d8.copy_from_slice(&framed[8..16]);
    let len = u64::from_le_bytes(d8);
    if len > max_len {
        return Err(format!(
            "codec frame says {len} decoded bytes; the limit is {max_len}"
        ));
    }
    let len = len as usize;
    if reserved != [0, 0] {
        return Err("codec frame reserved bytes are not 0".into());
    }
    match (id, dtype, param) {
        (1, 0, 0) => planes::zstd_planes_decode(body, len),
        (2, 0, 0) => planes::lz4_planes_decode(body, len),
        (3, d, chunk) if chunk > 0 && chunk <= 1 << 20 => {
            let d = Dtype::from_id(d).ok_or_else(|| format!("fp8 frame: unknown dtype {d}"))?;
            fp8::decode(body, d, chunk as usize, len)
        }
        _ => Err(format!(
            "unknown codec frame (id {id}, dtype {dtype}, parameter {param})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_list_the_valid() {
        assert_eq!(Codec::parse("zstd-planes", None), Ok(Codec::ZstdPlanes));
        assert_eq!(
            Codec::parse("fp8-e4m3", Some("fp16")),
            Ok(Codec::Fp8E4m3(Dtype::Fp16))
        );
        let e = Codec::parse("gzip", None).unwrap_err();
        assert!(e.contains("lz4-planes") && e.contains("\"gzip\""), "{e}");
        assert!(Codec::parse("fp8-e4m3", None).is_err());
        assert!(Codec::parse("fp8-e4m3", Some("fp32")).is_err());
        assert!(Codec::parse("zstd-planes", Some("bf16")).is_err());
    }
}
