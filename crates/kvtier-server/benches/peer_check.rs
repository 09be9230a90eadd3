//! What the same-host peer checks (`kvtier_server::peer`, docs/security.md,
//! "The same-host socket") cost a load, against the copy they guard:
//! `check_quick` runs before each block's copy, `check` before and after
//! each request's copies. The baseline in the same run is one single-thread
//! copy of a 4 MiB and of a 1.2 MB block (notes/060-same-host-fixes).
//!
//!     cargo bench -p kvtier-server --bench peer_check
#![allow(missing_docs)] // criterion_group! generates undocumented items
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvtier_server::peer::Peer;
use std::hint::black_box;

fn checks(c: &mut Criterion) {
    // A socketpair's peer is this process: the checks read its /proc entry
    // as they would an engine's.
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let peer = Peer::pin(&a).expect("pinned");
    let mut g = c.benchmark_group("peer");
    g.throughput(Throughput::Elements(1));
    g.bench_function("check_quick", |b| {
        b.iter(|| black_box(peer.check_quick()).unwrap())
    });
    g.bench_function("check", |b| b.iter(|| black_box(peer.check()).unwrap()));
    g.finish();
    let mut g = c.benchmark_group("copy");
    for (name, len) in [("4MiB", 4usize << 20), ("1.2MB", 1_200_000)] {
        let src = vec![7u8; len];
        let mut dst = vec![1u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, checks);
criterion_main!(benches);
