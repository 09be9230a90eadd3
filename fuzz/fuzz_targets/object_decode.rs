//! Fuzzes the object store's object decoder: arbitrary bytes fetched for a
//! block are that block, whole and checksummed, or an error (see
//! kvtier_server::fuzzing::object_decode).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvtier_server::fuzzing::object_decode(data);
});
