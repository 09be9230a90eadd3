//! Property tests of the object decoder (the cargo-fuzz target
//! `fuzz/fuzz_targets/object_decode.rs` drives the same function): arbitrary
//! bytes never panic, an encoded object decodes to exactly its block, and an
//! object that was flipped, cut, extended or fetched for another block is
//! refused — never served as a different block or payload. The same for
//! compressed (version-2) objects of every codec.
use bytes::Bytes;
use kvtier_core::{Block, BlockId, Key, Namespace};
use kvtier_object::codec::{Codec, Dtype};
use kvtier_object::{decode_object, encode_object, encode_object_with};
use proptest::prelude::*;

fn id(key: &[u8]) -> BlockId {
    BlockId::new(
        Namespace::new("fuzz/ns").unwrap(),
        Key::new(key.to_vec()).unwrap(),
    )
}

fn object(b: &Block) -> Vec<u8> {
    encode_object(b)
        .into_iter()
        .flat_map(|c| c.to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(
        key in prop::collection::vec(any::<u8>(), 1..40),
        data in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let _ = decode_object(&id(&key), "fuzz", Bytes::from(data));
    }

    #[test]
    fn objects_round_trip_and_damage_is_refused(
        key in prop::collection::vec(any::<u8>(), 1..40),
        other in prop::collection::vec(any::<u8>(), 1..40),
        payload in prop::collection::vec(any::<u8>(), 0..2048),
        flip in (any::<usize>(), 1u8..=255),
        cut in any::<usize>(),
        extra in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        let b = Block::new(id(&key), None, 16, Bytes::from(payload));
        let obj = object(&b);
        let d = decode_object(&id(&key), "fuzz", Bytes::from(obj.clone())).expect("an encoded object decodes");
        prop_assert_eq!(&d.meta, &b.meta);
        prop_assert_eq!(&d.payload, &b.payload);

        // Fetched for another block: refused.
        if other != key {
            prop_assert!(decode_object(&id(&other), "fuzz", Bytes::from(obj.clone())).is_err());
        }
        // One flipped byte anywhere (header or payload): refused.
        let mut bad = obj.clone();
        let i = flip.0 % bad.len();
        bad[i] ^= flip.1;
        prop_assert!(decode_object(&id(&key), "fuzz", Bytes::from(bad)).is_err(), "byte {} flipped and accepted", i);
        // Cut short or extended: refused.
        let n = cut % obj.len();
        prop_assert!(decode_object(&id(&key), "fuzz", Bytes::from(obj[..n].to_vec())).is_err(), "cut to {} accepted", n);
        let mut long = obj.clone();
        long.extend_from_slice(&extra);
        prop_assert!(decode_object(&id(&key), "fuzz", Bytes::from(long)).is_err(), "extended object accepted");
    }

    #[test]
    fn compressed_objects_round_trip_and_damage_is_refused(
        key in prop::collection::vec(any::<u8>(), 1..40),
        values in prop::collection::vec(-3i16..3, 0..3000),
        codec in 0usize..3,
        flip in (any::<usize>(), 1u8..=255),
        cut in any::<usize>(),
    ) {
        // Few distinct bf16 values: compressible, so most objects are v2.
        let payload: Vec<u8> = values.iter()
            .flat_map(|v| kvtier_object::codec::fp8::f32_to_bf16(*v as f32 * 0.25).to_le_bytes())
            .collect();
        let c = [Codec::ZstdPlanes, Codec::Lz4Planes, Codec::Fp8E4m3(Dtype::Bf16)][codec];
        let b = Block::new(id(&key), None, 16, Bytes::from(payload));
        let obj: Vec<u8> = encode_object_with(&b, c).0.into_iter().flat_map(|x| x.to_vec()).collect();
        let d = decode_object(&id(&key), "fuzz", Bytes::from(obj.clone())).expect("an encoded object decodes");
        if c.is_lossy() {
            prop_assert_eq!(d.payload.len(), b.payload.len());
        } else {
            prop_assert_eq!(&d.payload, &b.payload);
        }
        let mut bad = obj.clone();
        let i = flip.0 % bad.len();
        bad[i] ^= flip.1;
        prop_assert!(decode_object(&id(&key), "fuzz", Bytes::from(bad)).is_err(), "byte {} flipped and accepted", i);
        let n = cut % obj.len();
        prop_assert!(decode_object(&id(&key), "fuzz", Bytes::from(obj[..n].to_vec())).is_err(), "cut to {} accepted", n);
    }
}
