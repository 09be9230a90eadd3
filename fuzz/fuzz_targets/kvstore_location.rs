//! Fuzzes the kvstore protocol's `Read` location parser: any string either
//! names a data key (and is then exactly the location of that key) or is
//! refused (see kvtier_server::fuzzing::kvstore_location).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvtier_server::fuzzing::kvstore_location(data);
});
