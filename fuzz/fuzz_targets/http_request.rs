//! Fuzzes the HTTP API's paths, query strings and bodies through its router.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kvtier_server::fuzzing::http_request(data);
});
