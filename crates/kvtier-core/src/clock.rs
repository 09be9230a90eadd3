//! The wall clock blocks and leases are stamped with. Expiry times travel in
//! block metadata, disk records and across nodes, so they are Unix
//! milliseconds, not process-local instants.
use std::time::{SystemTime, UNIX_EPOCH};

/// Current Unix time in milliseconds (0 if the clock reads before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
