//! Fuzzes the request-decoding path of both gRPC APIs (see kvtier_server::fuzzing).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvtier_server::fuzzing::decode_and_validate(data);
});
