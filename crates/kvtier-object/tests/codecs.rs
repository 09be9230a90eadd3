//! Compressed objects (docs/object-store.md#compression): round trips per
//! codec on realistic bf16 KV payloads, version-1 objects still read, and
//! damaged codec frames refused — a miss counted corrupt, never served.
use bytes::Bytes;
use kvtier_core::block::Block;
use kvtier_core::disk::format;
use kvtier_core::{BlockId, Key, Namespace, Tier};
use kvtier_object::codec::{self, Codec, Dtype, FRAME_LEN};
use kvtier_object::testing::kv_like_bf16;
use kvtier_object::{
    ObjectTier, ObjectTierConfig, decode_object, decode_object_limited, encode_object,
    encode_object_with,
};

const MIB: usize = 1 << 20;
const ALL: [Codec; 4] = [
    Codec::Off,
    Codec::ZstdPlanes,
    Codec::Lz4Planes,
    Codec::Fp8E4m3(Dtype::Bf16),
];

fn block(key: &str, payload: Vec<u8>) -> Block {
    let id = BlockId::new(
        Namespace::new("acme/m").unwrap(),
        Key::new(Bytes::copy_from_slice(key.as_bytes())).unwrap(),
    );
    Block::new(id, None, 16, Bytes::from(payload))
}

fn bytes_of(p: object_store::PutPayload) -> Bytes {
    Bytes::from(p.into_iter().flat_map(|c| c.to_vec()).collect::<Vec<u8>>())
}

fn object(b: &Block, c: Codec) -> Vec<u8> {
    bytes_of(encode_object_with(b, c).0).to_vec()
}

/// Header length of an encoded object.
fn header_len(obj: &[u8]) -> usize {
    format::decode_object_header(obj).unwrap().header_len
}

/// Rewrites the frame's checksum so only the guard under test can object.
fn reseal(obj: &mut [u8]) {
    let h = header_len(obj);
    let sum = crc32c::crc32c_append(crc32c::crc32c(&obj[h..h + 16]), &obj[h + FRAME_LEN..]);
    obj[h + 16..h + 20].copy_from_slice(&sum.to_le_bytes());
}

/// Largest |dequantized - original| allowed for one value: half an E4M3 step
/// (2^-4 relative for normals, 2^-10 of the scale in the subnormal range)
/// plus the bf16 rounding of the result (2^-8 relative), with slack for f32.
fn fp8_bound(x: f32, scale: f32) -> f32 {
    (x.abs() / 16.0 + scale / 1024.0) * 1.001 + x.abs() / 256.0 * 1.01 + 1e-30
}

fn bf16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|p| f32::from_bits((u16::from_le_bytes([p[0], p[1]]) as u32) << 16))
        .collect()
}

fn check_round_trip(len: usize, seed: u64) {
    let mut payload = kv_like_bf16(len / 2, seed);
    if len % 2 == 1 {
        payload.push(0x5a);
    }
    let b = block("k", payload);
    let mut ratios = Vec::new();
    for c in ALL {
        let (p, stored) = encode_object_with(&b, c);
        let obj = bytes_of(p);
        let got =
            decode_object(&b.meta.id, "t", obj.clone()).unwrap_or_else(|e| panic!("{c}: {e}"));
        let v2 = format::decode_object_header(&obj).unwrap().version == format::VERSION_CODEC;
        ratios.push((c.name(), len as f64 / stored as f64));
        match c {
            Codec::Off => assert!(!v2 && got == b, "{c}"),
            Codec::ZstdPlanes | Codec::Lz4Planes => {
                // Tiny payloads gain nothing and stay raw (version 1).
                assert!(
                    v2 || len < 4096,
                    "{c} compresses KV-like bf16 at {len} bytes"
                );
                assert_eq!(got, b, "{c}: lossless, the block's own CRC32C verified");
            }
            Codec::Fp8E4m3(_) if len % 2 == 1 || len < 8 => {
                assert!(!v2, "odd length stored raw");
                assert_eq!(got, b);
            }
            Codec::Fp8E4m3(_) => {
                assert!(v2);
                assert!((stored as f64) < len as f64 * 0.51, "{stored} of {len}");
                assert_eq!(got.payload.len(), b.payload.len());
                assert_eq!(got.meta.crc32c, crc32c::crc32c(&got.payload), "served CRC");
                let (x, y) = (bf16s(&b.payload), bf16s(&got.payload));
                let mut worst = 0f32;
                for (cx, cy) in x.chunks(codec::fp8::CHUNK).zip(y.chunks(codec::fp8::CHUNK)) {
                    let amax = cx.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let scale = amax / codec::fp8::E4M3_MAX;
                    for (a, q) in cx.iter().zip(cy) {
                        let err = (a - q).abs();
                        assert!(err <= fp8_bound(*a, scale), "{a} -> {q} (scale {scale})");
                        worst = worst.max(err / scale);
                    }
                }
                // Relative to the scale: at most half an E4M3 step at the top
                // of its range (16 scale units) plus the bf16 rounding of
                // the result (< 1.75 units there).
                assert!(worst <= 17.75, "worst error {worst} scale units");
            }
        }
    }
    eprintln!("{len} bytes: ratios {ratios:?}");
}

#[test]
fn every_codec_round_trips_4_mib_kv_like_bf16() {
    check_round_trip(4 * MIB, 1);
}

#[test]
fn every_codec_round_trips_16_mib_kv_like_bf16() {
    check_round_trip(16 * MIB, 2);
}

#[test]
fn every_codec_round_trips_odd_and_small_lengths() {
    for len in [4 * MIB + 1, 100_001, 4097, 3, 1, 0] {
        check_round_trip(len, len as u64);
    }
}

#[test]
fn fp16_round_trips_within_the_bound() {
    // fp16 values from the same distribution.
    let src: Vec<u8> = bf16s(&kv_like_bf16(MIB, 7))
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
        .collect();
    let b = block("h", src);
    let got = decode_object(
        &b.meta.id,
        "t",
        bytes_of(encode_object_with(&b, Codec::Fp8E4m3(Dtype::Fp16)).0),
    )
    .unwrap();
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(2)
            .map(|p| half::f16::from_bits(u16::from_le_bytes([p[0], p[1]])).to_f32())
            .collect()
    };
    let (x, y) = (f(&b.payload), f(&got.payload));
    for (cx, cy) in x.chunks(codec::fp8::CHUNK).zip(y.chunks(codec::fp8::CHUNK)) {
        let scale = cx.iter().fold(0f32, |m, v| m.max(v.abs())) / 448.0;
        for (a, q) in cx.iter().zip(cy) {
            // fp16 keeps 10 mantissa bits: its rounding is below bf16's.
            assert!((a - q).abs() <= fp8_bound(*a, scale), "{a} -> {q}");
        }
    }
}

#[test]
fn non_finite_values_are_stored_raw_under_fp8() {
    let mut p = kv_like_bf16(64 << 10, 3);
    p[1000..1002].copy_from_slice(&0x7f80u16.to_le_bytes()); // +Inf
    p[2000..2002].copy_from_slice(&0x7fc1u16.to_le_bytes()); // a NaN
    let b = block("nan", p);
    let obj = object(&b, Codec::Fp8E4m3(Dtype::Bf16));
    assert_eq!(
        format::decode_object_header(&obj).unwrap().version,
        format::VERSION
    );
    assert_eq!(
        decode_object(&b.meta.id, "t", obj.into()).unwrap(),
        b,
        "bit-exact"
    );
}

#[test]
fn version_1_objects_still_decode() {
    let b = block("old", kv_like_bf16(100_000, 4));
    let v1 = bytes_of(encode_object(&b));
    assert_eq!(&v1[4..6], &1u16.to_le_bytes(), "today's format");
    assert_eq!(
        decode_object_limited(&b.meta.id, "t", v1, 1).unwrap(),
        b,
        "no decoded-length limit on raw"
    );
}

/// Each damaged frame must be refused by its own guard: `reseal` makes the
/// frame checksum right again, so only the check under test stands.
#[test]
fn damaged_frames_are_refused() {
    let b = block("k", kv_like_bf16(256 << 10, 5));
    let good = object(&b, Codec::ZstdPlanes);
    let h = header_len(&good);
    let refused = |obj: Vec<u8>, want: &str| {
        let e = decode_object(&b.meta.id, "t", obj.into()).unwrap_err();
        assert!(e.contains(want), "want {want:?}: {e}");
    };
    // Unknown codec id.
    let mut x = good.clone();
    x[h] = 9;
    reseal(&mut x);
    refused(x, "unknown codec");
    // Another codec's id over zstd bytes.
    let mut x = good.clone();
    x[h] = 2;
    reseal(&mut x);
    refused(x, "lz4");
    // A flipped body byte (checksum left as is).
    let mut x = good.clone();
    let n = x.len();
    x[n - 7] ^= 0x04;
    refused(x, "codec frame crc32c mismatch");
    // A flipped frame field.
    let mut x = good.clone();
    x[h + 9] ^= 1;
    refused(x, "codec frame crc32c mismatch");
    // Decoded length that lies, shorter and longer.
    for d in [b.payload.len() as u64 - 2, b.payload.len() as u64 + 2] {
        let mut x = good.clone();
        x[h + 8..h + 16].copy_from_slice(&d.to_le_bytes());
        reseal(&mut x);
        refused(x, "zstd");
    }
    // A decoded length past the limit is refused before allocating.
    let mut x = good.clone();
    x[h + 8..h + 16].copy_from_slice(&(1u64 << 50).to_le_bytes());
    reseal(&mut x);
    refused(x, "the limit is");
    let e = decode_object_limited(&b.meta.id, "t", good.clone().into(), 1000).unwrap_err();
    assert!(e.contains("the limit is 1000"), "{e}");
    // Truncated frame.
    let mut x = good[..h + 10].to_vec();
    let hdr = format::decode_object_header(&good).unwrap();
    let hb = format::encode_header_version(&hdr.meta, hdr.seq, 10, format::VERSION_CODEC);
    x.splice(..h, hb);
    refused(x, "truncated");
    // Another payload's intact frame under this block's header: decodes
    // fine, but not to the bytes the header vouches for.
    let other = object(&block("k", kv_like_bf16(256 << 10, 6)), Codec::ZstdPlanes);
    let frame = &other[header_len(&other)..];
    let mut x = format::encode_header_version(
        &hdr.meta,
        hdr.seq,
        frame.len() as u64,
        format::VERSION_CODEC,
    );
    x.extend_from_slice(frame);
    refused(x, "failed its checksum");
    // fp8: a body that does not fit the frame's length.
    let f = object(&b, Codec::Fp8E4m3(Dtype::Bf16));
    let hf = header_len(&f);
    let mut x = f.clone();
    x[hf + 8..hf + 16].copy_from_slice(&(b.payload.len() as u64 + 2).to_le_bytes());
    reseal(&mut x);
    refused(x, "fp8: body is");
    let mut x = f;
    x[hf + 1] = 7;
    reseal(&mut x);
    refused(x, "unknown dtype");
    // The disk tier never takes a version-2 record.
    assert!(format::decode_header(&good).is_err());
}

fn corrupt(t: &ObjectTier) -> u64 {
    t.extra_counters()
        .iter()
        .find(|c| c.0 == "object_corrupt")
        .unwrap()
        .2
}

#[tokio::test]
async fn the_tier_stores_compressed_objects_and_refuses_damaged_ones() {
    let t = ObjectTier::open(ObjectTierConfig {
        url: "memory://".into(),
        compression: Codec::ZstdPlanes,
        compression_namespaces: vec![
            ("acme/".into(), Codec::Fp8E4m3(Dtype::Bf16)),
            ("acme/raw".into(), Codec::Off),
        ],
        ..Default::default()
    })
    .unwrap();
    let ns = |s: &str| Namespace::new(s).unwrap();
    assert_eq!(t.codec_for(&ns("acme/m")), Codec::Fp8E4m3(Dtype::Bf16));
    assert_eq!(t.codec_for(&ns("acme/raw")), Codec::Off);
    assert_eq!(
        t.codec_for(&ns("acme")),
        Codec::ZstdPlanes,
        "not under acme/"
    );
    assert_eq!(t.codec_for(&ns("other")), Codec::ZstdPlanes);

    let lossless = Block::new(
        BlockId::new(ns("other"), Key::new(&b"a"[..]).unwrap()),
        None,
        16,
        Bytes::from(kv_like_bf16(2 * MIB, 8)),
    );
    t.put(lossless.clone()).await.unwrap();
    t.clear_cache();
    assert_eq!(t.get(&lossless.meta.id).await.unwrap().unwrap(), lossless);
    let lossy = block("b", kv_like_bf16(2 * MIB, 9));
    t.put(lossy.clone()).await.unwrap();
    let got = t.get(&lossy.meta.id).await.unwrap().unwrap();
    assert_ne!(got.payload, lossy.payload, "lossy");
    assert_eq!(got.meta.crc32c, crc32c::crc32c(&got.payload));
    let c = t.extra_counters();
    let v = |n: &str| c.iter().find(|x| x.0 == n).unwrap().2;
    assert_eq!(v("object_put_payload_bytes"), 8 * MIB as u64);
    let stored = v("object_put_stored_bytes");
    assert!(stored < 6 * MIB as u64 && stored > MIB as u64, "{stored}");

    // A damaged frame in the store: a miss, counted corrupt, never served.
    let (store, path) = t.locate(&lossless.meta.id).unwrap();
    let mut raw = store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let h = header_len(&raw);
    raw[h] = 9;
    reseal(&mut raw);
    store.put(&path, raw.into()).await.unwrap();
    assert_eq!(corrupt(&t), 0);
    assert!(t.get(&lossless.meta.id).await.unwrap().is_none());
    assert_eq!(corrupt(&t), 1);
    // A decoded length above the tier's max_block_size: refused as well.
    let small = ObjectTier::open(ObjectTierConfig {
        url: "memory://".into(),
        compression: Codec::Lz4Planes,
        max_block_size: MIB as u64,
        ..Default::default()
    })
    .unwrap();
    let big = block("c", kv_like_bf16(MIB, 10));
    small.put(big.clone()).await.unwrap();
    assert!(small.get(&big.meta.id).await.unwrap().is_none());
    assert_eq!(corrupt(&small), 1);
}
