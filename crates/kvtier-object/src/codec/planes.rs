//! Lossless codecs: byte-plane split of 16-bit values, then zstd or LZ4.
//!
//! A bf16/fp16 KV payload interleaves a high byte (sign, exponent, top
//! mantissa bits: few distinct values) with a low byte (mantissa: close to
//! random). Splitting them into two planes (all low bytes, then all high
//! bytes) lets the entropy coder see the redundant high bytes as one run;
//! notes/063-codecs.md measures what it buys over plain zstd.
//! An odd trailing byte is kept as is after the planes.

/// Splits `src` into byte planes: `[b0 b2 b4 ...][b1 b3 b5 ...][tail]`.
pub fn split(src: &[u8]) -> Vec<u8> {
    let n = src.len() / 2;
    let mut out = vec![0u8; src.len()];
    let (lo, rest) = out.split_at_mut(n);
    let (hi, tail) = rest.split_at_mut(n);
    // Fixed-size groups of 16 values so the compiler drops the bounds checks
    // and vectorises the shuffle (a plain per-value loop ran at a fraction
    // of zstd's speed: notes/063-codecs.md).
    const G: usize = 16;
    let mut vals = src[..2 * n].chunks_exact(2 * G);
    let mut lo_g = lo.chunks_exact_mut(G);
    let mut hi_g = hi.chunks_exact_mut(G);
    for ((v, l), h) in (&mut vals).zip(&mut lo_g).zip(&mut hi_g) {
        for j in 0..G {
            l[j] = v[2 * j];
            h[j] = v[2 * j + 1];
        }
    }
    let rest = vals.remainder();
    for ((p, l), h) in rest
        .chunks_exact(2)
        .zip(lo_g.into_remainder())
        .zip(hi_g.into_remainder())
    {
        *l = p[0];
        *h = p[1];
    }
    tail.copy_from_slice(&src[2 * n..]);
    out
}

/// Inverse of [`split`].
pub fn merge(src: &[u8]) -> Vec<u8> {
    let n = src.len() / 2;
    let mut out = vec![0u8; src.len()];
    let (lo, rest) = src.split_at(n);
    let (hi, tail) = rest.split_at(n);
    const G: usize = 16;
    let mut vals = out[..2 * n].chunks_exact_mut(2 * G);
    let mut lo_g = lo.chunks_exact(G);
    let mut hi_g = hi.chunks_exact(G);
    for ((v, l), h) in (&mut vals).zip(&mut lo_g).zip(&mut hi_g) {
        for j in 0..G {
            v[2 * j] = l[j];
            v[2 * j + 1] = h[j];
        }
    }
    for ((p, l), h) in vals
        .into_remainder()
        .chunks_exact_mut(2)
        .zip(lo_g.remainder())
        .zip(hi_g.remainder())
    {
        p[0] = *l;
        p[1] = *h;
    }
    out[2 * n..].copy_from_slice(tail);
    out
}

/// zstd level used by `zstd-planes` (notes/063-codecs.md: on bf16 KV-like
/// planes level 1 gave a better ratio than level 3, 1.44 against 1.38, and
/// decoded faster).
pub const ZSTD_LEVEL: i32 = 1;

/// zstd of `src` at `level` (no plane split: the bench's baseline).
pub fn zstd_compress(src: &[u8], level: i32) -> Result<Vec<u8>, String> {
    zstd::bulk::compress(src, level).map_err(|e| format!("zstd: {e}"))
}

/// Decompresses zstd `src` into exactly `len` bytes (the buffer is allocated
/// once at `len`, which the caller has bounded; more output is an error).
pub fn zstd_decompress(src: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(len);
    let n = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(src, &mut out))
        .map_err(|e| format!("zstd: {e}"))?;
    if n != len {
        return Err(format!("zstd: decoded {n} bytes, frame says {len}"));
    }
    Ok(out)
}

/// `zstd-planes` encoder.
pub fn zstd_planes_encode(src: &[u8], level: i32) -> Result<Vec<u8>, String> {
    zstd_compress(&split(src), level)
}

/// `zstd-planes` decoder (`len`: the decoded length, already bounded).
pub fn zstd_planes_decode(src: &[u8], len: usize) -> Result<Vec<u8>, String> {
    Ok(merge(&zstd_decompress(src, len)?))
}

/// `lz4-planes` encoder (LZ4 block format: the frame carries the length).
pub fn lz4_planes_encode(src: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress(&split(src))
}

/// `lz4-planes` decoder (`len`: the decoded length, already bounded).
pub fn lz4_planes_decode(src: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; len];
    let n = lz4_flex::block::decompress_into(src, &mut out).map_err(|e| format!("lz4: {e}"))?;
    if n != len {
        return Err(format!("lz4: decoded {n} bytes, frame says {len}"));
    }
    Ok(merge(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_merge_are_inverse_at_every_small_length() {
        for len in (0..80usize).chain([1000, 1001]) {
            let v: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let s = split(&v);
            assert_eq!(merge(&s), v, "len {len}");
            if len >= 4 {
                // All low bytes first, then all high bytes.
                assert_eq!(&s[..2], &[0, 2]);
                assert_eq!(s[len / 2], 1);
            }
        }
    }

    #[test]
    fn codecs_refuse_lying_lengths() {
        let v: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        let z = zstd_planes_encode(&v, ZSTD_LEVEL).unwrap();
        assert_eq!(zstd_planes_decode(&z, v.len()).unwrap(), v);
        assert!(zstd_planes_decode(&z, v.len() - 1).is_err());
        assert!(zstd_planes_decode(&z, v.len() + 1).is_err());
        let l = lz4_planes_encode(&v);
        assert_eq!(lz4_planes_decode(&l, v.len()).unwrap(), v);
        assert!(lz4_planes_decode(&l, v.len() - 1).is_err());
        assert!(lz4_planes_decode(&l, v.len() + 1).is_err());
    }
}
