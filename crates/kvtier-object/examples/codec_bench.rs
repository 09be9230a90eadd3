//! Codec bench (scripts/bench-codecs.py runs it; notes/063-codecs.md):
//! compression ratio and encode/decode throughput of the object-tier codecs
//! and their variants on KV-like bf16 blocks, on one core and on all cores.
//! Prints one JSON object.
//!
//! `cargo run --release -p kvtier-object --example codec_bench -- \
//!     [--blocks 128] [--block-mib 4] [--threads N] [--seed 1] [--data FILE] [--dump FILE]`
//!
//! `--dump`: write the blocks (concatenated) to FILE and exit, so another
//! bench (scripts/netlab-codecs.py) stores exactly these bytes.
//!
//! `--data`: raw little-endian bf16 values to cut into blocks (cycled);
//! without it, `kvtier_object::testing::kv_like_bf16` (its docs state the
//! distribution).
use kvtier_object::codec::{self, Codec, Dtype, fp8, planes};
use std::time::Instant;

type Enc = fn(&[u8]) -> Vec<u8>;
type Dec = fn(&[u8], usize) -> Vec<u8>;

fn crc_of(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// The shipped codecs go through the real frame (compress + decompress,
/// frame CRC32C included); the others are the raw variants the choice was
/// made against.
fn variants() -> Vec<(&'static str, bool, Enc, Dec)> {
    fn framed(c: Codec, b: &[u8]) -> Vec<u8> {
        codec::compress(b, crc_of(b), c)
            .map(|f| f.bytes)
            .unwrap_or_default()
    }
    fn unframed(b: &[u8], _len: usize) -> Vec<u8> {
        codec::decompress(b, u64::MAX).expect("decodes")
    }
    vec![
        (
            "zstd-planes",
            true,
            |b| framed(Codec::ZstdPlanes, b),
            unframed,
        ),
        (
            "lz4-planes",
            true,
            |b| framed(Codec::Lz4Planes, b),
            unframed,
        ),
        (
            "fp8-e4m3",
            true,
            |b| framed(Codec::Fp8E4m3(Dtype::Bf16), b),
            unframed,
        ),
        (
            "zstd-1 (no planes)",
            false,
            |b| planes::zstd_compress(b, 1).unwrap(),
            |b, n| planes::zstd_decompress(b, n).unwrap(),
        ),
        (
            "zstd-3 (no planes)",
            false,
            |b| planes::zstd_compress(b, 3).unwrap(),
            |b, n| planes::zstd_decompress(b, n).unwrap(),
        ),
        (
            "zstd-planes-3",
            false,
            |b| planes::zstd_planes_encode(b, 3).unwrap(),
            |b, n| planes::zstd_planes_decode(b, n).unwrap(),
        ),
        (
            "lz4 (no planes)",
            false,
            lz4_flex::block::compress,
            |b, n| lz4_flex::block::decompress(b, n).unwrap(),
        ),
        ("byte-plane split alone", false, planes::split, |b, _| {
            planes::merge(b)
        }),
        (
            "zstd-1 of the high plane alone",
            false,
            |b| planes::zstd_compress(&planes::split(b)[b.len() / 2..], 1).unwrap(),
            |b, n| planes::zstd_decompress(b, n - n / 2).unwrap(),
        ),
        (
            "zstd-1 of the low plane alone",
            false,
            |b| planes::zstd_compress(&planes::split(b)[..b.len() / 2], 1).unwrap(),
            |b, n| planes::zstd_decompress(b, n / 2).unwrap(),
        ),
        (
            "fp8-e4m3 chunk 4096",
            false,
            |b| fp8::encode(b, Dtype::Bf16, 4096).unwrap().body,
            |b, n| fp8::decode(b, Dtype::Bf16, 4096, n).unwrap(),
        ),
    ]
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Seconds to run `f` over every block on `threads` threads (block i on
/// thread i mod threads).
fn timed<T: Sync>(blocks: &[T], threads: usize, f: &(dyn Fn(&T) + Sync)) -> f64 {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for b in blocks.iter().skip(t).step_by(threads) {
                    f(b);
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

fn bf16(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(2)
        .map(|p| f32::from_bits((u16::from_le_bytes([p[0], p[1]]) as u32) << 16))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = arg(&args, "--blocks").map_or(128, |v| v.parse().expect("--blocks"));
    let mib: f64 = arg(&args, "--block-mib").map_or(4.0, |v| v.parse().expect("--block-mib"));
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let threads: usize = arg(&args, "--threads").map_or(cores, |v| v.parse().expect("--threads"));
    let seed: u64 = arg(&args, "--seed").map_or(1, |v| v.parse().expect("--seed"));
    let size = ((mib * (1 << 20) as f64) as usize) & !1;
    let (blocks, source): (Vec<Vec<u8>>, String) = match arg(&args, "--data") {
        Some(path) => {
            let all = std::fs::read(&path).expect("--data file");
            assert!(all.len() >= 2, "--data file is empty");
            let blocks = (0..n)
                .map(|i| {
                    all.iter()
                        .cycle()
                        .skip((i * size) % all.len())
                        .take(size)
                        .copied()
                        .collect()
                })
                .collect();
            (blocks, format!("file {path}"))
        }
        None => (
            (0..n)
                .map(|i| kvtier_object::testing::kv_like_bf16(size / 2, seed + i as u64))
                .collect(),
            "synthetic kv_like_bf16 (kvtier_object::codec::synth)".into(),
        ),
    };
    if let Some(path) = arg(&args, "--dump") {
        std::fs::write(&path, blocks.concat()).expect("--dump file");
        return;
    }
    let total = (n * size) as f64;
    let mut rows = Vec::new();
    for (name, shipped, enc, dec) in variants() {
        let encoded: Vec<Vec<u8>> = blocks.iter().map(|b| enc(b)).collect();
        let stored: usize = encoded.iter().map(Vec::len).sum();
        let e1 = timed(&blocks, 1, &|b| drop(std::hint::black_box(enc(b))));
        let en = timed(&blocks, threads, &|b| drop(std::hint::black_box(enc(b))));
        let d1 = timed(&encoded, 1, &|b| drop(std::hint::black_box(dec(b, size))));
        let dn = timed(&encoded, threads, &|b| {
            drop(std::hint::black_box(dec(b, size)))
        });
        // Lossy: error of the dequantized values against the originals,
        // relative to the data's RMS, and the largest in units of its chunk's
        // scale (amax / 448).
        let mut err = String::from("null");
        if name.starts_with("fp8") {
            let chunk = if name.contains("4096") {
                4096
            } else {
                fp8::CHUNK
            };
            let (mut se, mut sx, mut worst, mut cnt) = (0f64, 0f64, 0f64, 0f64);
            for (b, e) in blocks.iter().zip(&encoded) {
                let back = dec(e, size);
                let (x, y): (Vec<f32>, Vec<f32>) = (bf16(b).collect(), bf16(&back).collect());
                for (cx, cy) in x.chunks(chunk).zip(y.chunks(chunk)) {
                    let scale = cx.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 448.0;
                    for (a, q) in cx.iter().zip(cy) {
                        let d = (*a as f64 - *q as f64).abs();
                        se += d * d;
                        sx += (*a as f64).powi(2);
                        cnt += 1.0;
                        if scale > 0.0 {
                            worst = worst.max(d / scale);
                        }
                    }
                }
            }
            err = format!(
                "{{\"rel_rmse\": {:.6}, \"max_err_in_scale_units\": {:.4}, \"values\": {cnt}}}",
                (se / sx).sqrt(),
                worst
            );
        }
        let gbs = |t: f64| total / t / 1e9;
        rows.push(format!(
            "{{\"codec\": \"{name}\", \"shipped\": {shipped}, \"ratio\": {:.4}, \
             \"encode_gbps_1core\": {:.3}, \"decode_gbps_1core\": {:.3}, \
             \"encode_gbps_all\": {:.3}, \"decode_gbps_all\": {:.3}, \"error\": {err}}}",
            total / stored as f64,
            gbs(e1),
            gbs(d1),
            gbs(en),
            gbs(dn),
        ));
    }
    println!(
        "{{\"blocks\": {n}, \"block_bytes\": {size}, \"threads\": {threads}, \"cores\": {cores}, \
         \"seed\": {seed}, \"data\": \"{}\", \"zstd_level\": {}, \"fp8_chunk\": {}, \
         \"gbps\": \"decoded bytes (10^9) per second of wall time\", \"codecs\": [{}]}}",
        source.replace('"', "'"),
        planes::ZSTD_LEVEL,
        fp8::CHUNK,
        rows.join(", ")
    );
}
