//! Fuzzes the object store's object decoder: arbitrary bytes fetched for a
//! block are that block, whole and checksummed, or an error.
#![no_main]
use kvtier_core::{BlockId, Key, Namespace};
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let id = BlockId::new(Namespace::new("fuzz/ns").unwrap(), Key::new(b"k".to_vec()).unwrap());
    if let Ok(b) = kvtier_object::decode_object(&id, "fuzz", bytes::Bytes::copy_from_slice(data)) {
        assert_eq!(b.meta.id, id);
        b.verify().expect("a decoded object verifies");
    }
});
