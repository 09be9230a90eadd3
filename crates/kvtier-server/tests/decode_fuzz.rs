//! Property test over the request-decoding path (the same function the
//! cargo-fuzz target in fuzz/ drives): arbitrary bytes and mutated valid
//! requests never panic, and validation never accepts a block whose payload
//! does not match its checksum.
use bytes::Bytes;
use kvtier_proto::v1;
use kvtier_server::fuzzing::decode_and_validate;
use proptest::prelude::*;
use prost::Message;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_and_validate(&data);
    }

    #[test]
    fn mutated_write_requests_never_panic(
        payload in prop::collection::vec(any::<u8>(), 0..256),
        key in prop::collection::vec(any::<u8>(), 0..16),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        good_crc in any::<bool>(),
    ) {
        let crc = crc32c::crc32c(&payload) ^ if good_crc { 0 } else { 1 };
        let req = v1::WriteRequest {
            namespace: "fuzz".into(),
            blocks: vec![v1::Block { key: Bytes::from(key), crc32c: crc, payload: Bytes::from(payload), ..Default::default() }],
        };
        let mut bytes = req.encode_to_vec();
        for (pos, x) in flips {
            if !bytes.is_empty() {
                let n = bytes.len();
                bytes[pos % n] ^= x;
            }
        }
        decode_and_validate(&bytes);
    }
}
