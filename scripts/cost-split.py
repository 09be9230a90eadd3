#!/usr/bin/env python3
"""Splits the c=1 gap between kvtier and Redis into a fixed per-request part
and a per-byte part (notes/027), under notes/013's comparison rules.

At c=1 a closed loop does one request at a time, so the time per request is
1 / ops/s. Measured at two value sizes (4 KiB and 1.2 MB), the difference in
time per request between kvtier and Redis's best number (the better of the
bench's client and redis-benchmark) splits into:

  fixed     = gap at 4 KiB (framing, syscalls, wake-ups, the engine's index)
  per block = gap at 1.2 MB - gap at 4 KiB (what the extra bytes cost)

and the per-block part is set against what kvtier does per byte that Redis
does not: CRC32C, measured in the same run by the engine's criterion
baseline (`baseline/crc32c_1.2MB`, the crc32c crate the product ships, with
`baseline/memcpy_1.2MB` beside it, and `baseline/crc32c_folded_1.2MB`, the
same CRC by SIMD carry-less-multiply folding (crc-fast), to show whether
that alternative would be cheaper on this CPU).
A write computes it twice in series (the client before sending, the server
while receiving, to verify before acknowledging); a read once (the client
verifies what arrives; the memory tier serves stored bytes unchecked).

Placement as scripts/bench-data-plane.sh: kvtier serve and redis-server on
SERVER_CPU, generators on GEN_CPU, one system under load at a time; every
system on the machine's congestion control. Each (workload, size) is one
`kvtier bench` run with --repeat alternating kvtier and Redis.

--ablate-crc measures the CRC32C share directly instead of inferring it:
it also builds kvtier against a stand-in `crc32c` crate whose functions
return 0 (`cargo build --config patch.crates-io.crc32c.path=…`; the
checkout's Cargo.lock and binary are put back afterwards), and runs
the 1.2 MB comparisons again with that binary as server and client, so
every CRC32C pass of the request path is gone and nothing else. The
binary is a measurement instrument only: it checks nothing.

usage: python3 scripts/cost-split.py [--repeat 5] [--duration 3s]
       [--ablate-crc] [--out notes/027-cost-split.json] [--work out/027-cost-split]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _perf import ROOT

from perf import header, versions, write_record
from perf.services import Server, kvtier_server

BIN = ROOT / "target/release/kvtier"
SIZES = [4096, 1_258_291]
# CRC32C passes over the payload per request that Redis does not make.
CRC_PASSES = {"write": 2, "read": 1}


def start_server(cpu: str, binary: Path = BIN) -> Server:
    """A fresh server started on `cpu`, so its runtime sizes itself to it."""
    return kvtier_server(binary, ["--data-listen", "auto", "--memory-capacity", "2GiB"],
                         cpus={int(c) for c in cpu.split(",")})


def bench(workload: str, size: int, a: argparse.Namespace, binary: Path = BIN, tag: str = "") -> dict:
    out = Path(a.work) / f"{workload}-{size}{tag}"
    srv = start_server(a.server_cpu, binary)
    try:
        subprocess.run(["taskset", "-c", a.gen_cpu, str(binary), "bench", "--target", f"grpc://{srv.grpc}",
                        "--workload", workload, "--value-size", str(size), "--concurrency", "1",
                        "--duration", a.duration, "--warmup", "1s", "--repeat", str(a.repeat),
                        "--peer", "redis://spawn", "--peer-tool", "--peer-cpus", a.server_cpu,
                        "--quiet", "--out", str(out)], check=True)
    finally:
        srv.stop()
    rec = json.loads((out / "record.json").read_text())
    row = next(r for r in rec["analysis"]["comparison"] if r["step"] == "c=1" and r["op"] == workload)
    if row["excluded"] or not row["kvtier_ops_s"] or not row["peer_best_ops_s"]:
        # Rule 3: a saturated generator or a failed side gives no usable time per request.
        raise SystemExit(f"{workload} at {size} B has no comparable numbers: {row['excluded'] or row}")
    return {
        "workload": workload, "value_size": size,
        "kvtier_ops_s": row["kvtier_ops_s"], "kvtier_repeats_ops_s": row["kvtier_repeats_ops_s"],
        "peer": row["peer"], "peer_best_ops_s": row["peer_best_ops_s"], "peer_best_source": row["peer_best_source"],
        "peer_client_repeats_ops_s": row["peer_client_repeats_ops_s"], "peer_tool_ops_s": row["peer_tool_ops_s"],
        "excluded": row["excluded"], "outliers": row["outliers"],
        "kvtier_us_per_request": 1e6 / row["kvtier_ops_s"],
        "peer_us_per_request": 1e6 / row["peer_best_ops_s"],
        "network": rec.get("network"),
    }


# The stand-in crate: the two functions the workspace calls, computing nothing.
NULL_CRC32C = {
    "Cargo.toml": '[package]\nname = "crc32c"\nversion = "{version}"\nedition = "2021"\n\n[lib]\npath = "lib.rs"\n',
    "lib.rs": "//! Measurement stand-in for crc32c (scripts/cost-split.py --ablate-crc): no checksum.\n"
              "pub fn crc32c(_: &[u8]) -> u32 { 0 }\n"
              "pub fn crc32c_append(crc: u32, _: &[u8]) -> u32 { crc }\n",
}


MEMO_CRC32C = """
/// Measurement stand-in (scripts/cpu-split.py --client-crc-free, notes/036):
/// the one-shot checksum of the buffer this thread checksummed last, at the
/// same address and length, is returned without being computed again.
/// `kvtier bench` writes one payload buffer over and over, so its client's
/// checksum before each write costs nothing; the receivers' checksums as the
/// bytes arrive (`crc32c_append`, chunk by chunk) are computed as shipped.
/// Only valid where a buffer is never changed in place: a measuring
/// instrument, not a product.
pub fn crc32c(data: &[u8]) -> u32 {
    thread_local!(static LAST: core::cell::Cell<(usize, usize, u32)> = core::cell::Cell::new((0, 0, 0)));
    LAST.with(|last| {
        let (ptr, len, crc) = last.get();
        if ptr == data.as_ptr() as usize && len == data.len() && len > 0 {
            return crc;
        }
        let crc = crc32c_append(0, data);
        last.set((data.as_ptr() as usize, data.len(), crc));
        crc
    })
}
"""


def crc32c_version() -> str:
    return (ROOT / "Cargo.lock").read_text().split('name = "crc32c"\nversion = "', 1)[1].split('"', 1)[0]


def stand_in_crate(work: Path, variant: str) -> Path:
    """The crc32c crate a measuring build is patched with: `null` computes
    nothing; `client-write-free` is the real crate (from cargo's registry
    cache) with MEMO_CRC32C's `crc32c`."""
    version = crc32c_version()
    crate = (work / f"crc32c-{variant}").resolve()
    shutil.rmtree(crate, ignore_errors=True)
    if variant == "null":
        crate.mkdir(parents=True)
        for name, text in NULL_CRC32C.items():
            (crate / name).write_text(text.replace("{version}", version))
        return crate
    assert variant == "client-write-free", variant
    registry = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "registry/src"
    sources = sorted(registry.glob(f"*/crc32c-{version}"))
    if not sources:
        sys.exit(f"crc32c {version}'s source is not in {registry}: run `cargo fetch` first")
    shutil.copytree(sources[0], crate)
    lib = crate / "src/lib.rs"
    text = lib.read_text()
    one_shot = "#[inline]\npub fn crc32c(data: &[u8]) -> u32 {\n    crc32c_append(0, data)\n}\n"
    assert one_shot in text, f"crc32c {version}'s crc32c() is not the one this script replaces"
    lib.write_text(text.replace(one_shot, MEMO_CRC32C))
    return crate


def build_with_crc32c(work: Path, variant: str) -> Path:
    """kvtier built against a stand-in crc32c crate (`stand_in_crate`);
    returns the binary's path under `work`."""
    lock_file = ROOT / "Cargo.lock"
    lock = lock_file.read_text()
    crate = stand_in_crate(work, variant)
    # Patched from the command line: the crates that use crc32c get builds of
    # their own beside the normal ones (their dependency differs), so nothing
    # of the normal build is replaced but the binary's final copy, and
    # Cargo.lock, which the patch rewrites: both are put back.
    ours = work / "kvtier-with-crc"
    shutil.copy2(BIN, ours)
    binary = work / f"kvtier-crc32c-{variant}"
    try:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier",
                        "--config", f'patch.crates-io.crc32c.path="{crate}"'], cwd=ROOT, check=True)
        shutil.copy2(BIN, binary)
    finally:
        lock_file.write_text(lock)
        # Cargo hardlinks target/release/kvtier to its build output: replace
        # the link, never write through it into the stand-in build's file.
        BIN.unlink(missing_ok=True)
        shutil.copy2(ours, BIN)
    print(f"built {binary}: crc32c stand-in {variant}", flush=True)
    return binary


def build_without_crc(work: Path) -> Path:
    """kvtier built with every CRC32C computing nothing (see the module
    docstring); returns the binary's path under `work`."""
    return build_with_crc32c(work, "null")


def baselines(a: argparse.Namespace) -> dict:
    """The engine's criterion baselines (crc32c and memcpy of 1.2 MB), pinned
    to the server's CPU, from their own estimates."""
    subprocess.run(["taskset", "-c", a.server_cpu, "cargo", "bench", "-q", "-p", "kvtier-core", "--bench", "engine",
                    "--", "--noplot", "baseline/"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    out = {}
    for name in ("crc32c_1.2MB", "crc32c_1.2MB_uncached", "crc32c_folded_1.2MB", "memcpy_1.2MB"):
        est = json.loads((ROOT / "target/criterion/baseline" / name / "new/estimates.json").read_text())
        out[name] = {"median_us": est["median"]["point_estimate"] / 1000,
                     "bytes": 1_200_000}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--duration", default="3s")
    ap.add_argument("--server-cpu", default="1")
    ap.add_argument("--gen-cpu", default="0")
    ap.add_argument("--out", default=str(ROOT / "notes/027-cost-split.json"))
    ap.add_argument("--work", default=str(ROOT / "out/027-cost-split"))
    ap.add_argument("--ablate-crc", action="store_true",
                    help="also measure the 1.2 MB rows with a kvtier built without CRC32C")
    a = ap.parse_args()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    head = header(versions=versions("redis-server", "redis-benchmark"))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "kvtier"], cwd=ROOT, check=True)
    head["versions"].update(versions("kvtier", paths={"kvtier": BIN}))
    no_crc = build_without_crc(Path(a.work)) if a.ablate_crc else None
    base = baselines(a)
    # crc32c per byte, scaled to each size.
    crc_us_per_byte = base["crc32c_1.2MB"]["median_us"] / base["crc32c_1.2MB"]["bytes"]
    rows = [bench(w, s, a) for w in ("write", "read") for s in SIZES]
    for r in rows:
        print(json.dumps({k: r[k] for k in ("workload", "value_size", "kvtier_ops_s", "peer_best_ops_s")}), flush=True)
    # The same 1.2 MB comparisons with the CRC32C passes removed (each against
    # its own Redis repeats, alternating in the same bench run).
    ablated = [bench(w, SIZES[1], a, no_crc, "-no-crc") for w in ("write", "read")] if no_crc else []
    split = {}
    for w in ("write", "read"):
        small, big = (next(r for r in rows if r["workload"] == w and r["value_size"] == s) for s in SIZES)
        gap_small = small["kvtier_us_per_request"] - small["peer_us_per_request"]
        gap_big = big["kvtier_us_per_request"] - big["peer_us_per_request"]
        crc_us = CRC_PASSES[w] * crc_us_per_byte * (SIZES[1] - SIZES[0])
        split[w] = {
            "gap_us_at_4KiB (fixed)": gap_small,
            "gap_us_at_1.2MB": gap_big,
            "per_block_gap_us": gap_big - gap_small,
            "crc32c_passes": CRC_PASSES[w],
            "crc32c_us_for_the_extra_bytes": crc_us,
            "per_block_gap_left_after_crc32c_us": gap_big - gap_small - crc_us,
            "ratio_at_1.2MB": big["kvtier_ops_s"] / big["peer_best_ops_s"],
            "ratio_at_1.2MB_without_crc32c": 1e6 / (big["kvtier_us_per_request"] - crc_us) / big["peer_best_ops_s"],
        }
        abl = next((r for r in ablated if r["workload"] == w), None)
        if abl:
            split[w]["measured_without_crc32c"] = {
                "ratio_at_1.2MB": abl["kvtier_ops_s"] / abl["peer_best_ops_s"],
                "kvtier_us_per_request": abl["kvtier_us_per_request"],
                "peer_us_per_request": abl["peer_us_per_request"],
                "crc32c_us_per_request_measured": big["kvtier_us_per_request"] - abl["kvtier_us_per_request"],
            }
    write_record(a.out, {
        "baselines": base,
        "rows": rows,
        "rows_without_crc32c": ablated,
        "split": split,
        "medians_note": "ops/s are medians of the repeats; the peer's is the better of the bench's client and redis-benchmark",
    }, head)
    print(json.dumps(split, indent=1))


if __name__ == "__main__":
    main()
