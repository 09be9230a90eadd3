//! Fuzzes the disk record header decoder (also the object store's objects).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kvtier_core::disk::format::decode_header(data);
});
