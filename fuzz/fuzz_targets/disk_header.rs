//! Fuzzes the disk record header decoder (also the object store's objects;
//! see kvtier_server::fuzzing::disk_header).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kvtier_server::fuzzing::disk_header(data);
});
