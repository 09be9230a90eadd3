//! Fuzzes the data plane's connection loop: framing, Hello, Read, Write,
//! reservations and timeouts (see kvtier_server::fuzzing::data_plane_session).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvtier_server::fuzzing::data_plane_session(data);
});
