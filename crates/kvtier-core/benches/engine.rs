//! Engine benchmarks (placeholder; see `make bench`).
fn main() {}
