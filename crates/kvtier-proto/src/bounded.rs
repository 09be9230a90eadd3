//! Request-size limits enforced before decoding.
//!
//! A protobuf list costs more decoded than encoded: a token of one varint
//! byte becomes 4 (`uint32`) or 8 (`int64`) bytes of a `Vec`, which prost
//! grows by doubling. Checking a Lookup's token count after decoding (as the
//! handlers do) let a 9 MiB request of 10 M tokens take 115 MiB of server
//! memory before it was refused. [`check`] walks the encoded message's
//! fields instead, without allocating, and refuses a list that is too long
//! before anything is decoded; [`decode`] then decodes with each list's
//! final size reserved up front (no doubling).
//!
//! Every generated gRPC service and client uses [`BoundedCodec`] (set as the
//! codec in `build.rs`); the data plane calls [`decode`] for its request
//! metadata. Types with no rules decode as with `tonic_prost::ProstCodec`.
use crate::{kvstore, v1};
use bytes::Buf;
use prost::Message;
use std::any::{Any, TypeId};
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};

/// Most keys (blocks, hashes) one request may name.
pub const MAX_KEYS_PER_REQUEST: usize = 65_536;

/// Most tokens one Lookup may carry: [`MAX_KEYS_PER_REQUEST`] blocks of the
/// seed service's 128 tokens. Longer prompts are looked up by keys (the
/// clients hash tokens themselves) or in parts.
pub const MAX_TOKENS_PER_REQUEST: usize = MAX_KEYS_PER_REQUEST * 128;

/// Most tokens in one kvstore chunk (kvtier's largest block size).
pub const MAX_TOKENS_PER_CHUNK: usize = 1 << 16;

/// What one field may hold.
#[derive(Clone, Copy)]
enum Rule {
    /// At most this many elements of a repeated bytes / string / message
    /// field.
    Count(&'static str, usize),
    /// At most this many elements of a repeated varint field, packed (one
    /// element per final byte of the run) or not (one per tag).
    Varints(&'static str, usize),
    /// A singular sub-message checked with these rules. prost merges every
    /// occurrence of a singular message field into one message, so its
    /// lists are counted across all occurrences, not per occurrence.
    Nested(&'static [(u32, Rule)]),
}

const LOOKUP_V1: &[(u32, Rule)] = &[
    (2, Rule::Count("keys", MAX_KEYS_PER_REQUEST)),
    (3, Rule::Varints("tokens", MAX_TOKENS_PER_REQUEST)),
];
const KEYS_V1: &[(u32, Rule)] = &[(2, Rule::Count("keys", MAX_KEYS_PER_REQUEST))];
const WRITE_V1: &[(u32, Rule)] = &[(2, Rule::Count("blocks", MAX_KEYS_PER_REQUEST))];
const LOOKUP_KVSTORE: &[(u32, Rule)] = &[
    (5, Rule::Varints("tokens", MAX_TOKENS_PER_REQUEST)),
    (6, Rule::Varints("precomputed_hashes", MAX_KEYS_PER_REQUEST)),
];
const CHUNK_KVSTORE: &[(u32, Rule)] = &[(5, Rule::Varints("tokens", MAX_TOKENS_PER_CHUNK))];
const WRITE_KVSTORE: &[(u32, Rule)] = &[(3, Rule::Nested(CHUNK_KVSTORE))];
const WIRE_READ: &[(u32, Rule)] = &[(1, Rule::Nested(KEYS_V1))];
const WIRE_WRITE: &[(u32, Rule)] = &[
    (1, Rule::Nested(WRITE_V1)),
    (2, Rule::Varints("payload_lengths", MAX_KEYS_PER_REQUEST)),
];
const WIRE_RELEASE: &[(u32, Rule)] = &[(1, Rule::Varints("leases", MAX_KEYS_PER_REQUEST))];

/// The rules for message type `T`, if it has any.
fn rules<T: 'static>() -> Option<&'static [(u32, Rule)]> {
    let t = TypeId::of::<T>();
    [
        (TypeId::of::<v1::LookupRequest>(), LOOKUP_V1),
        (TypeId::of::<v1::ReadRequest>(), KEYS_V1),
        (TypeId::of::<v1::DeleteRequest>(), KEYS_V1),
        (TypeId::of::<v1::LeaseRequest>(), KEYS_V1),
        (TypeId::of::<v1::WriteRequest>(), WRITE_V1),
        (TypeId::of::<kvstore::LookupRequest>(), LOOKUP_KVSTORE),
        (TypeId::of::<kvstore::WriteRequest>(), WRITE_KVSTORE),
        (TypeId::of::<kvstore::PromptChunk>(), CHUNK_KVSTORE),
        (TypeId::of::<v1::WireReadRequest>(), WIRE_READ),
        (TypeId::of::<v1::WireWriteRequest>(), WIRE_WRITE),
        (TypeId::of::<v1::WireRelease>(), WIRE_RELEASE),
    ]
    .into_iter()
    .find_map(|(id, r)| (id == t).then_some(r))
}

/// Reads a varint at `*at`, advancing it; `None` at a malformed one.
fn varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Refuses `buf` (an encoded `T`) if a list in it is longer than its limit,
/// or if the walk cannot account for every byte of it: a malformed field,
/// or a protobuf group (wire types 3 and 4; deprecated, used by no kvtier
/// message), after which prost would go on decoding fields this walk never
/// counted. Costs one pass over the bytes; allocates only a counter per
/// nested message.
pub fn check<T: 'static>(buf: &[u8]) -> Result<(), Status> {
    match rules::<T>() {
        Some(r) => check_fields(buf, r, &mut Counts::default()),
        None => Ok(()),
    }
}

/// Elements counted so far per rule of one rule set, and the counts of the
/// singular sub-messages under it (kept across their occurrences).
#[derive(Default)]
struct Counts {
    n: [usize; 4], // no rule set has more than 4 fields
    nested: [Option<Box<Counts>>; 4],
}

fn check_fields(buf: &[u8], rules: &[(u32, Rule)], counts: &mut Counts) -> Result<(), Status> {
    debug_assert!(rules.len() <= counts.n.len());
    let mut fields = Fields { buf, at: 0 };
    for (field, wire_type, body) in fields.by_ref() {
        let Some(i) = rules.iter().position(|(f, _)| *f == field) else {
            continue;
        };
        match rules[i].1 {
            Rule::Count(name, max) | Rule::Varints(name, max) => {
                counts.n[i] += match rules[i].1 {
                    Rule::Varints(..) if wire_type == 2 => varints(body),
                    _ => 1,
                };
                if counts.n[i] > max {
                    return Err(Status::invalid_argument(format!(
                        "more than {max} {name} in one request; the limit is {max}"
                    )));
                }
            }
            Rule::Nested(inner) if wire_type == 2 => {
                check_fields(body, inner, counts.nested[i].get_or_insert_default())?
            }
            Rule::Nested(_) => {}
        }
    }
    if fields.at < buf.len() {
        return Err(Status::invalid_argument(format!(
            "malformed protobuf message: field at byte {} cannot be parsed \
             (groups are not accepted)",
            fields.at
        )));
    }
    Ok(())
}

/// The top-level fields of an encoded message, as (field number, wire type,
/// the field's bytes after its tag); ends at the first field that is
/// malformed or a group, leaving `at` at its tag.
struct Fields<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u32, u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.buf;
        let mut at = self.at;
        let tag = varint(buf, &mut at)?;
        let field = u32::try_from(tag >> 3).ok().filter(|&f| f != 0)?;
        let start = at;
        let len = match tag & 7 {
            0 => {
                varint(buf, &mut at)?;
                self.at = at;
                return Some((field, 0, &buf[start..at]));
            }
            1 => 8,
            5 => 4,
            2 => {
                let n = varint(buf, &mut at)?;
                if n > (buf.len() - at) as u64 {
                    return None;
                }
                n as usize
            }
            _ => return None,
        };
        let body = buf.get(at..at + len)?;
        self.at = at + len;
        Some((field, tag & 7, body))
    }
}

/// Elements of a packed run of varints: one per final byte.
fn varints(run: &[u8]) -> usize {
    run.iter().filter(|&&b| b < 0x80).count()
}

/// [`check`], then decodes with the token lists' final size reserved (prost
/// would grow them by doubling).
pub fn decode<T: Message + Default + 'static>(mut buf: impl Buf) -> Result<T, Status> {
    if rules::<T>().is_some() && buf.chunk().len() < buf.remaining() {
        // Not contiguous (tonic's buffers are, the data plane's slices
        // are): check a contiguous copy rather than skip the check.
        let whole = buf.copy_to_bytes(buf.remaining());
        return decode::<T>(whole);
    }
    check::<T>(buf.chunk())?;
    let mut msg = T::default();
    reserve(&mut msg, buf.chunk());
    msg.merge(&mut buf)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(msg)
}

/// Reserves a Lookup's token list before decoding: as many elements as the
/// encoded message has final varint bytes in its token field.
fn reserve<T: 'static>(msg: &mut T, buf: &[u8]) {
    let m = msg as &mut dyn Any;
    if let Some(l) = m.downcast_mut::<v1::LookupRequest>() {
        l.tokens.reserve_exact(packed_len(buf, 3));
    } else if let Some(l) = m.downcast_mut::<kvstore::LookupRequest>() {
        l.tokens.reserve_exact(packed_len(buf, 5));
    }
}

/// Elements of packed varint field `field` at the top level of `buf`.
fn packed_len(buf: &[u8], field: u32) -> usize {
    (Fields { buf, at: 0 })
        .filter(|&(f, wire_type, _)| f == field && wire_type == 2)
        .map(|(_, _, run)| varints(run))
        .sum::<usize>()
        .min(MAX_TOKENS_PER_REQUEST)
}

/// `tonic_prost::ProstCodec` with [`decode`]'s limits on the way in.
#[derive(Debug, Clone)]
pub struct BoundedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(PhantomData)
    }
}

/// The decoder of [`BoundedCodec`].
#[derive(Debug, Clone)]
pub struct BoundedDecoder<U>(PhantomData<U>);

impl<U: Message + Default + 'static> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode(buf).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(tokens: usize, keys: usize) -> Vec<u8> {
        v1::LookupRequest {
            namespace: "n".into(),
            tokens: vec![7; tokens],
            keys: vec![bytes::Bytes::from_static(b"k"); keys],
            block_size: 16,
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn lists_over_their_limit_are_refused_before_decoding() {
        for (bytes, what) in [
            (lookup(MAX_TOKENS_PER_REQUEST + 1, 0), "tokens"),
            (lookup(0, MAX_KEYS_PER_REQUEST + 1), "keys"),
        ] {
            let e = check::<v1::LookupRequest>(&bytes).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains(what), "{e:?}");
            assert!(decode::<v1::LookupRequest>(&bytes[..]).is_err());
        }
        let at = lookup(MAX_TOKENS_PER_REQUEST, MAX_KEYS_PER_REQUEST);
        let d = decode::<v1::LookupRequest>(&at[..]).unwrap();
        assert_eq!(
            (d.tokens.len(), d.keys.len()),
            (MAX_TOKENS_PER_REQUEST, MAX_KEYS_PER_REQUEST)
        );
        // Reserved exactly: no doubling.
        assert_eq!(d.tokens.capacity(), MAX_TOKENS_PER_REQUEST);
    }

    #[test]
    fn unpacked_and_nested_lists_count_too() {
        // Tokens sent one tag each (legal protobuf, not what prost writes).
        let mut unpacked = Vec::new();
        for _ in 0..=MAX_TOKENS_PER_CHUNK {
            prost::encoding::uint64::encode(5, &1, &mut unpacked);
        }
        let mut write = Vec::new();
        prost::encoding::bytes::encode(3, &unpacked, &mut write);
        let e = check::<kvstore::WriteRequest>(&write).unwrap_err();
        assert!(e.message().contains("tokens"), "{e:?}");
        let read = v1::WireReadRequest {
            request: Some(v1::ReadRequest {
                namespace: "n".into(),
                keys: vec![bytes::Bytes::from_static(b"k"); MAX_KEYS_PER_REQUEST + 1],
                lease_id: 0,
            }),
            ..Default::default()
        }
        .encode_to_vec();
        assert!(check::<v1::WireReadRequest>(&read).is_err());
    }

    #[test]
    fn malformed_input_is_refused_before_decoding() {
        for bad in [
            &[0xff_u8; 12][..],
            &[0x1a, 0xff, 0xff, 0xff, 0x0f, 1][..],
            &[0x0a][..],
            &[0x00, 0x00][..], // field number 0
        ] {
            let e = check::<v1::LookupRequest>(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("malformed"), "{e:?}");
            assert!(decode::<v1::LookupRequest>(bad).is_err());
        }
        // Types without rules decode as prost does.
        let s = v1::StatsRequest {}.encode_to_vec();
        assert!(decode::<v1::StatsRequest>(&s[..]).is_ok());
    }

    /// An empty group (field 15) followed by `n` empty blocks: prost skips
    /// the unknown group and decodes every block after it.
    fn write_after_group(n: usize) -> Vec<u8> {
        let mut b = vec![0x7b, 0x7c];
        for _ in 0..n {
            b.extend_from_slice(&[0x12, 0x00]);
        }
        b
    }

    #[test]
    fn a_group_does_not_hide_the_fields_after_it() {
        let n = MAX_KEYS_PER_REQUEST + 1;
        let bytes = write_after_group(n);
        // What the check guards against: prost decodes all of them.
        let mut raw = v1::WriteRequest::default();
        raw.merge(&bytes[..]).unwrap();
        assert_eq!(raw.blocks.len(), n);
        let e = check::<v1::WriteRequest>(&bytes).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("groups"), "{e:?}");
        assert!(decode::<v1::WriteRequest>(&bytes[..]).is_err());
        // A group is refused even where the rest is within its limits.
        assert!(check::<v1::WriteRequest>(&write_after_group(1)).is_err());
    }

    #[test]
    fn repeated_occurrences_of_a_sub_message_count_together() {
        // Two `request` fields of a WireReadRequest, each at the limit:
        // prost merges them into one request of twice the limit.
        let half = v1::ReadRequest {
            namespace: "n".into(),
            keys: vec![bytes::Bytes::from_static(b"k"); MAX_KEYS_PER_REQUEST],
            lease_id: 0,
        }
        .encode_to_vec();
        let mut twice = Vec::new();
        prost::encoding::bytes::encode(1, &half, &mut twice);
        prost::encoding::bytes::encode(1, &half, &mut twice);
        let merged = v1::WireReadRequest::decode(&twice[..]).unwrap();
        assert_eq!(merged.request.unwrap().keys.len(), 2 * MAX_KEYS_PER_REQUEST);
        let e = check::<v1::WireReadRequest>(&twice).unwrap_err();
        assert!(e.message().contains("keys"), "{e:?}");
        // One occurrence at the limit passes.
        let mut once = Vec::new();
        prost::encoding::bytes::encode(1, &half, &mut once);
        assert!(check::<v1::WireReadRequest>(&once).is_ok());
        // The seed's chunk, the same way.
        let tokens = v1_tokens(MAX_TOKENS_PER_CHUNK);
        let mut chunk = Vec::new();
        prost::encoding::bytes::encode(5, &tokens, &mut chunk);
        let mut write = Vec::new();
        prost::encoding::bytes::encode(3, &chunk, &mut write);
        assert!(check::<kvstore::WriteRequest>(&write).is_ok());
        prost::encoding::bytes::encode(3, &chunk, &mut write);
        let e = check::<kvstore::WriteRequest>(&write).unwrap_err();
        assert!(e.message().contains("tokens"), "{e:?}");
    }

    /// A packed run of `n` one-byte varints.
    fn v1_tokens(n: usize) -> Vec<u8> {
        vec![1; n]
    }

    #[test]
    fn a_split_buffer_is_checked_too() {
        let bytes = write_after_group(3);
        let split = (&bytes[..3]).chain(&bytes[3..]);
        assert!(decode::<v1::WriteRequest>(split).is_err());
        let ok = v1::WriteRequest {
            namespace: "n".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let split = (&ok[..2]).chain(&ok[2..]);
        assert_eq!(decode::<v1::WriteRequest>(split).unwrap().namespace, "n");
    }
}
