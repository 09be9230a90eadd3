//! Synthetic KV-cache-like bf16 data for codec tests and the codec bench
//! (`examples/codec_bench.rs`, notes/063-codecs.md).
//!
//! Distribution, per value at flat index `i`, laid out as rows of 8 heads ×
//! 128 channels (one token's K or V for one layer): channel `c = i % 1024`
//! has a scale `s_c` drawn once from a log-normal (median 0.5, σ = 0.6 in
//! log space) and a bias `m_c ~ N(0, 0.2)`; 2 % of channels are outlier
//! channels (×8, as keys of trained models show); the value is
//! `m_c + s_c · N(0, 1)`, and one value in 10 000 is a ×20 spike. Rounded
//! to bf16 (nearest even). Trained models' KV has more structure than this
//! (notes/063-codecs.md says what that means for the ratios).

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64: seeded, reproducible, no dependency.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Channels per row (8 heads × head_dim 128).
const ROW: usize = 1024;

/// `values` bf16 values (2 bytes each, little-endian) from `seed`.
pub fn kv_like_bf16(values: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed ^ 0x6b76_7469_6572);
    let chans: Vec<(f64, f64)> = (0..ROW)
        .map(|_| {
            let mut s = 0.5 * (0.6 * r.normal()).exp();
            if r.unit() < 0.02 {
                s *= 8.0;
            }
            (s, 0.2 * r.normal())
        })
        .collect();
    let mut out = Vec::with_capacity(values * 2);
    for i in 0..values {
        let (s, m) = chans[i % ROW];
        let mut x = m + s * r.normal();
        if r.unit() < 1e-4 {
            x *= 20.0;
        }
        out.extend_from_slice(&super::fp8::f32_to_bf16(x as f32).to_le_bytes());
    }
    out
}
