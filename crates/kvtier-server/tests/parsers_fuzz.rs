//! Property tests of the hand-written parsers (the cargo-fuzz targets in
//! fuzz/ drive the same functions): the data plane's connection loop on
//! arbitrary and mutated byte streams (ends, never panics, answers only with
//! whole valid frames), and HTTP paths and query strings (a 4xx with a body,
//! never a 5xx or a panic).
mod common;

use kvtier_proto::v1 as pb;
use kvtier_proto::wire::Kind;
use kvtier_server::fuzzing::data_plane_session;
use proptest::prelude::*;
use prost::Message;

fn frame(kind: u8, id: u64, meta: &[u8], data: &[u8], data_len: Option<u32>) -> Vec<u8> {
    let mut f = common::frame(Kind::Read, id, meta, data);
    f[4] = kind;
    if let Some(n) = data_len {
        f[20..24].copy_from_slice(&n.to_le_bytes());
    }
    f
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn arbitrary_byte_streams_end_cleanly(data in prop::collection::vec(any::<u8>(), 0..300)) {
        data_plane_session(&data);
    }

    #[test]
    fn mutated_frames_end_cleanly(
        kind in prop::sample::select(vec![1u8, 2, 3, 0x81, 0xff, 9]),
        key in prop::collection::vec(any::<u8>(), 0..12),
        payload in prop::collection::vec(any::<u8>(), 0..200),
        data_len in prop::option::of(any::<u32>()),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        frames in 1usize..4,
    ) {
        let meta = match kind {
            1 => pb::WireReadRequest {
                request: Some(pb::ReadRequest { namespace: "f".into(), keys: vec![key.clone().into()], ..Default::default() }),
                ..Default::default()
            }.encode_to_vec(),
            2 => pb::WireWriteRequest {
                request: Some(pb::WriteRequest { namespace: "f".into(), blocks: vec![pb::Block {
                    key: key.clone().into(), crc32c: crc32c::crc32c(&payload), ..Default::default() }] }),
                payload_lengths: vec![payload.len() as u64],
                timeout_ms: 0,
            }.encode_to_vec(),
            3 => pb::WireHello { token: "t".into() }.encode_to_vec(),
            _ => key.clone(),
        };
        let mut stream = Vec::new();
        for i in 0..frames {
            stream.extend(frame(kind, i as u64, &meta, &payload, data_len));
        }
        for (pos, x) in flips {
            if !stream.is_empty() {
                let n = stream.len();
                stream[pos % n] ^= x;
            }
        }
        data_plane_session(&stream);
    }

    #[test]
    fn http_paths_and_queries_get_clean_answers(
        ns in "[ -~]{0,40}",
        key in "[ -~]{0,40}",
        query in "[ -~]{0,40}",
        method in 0u8..6,
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // As the cargo-fuzz target `http_request` does: method byte, path
        // and query, NUL, body; the function asserts no 5xx and no hang.
        let enc = |s: &str| percent_encode(s);
        let uri = format!("v1/kv/{}/{}?{}", enc(&ns), enc(&key), enc(&query).replace("%3D", "=").replace("%26", "&"));
        let mut input = vec![method];
        input.extend_from_slice(uri.as_bytes());
        input.push(0);
        input.extend_from_slice(&body);
        kvtier_server::fuzzing::http_request(&input);
    }

    #[test]
    fn arbitrary_http_requests_get_clean_answers(data in prop::collection::vec(any::<u8>(), 0..120)) {
        kvtier_server::fuzzing::http_request(&data);
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
