//! Lossy `fp8-e4m3`: 16-bit floats (bf16 or fp16, as configured) quantized to
//! OCP FP8 E4M3 ("fn": no infinities, S.1111.111 is NaN, largest finite 448)
//! with one f32 scale per chunk of [`CHUNK`] values (scale = amax / 448), and
//! dequantized back to the same 16-bit type on read. Rounding is to nearest,
//! ties to even, at both steps.
//!
//! Non-finite input (NaN, ±Inf) is not quantized: [`encode`] returns `None`
//! and the caller stores the block uncompressed, so such values survive
//! exactly. Odd-length payloads (not 16-bit values) likewise.
//! See docs/object-store.md#compression and notes/063-codecs.md.

/// Values per f32 scale (notes/063-codecs.md: against 4096, 1024 cut the
/// relative RMS error from 2.46 % to 2.28 % for 0.3 % of the ratio; a
/// smaller chunk also keeps one outlier from flattening more values).
pub const CHUNK: usize = 1024;
/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The 16-bit float type of a payload (the server cannot tell; configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    Fp16,
}

impl Dtype {
    /// Byte stored in the codec frame.
    pub fn id(self) -> u8 {
        match self {
            Dtype::Bf16 => 1,
            Dtype::Fp16 => 2,
        }
    }
    /// Inverse of [`Dtype::id`].
    pub fn from_id(b: u8) -> Option<Self> {
        match b {
            1 => Some(Dtype::Bf16),
            2 => Some(Dtype::Fp16),
            _ => None,
        }
    }
    /// Config name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }
    fn decode_bits(self, bits: u16) -> f32 {
        match self {
            Dtype::Bf16 => f32::from_bits((bits as u32) << 16),
            Dtype::Fp16 => half::f16::from_bits(bits).to_f32(),
        }
    }
    fn encode_f32(self, x: f32) -> u16 {
        match self {
            Dtype::Bf16 => f32_to_bf16(x),
            // `half` rounds to nearest even.
            Dtype::Fp16 => half::f16::from_f32(x).to_bits(),
        }
    }
}

/// f32 → bf16, round to nearest even; NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Finite f32 → E4M3 code, round to nearest even, saturating at ±448.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let b = x.to_bits();
    let sign = ((b >> 24) & 0x80) as u8;
    let a = x.abs();
    if a.is_nan() {
        return sign | 0x7f;
    }
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 1.0 / 64.0 {
        // Subnormal range: units of 2^-9; 8 units is the smallest normal,
        // whose code is also 8 (exponent 1, mantissa 0).
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let ab = a.to_bits();
    // Keep 3 mantissa bits, rounding the 20 dropped ones to nearest even; a
    // carry moves into the exponent as it should.
    let r = (ab + 0x7_ffff + ((ab >> 20) & 1)) >> 20;
    let code = r - ((127 - 7) << 3);
    sign | code.min(0x7e) as u8
}

/// E4M3 code → f32 (0x7f / 0xff are NaN).
pub fn e4m3_to_f32(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = (c >> 3) & 0xf;
    let m = (c & 7) as f32;
    if e == 0xf && c & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 512.0
    } else {
        sign * (1.0 + m / 8.0) * f32::powi(2.0, e as i32 - 7)
    }
}

fn table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)))
}

/// Every code's dequantized value for one chunk's `scale`, in `dtype`'s bits:
/// 256 conversions per chunk of 1024 values instead of one per value, and
/// the per-value work becomes one lookup (decode was 0.8 GB/s on one core
/// with a multiply and a rounding per value: notes/065-cold-tiers.md).
fn dequantized(t: &[f32; 256], dtype: Dtype, scale: f32) -> [u16; 256] {
    std::array::from_fn(|i| dtype.encode_f32(t[i] * scale))
}

/// Stored length of `values` 16-bit values in chunks of `chunk`.
pub fn stored_len(values: usize, chunk: usize) -> usize {
    values.div_ceil(chunk) * 4 + values
}

/// Encoded body and the CRC32C of the payload it decodes to.
pub struct Encoded {
    /// `[f32 LE scale per chunk][one E4M3 code per value]`.
    pub body: Vec<u8>,
    /// CRC32C of the dequantized payload (what a read serves).
    pub served_crc: u32,
}

/// Quantizes `src` (16-bit values of `dtype`); `None` when it is not
/// quantizable: odd length, or any NaN/Inf (stored raw instead).
pub fn encode(src: &[u8], dtype: Dtype, chunk: usize) -> Option<Encoded> {
    if !src.len().is_multiple_of(2) || chunk == 0 {
        return None;
    }
    let n = src.len() / 2;
    let chunks = n.div_ceil(chunk);
    let mut body = vec![0u8; stored_len(n, chunk)];
    let (scales, codes) = body.split_at_mut(chunks * 4);
    let t = table();
    let mut crc = 0u32;
    let mut deq = vec![0u8; chunk * 2];
    // Magnitude bits at or above this are ±Inf or NaN.
    let non_finite: u16 = match dtype {
        Dtype::Bf16 => 0x7f80,
        Dtype::Fp16 => 0x7c00,
    };
    for (ci, (raw, out)) in src
        .chunks(chunk * 2)
        .zip(codes.chunks_mut(chunk))
        .enumerate()
    {
        let m = out.len();
        // The largest magnitude as integer bits: for 16-bit floats the
        // order of |x| is the order of the bits without the sign, and an
        // integer max vectorises where a float max (NaN rules) does not
        // (it was a quarter of the encode time: notes/063-codecs.md).
        let amax_bits = raw
            .chunks_exact(2)
            .map(|p| u16::from_le_bytes([p[0], p[1]]) & 0x7fff)
            .max()
            .unwrap_or(0);
        if amax_bits >= non_finite {
            return None;
        }
        let amax = dtype.decode_bits(amax_bits);
        let scale = amax / E4M3_MAX;
        scales[ci * 4..ci * 4 + 4].copy_from_slice(&scale.to_le_bytes());
        // scale == 0 only when the chunk is all zeros. Multiplying by the
        // inverse is faster than dividing; a scale so small its inverse
        // overflows (amax < ~1e-36) divides instead.
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let divide = !inv.is_finite();
        let lut = dequantized(t, dtype, scale);
        for ((o, p), d) in out
            .iter_mut()
            .zip(raw.chunks_exact(2))
            .zip(deq.chunks_exact_mut(2))
        {
            let v = dtype.decode_bits(u16::from_le_bytes([p[0], p[1]]));
            let q = if divide { v / scale } else { v * inv };
            *o = f32_to_e4m3(q);
            d.copy_from_slice(&lut[*o as usize].to_le_bytes());
        }
        crc = crc32c::crc32c_append(crc, &deq[..2 * m]);
    }
    Some(Encoded {
        body,
        served_crc: crc,
    })
}

/// Dequantizes a body of `len` decoded bytes (already bounded by the caller).
pub fn decode(src: &[u8], dtype: Dtype, chunk: usize, len: usize) -> Result<Vec<u8>, String> {
    if !len.is_multiple_of(2) || chunk == 0 {
        return Err(format!(
            "fp8: decoded length {len} or chunk {chunk} invalid"
        ));
    }
    let n = len / 2;
    if src.len() != stored_len(n, chunk) {
        return Err(format!(
            "fp8: body is {} bytes, {n} values in chunks of {chunk} need {}",
            src.len(),
            stored_len(n, chunk)
        ));
    }
    let (scales, codes) = src.split_at(n.div_ceil(chunk) * 4);
    let t = table();
    let mut out = vec![0u8; len];
    for ((s, c), o) in scales
        .chunks_exact(4)
        .zip(codes.chunks(chunk))
        .zip(out.chunks_mut(chunk * 2))
    {
        let lut = dequantized(t, dtype, f32::from_le_bytes([s[0], s[1], s[2], s[3]]));
        for (code, d) in c.iter().zip(o.chunks_exact_mut(2)) {
            d.copy_from_slice(&lut[*code as usize].to_le_bytes());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_codes_round_trip_and_round_to_nearest_even() {
        for c in 0u8..=255 {
            let x = e4m3_to_f32(c);
            if x.is_nan() {
                assert!(c & 0x7f == 0x7f, "{c:#x}");
                continue;
            }
            // -0 encodes as 0x80, +0 as 0.
            assert_eq!(f32_to_e4m3(x), c, "{c:#x} = {x}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        assert_eq!(f32_to_e4m3(1e9), 0x7e, "saturates");
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        // 1.0625 is halfway between 1.0 (even mantissa) and 1.125: to 1.0.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        // 1.1875 is halfway between 1.125 (odd) and 1.25 (even): to 1.25.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        // Subnormal tie: 1.5 units of 2^-9 rounds to 2 units.
        assert_eq!(f32_to_e4m3(1.5 / 512.0), 2);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "tie to even"
        );
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3f81_8000)),
            0x3f82,
            "tie to even"
        );
    }

    #[test]
    fn non_finite_and_odd_payloads_are_not_quantized() {
        let vals = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert!(
            encode(&vals(&[0x3f80, 0x7fc0]), Dtype::Bf16, CHUNK).is_none(),
            "NaN"
        );
        assert!(
            encode(&vals(&[0x3f80, 0x7f80]), Dtype::Bf16, CHUNK).is_none(),
            "Inf"
        );
        assert!(
            encode(&vals(&[0x3c00, 0x7c00]), Dtype::Fp16, CHUNK).is_none(),
            "fp16 Inf"
        );
        assert!(encode(&[1, 2, 3], Dtype::Bf16, CHUNK).is_none(), "odd");
        let zeros = encode(&[0u8; 64], Dtype::Bf16, CHUNK).unwrap();
        assert_eq!(
            decode(&zeros.body, Dtype::Bf16, CHUNK, 64).unwrap(),
            vec![0u8; 64]
        );
    }
}
