//! Property tests of the disk record header (also the object store's object
//! header): arbitrary and mutated bytes never panic, and whatever decodes
//! after a mutation is exactly what was encoded or is refused (the header's
//! CRC32C covers every field).
use kvtier_core::disk::format::{HeaderError, decode_header, encode_header};
use kvtier_core::*;
use proptest::prelude::*;

fn meta(key: Vec<u8>, parent: Option<Vec<u8>>, ttl: Option<u64>) -> BlockMeta {
    BlockMeta {
        id: BlockId::new(Namespace::new("fuzz/ns").unwrap(), Key::new(key).unwrap()),
        parent: parent.map(|p| Key::new(p).unwrap()),
        token_count: 128,
        crc32c: 0xdead_beef,
        expires_unix_ms: ttl,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_header(&data);
    }

    #[test]
    fn headers_round_trip_and_mutations_are_refused(
        key in prop::collection::vec(any::<u8>(), 1..64),
        parent in prop::option::of(prop::collection::vec(any::<u8>(), 1..64)),
        ttl in prop::option::of(1u64..u64::MAX),
        seq in any::<u64>(),
        len in any::<u64>(),
        flip in (any::<usize>(), 1u8..=255),
        cut in any::<usize>(),
    ) {
        let m = meta(key, parent, ttl);
        let h = encode_header(&m, seq, len);
        let d = decode_header(&h).expect("an encoded header decodes");
        prop_assert_eq!(&d.meta, &m);
        prop_assert_eq!((d.seq, d.payload_len, d.header_len), (seq, len, h.len()));
        // One flipped byte: refused (never a different, "valid" header).
        let mut bad = h.clone();
        let i = flip.0 % bad.len();
        bad[i] ^= flip.1;
        prop_assert!(decode_header(&bad).is_err(), "byte {} flipped and still accepted", i);
        // Truncated: refused, never a panic.
        let n = cut % h.len();
        match decode_header(&h[..n]) {
            Err(HeaderError::Short) | Err(HeaderError::Corrupt(_)) => {}
            Ok(_) => prop_assert!(false, "a header cut to {} bytes decoded", n),
        }
    }
}
