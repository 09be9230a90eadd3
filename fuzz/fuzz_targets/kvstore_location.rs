//! Fuzzes the kvstore protocol's `Read` location parser: any string either
//! names a data key (and is then exactly the location of that key) or is
//! refused.
#![no_main]
use kvtier_server::grpc::kvstore_records::{location, parse_location};
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(k) = parse_location(s)
    {
        assert_eq!(location(&k), s.to_ascii_lowercase());
    }
});
