#!/usr/bin/env python3
"""A soak with a fault schedule: several clients send mixed lookups, reads
and writes to one kvtier server (memory + disk + MinIO, every tier
write-through, ``disk.sync = "always"``) for ``--duration`` seconds, while a
seeded schedule kills and restarts the server, stops and resumes the object
store, fills the disk, partitions the server from its store and stalls a
client mid-body. Then it restarts the server one last time and reads back
every key it wrote.

    python3 scripts/soak.py --duration 1200 --seed 1 --out out/soak

Writes ``OUT/soak.json`` (a perf record) and exits non-zero if an
acknowledged write was lost, corrupt bytes were served, the server's RSS
passed its bound, descriptors leaked, a request hung, a stalled upload was
not cut off or a scheduled fault did not happen. Runs as root (it mounts a
tmpfs); needs MinIO where ``make setup-test`` puts it; builds
target/release/kvtier if it is missing. docs/durability.md, "A soak with
faults", says what each fault does and why the bounds are what they are.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _perf import ROOT

from kvtier import Block, Client
from perf import header, rss_mib, versions, write_record
from perf.services import Minio, minio_binary, release_binary
from perf.soak.checker import Ledger, digest
from perf.soak.rig import FD_SLACK, Rig, count_fds, inject
from perf.soak.schedule import FAULT_KINDS, Fault, Window, plan, summarize_window, warmup_s

NS = "soak"
CLIENTS = 4
OPS_PER_CLIENT_S = 10.0
WEIGHTS = {"lookup": 0.35, "read": 0.35, "write": 0.30}
BLOCK_MIN, BLOCK_MAX = 4 << 10, 32 << 10
#: Client deadline per call, retries included.
DEADLINE_S = 5.0
#: A call that returns later than its deadline plus this counts as a deadline error, whatever it returned.
DEADLINE_SLACK_S = 0.5
#: A call still running this long past its deadline is hung.
HANG_GRACE_S = 10.0


class Load:
    """The clients: paced ops, timed from when each was scheduled (a call
    that falls behind by more than a deadline drops the missed slots and
    counts them)."""

    def __init__(self, addr: str, seed: int, ledger: Ledger, t0: float):
        self.addr, self.seed, self.ledger, self.t0 = addr, seed, ledger, t0
        self.ops: list[tuple[float, float, str, str]] = []
        self.codes: dict[str, int] = {}
        self.chains: list[list[bytes]] = []
        self.inflight: dict[int, tuple[str, float]] = {}
        #: (scheduled time, slots) a client dropped because it was behind by more than a deadline.
        self.skips: list[tuple[float, int]] = []
        #: Reads the client refused as corrupt (its CRC32C check: DATA_LOSS): served corrupt, caught.
        self.data_loss_reads = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"client-{i}", daemon=True)
                        for i in range(CLIENTS)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _pick_chain(self, rng: random.Random) -> list[bytes] | None:
        with self.lock:
            if not self.chains:
                return None
            lo = max(0, len(self.chains) - 500) if rng.random() < 0.5 else 0  # hot half, cold half
            return self.chains[rng.randrange(lo, len(self.chains))]

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        client = Client(self.addr, connections=2, timeout=DEADLINE_S)
        interval = 1.0 / OPS_PER_CLIENT_S
        sched = time.monotonic()
        try:
            while not self.stop.is_set():
                sched += interval
                now = time.monotonic()
                if now < sched:
                    time.sleep(sched - now)
                elif now - sched > DEADLINE_S:
                    with self.lock:
                        self.skips.append((sched - self.t0, int((now - sched) / interval)))
                    sched = now
                op = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
                started = time.monotonic()
                self.inflight[i] = (op, started)
                outcome = self._op(client, rng, op)
                done = time.monotonic()
                self.inflight.pop(i, None)
                if done - started > DEADLINE_S + DEADLINE_SLACK_S:  # answered, but past its deadline
                    outcome = "deadline"
                with self.lock:
                    self.ops.append((sched - self.t0, done - sched, op, outcome))
        finally:
            client.close()

    def _op(self, client: Client, rng: random.Random, op: str) -> str:
        chain = self._pick_chain(rng) if op != "write" else None
        if op != "write" and chain is None:
            op, chain = "write", None
        try:
            if op == "write":
                keys = [rng.randbytes(32) for _ in range(rng.randint(1, 4))]
                blocks = []
                for j, k in enumerate(keys):
                    payload = rng.randbytes(rng.randint(BLOCK_MIN, BLOCK_MAX))
                    self.ledger.attempt(k, digest(payload))
                    blocks.append(Block(k, payload, parent=keys[j - 1] if j else None))
                client.write(NS, blocks)
                for k in keys:
                    self.ledger.acknowledge(k)
                with self.lock:
                    self.chains.append(keys)
                return "ok"
            assert chain is not None
            if op == "lookup":
                return "ok" if client.lookup(NS, keys=chain).found == len(chain) else "miss"
            r = client.read(NS, chain)
            for b in r.blocks:
                self.ledger.served(b.key, digest(bytes(b.payload) if not isinstance(b.payload, list)
                                                 else b"".join(bytes(p) for p in b.payload)))
            return "ok" if len(r.blocks) == len(chain) else "miss"
        except Exception as e:  # noqa: BLE001 (every failure is counted in its window, by code)
            code = getattr(getattr(e, "code", None), "name", None) or type(e).__name__
            with self.lock:
                self.codes[code] = self.codes.get(code, 0) + 1
                if code == "DATA_LOSS" and op == "read":
                    self.data_loss_reads += 1
            if code == "DEADLINE_EXCEEDED":
                return "deadline"
            return "refused" if code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "INTERNAL", "DATA_LOSS") else "error"

    def hung(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"client": i, "op": op, "running_s": round(now - t, 1)}
                for i, (op, t) in list(self.inflight.items()) if now - t > DEADLINE_S + HANG_GRACE_S]


def verify(addr: str, ledger: Ledger) -> dict[str, Any]:
    """Reads every key ever attempted from the restarted server; the verdict."""
    keys = ledger.attempted_keys()
    results: list[tuple[bytes, bytes | None]] = []
    errors = failed = 0
    lock = threading.Lock()
    parts = [keys[i::4] for i in range(4)]

    def read(c: Client, batch: list[bytes]) -> Any:
        nonlocal errors
        for _ in range(3):
            try:
                return c.read(NS, batch)
            except Exception:  # noqa: BLE001 (retried, then its keys count as not returned)
                with lock:
                    errors += 1
                time.sleep(1)
        return None

    def run(part: list[bytes]) -> None:
        nonlocal failed
        with Client(addr, connections=1, timeout=30.0) as c:
            i = 0
            while i < len(part):
                batch = part[i:i + 32]
                r = read(c, batch)
                if r is None:
                    with lock:
                        failed += 1
                    i += len(batch)
                    continue
                got = [(b.key, digest(bytes(b.payload))) for b in r.blocks]
                with lock:
                    results.extend(got)
                    if len(got) < len(batch):  # the read stops at a missing key: note it, go on after it
                        results.append((batch[len(got)], None))
                i += len(got) + (1 if len(got) < len(batch) else 0)

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    v = ledger.final(results)
    return {"verdict": v, "keys_read": len(results), "read_errors": errors, "failed_batches": failed,
            "seconds": round(time.monotonic() - t0, 1)}


def find_binary(build: bool) -> Path:
    exe = release_binary()
    if build or not exe.is_file():
        print("cargo build --release -p kvtier", flush=True)
        subprocess.run(["cargo", "build", "--release", "-p", "kvtier"], cwd=ROOT, check=True)
    return exe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1200.0, help="seconds of load (default 1200)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "soak")
    ap.add_argument("--build", action="store_true", help="run cargo build --release even if the binary exists")
    a = ap.parse_args()
    faults = plan(a.duration, a.seed)
    binary = find_binary(a.build)
    a.out.mkdir(parents=True, exist_ok=True)
    head_versions = versions("kvtier", "minio", paths={"kvtier": binary, "minio": minio_binary()})
    work = Path(tempfile.mkdtemp(prefix="kvtier-soak-"))
    # A SIGTERM (a test's timeout) unwinds like ^C, so the finally below stops
    # what was started and unmounts the tmpfs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        rig = Rig(binary, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        return run(a, faults, rig, head_versions)
    finally:
        (a.out / "server.log").write_text(rig.server.stderr_text()[-200_000:])
        rig.close()
        shutil.rmtree(work, ignore_errors=True)


def run(a: argparse.Namespace, faults: list[Fault], rig: Rig, head_versions: dict[str, str | None]) -> int:
    ledger = Ledger()
    t0 = time.monotonic()
    load = Load(rig.server.grpc, a.seed, ledger, t0)
    windows = [Window("baseline-0", "baseline", 0.0)]
    rss = {"max": 0.0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.2):
            try:
                pid = rig.server.pid
                r, n = rss_mib(pid), count_fds(pid)
            except (OSError, ValueError):
                continue
            life = rig.lifetimes[-1]
            rss["max"] = max(rss["max"], r)
            life["rss_max_mib"] = round(max(life["rss_max_mib"], r), 1)
            life["fds_max"] = max(life["fds_max"], n)

    threading.Thread(target=sample, name="rss", daemon=True).start()
    load.start()
    print(f"soak: {a.duration:g} s, seed {a.seed}, {len(faults)} faults: "
          + ", ".join(f"{f.kind}@{f.start_s:.0f}" for f in faults), flush=True)
    time.sleep(warmup_s(a.duration) * 0.8)
    rig.measure_fds(end=False)
    fault_log = []
    for f in faults:
        time.sleep(max(0.0, t0 + f.start_s - time.monotonic()))
        windows[-1].end_s = time.monotonic() - t0
        windows.append(Window(f"fault-{f.index}", f.kind, time.monotonic() - t0))
        info = inject(rig, f, t0 + f.start_s + f.length_s)
        windows[-1].end_s = time.monotonic() - t0
        windows.append(Window(f"baseline-{f.index}", "baseline", time.monotonic() - t0))
        if f.kind == "kill_restart":
            rig.measure_fds(end=False)  # the new process, once its clients are back (fault's end)
        fault_log.append({**f.as_dict(), "healed_at_s": round(windows[-1].start_s, 3), **info})
        print(f"  {time.monotonic() - t0:7.1f} s  {f.kind} healed", flush=True)
    time.sleep(max(0.0, t0 + a.duration - time.monotonic()))
    windows[-1].end_s = time.monotonic() - t0
    rig.measure_fds(end=True, why="end of load")
    load.stop.set()
    for t in load.threads:
        t.join(timeout=DEADLINE_S + HANG_GRACE_S)
    hung = load.hung()
    sampling.set()
    # The last restart: a SIGKILL, so nothing is flushed on the way out.
    os.kill(rig.server.pid, signal.SIGKILL)
    rig.server.stop()
    rig.server = rig._start()
    rig.lifetimes[-1]["ended_by"] = "verification only"
    bound, bound_source = rig.resident_limit_mib()
    check = verify(rig.server.grpc, ledger)
    v = check.pop("verdict")
    rows = []
    ops = sorted(load.ops)
    for w in windows:
        end = w.end_s if w.end_s is not None else float("inf")
        row = summarize_window(w, [o for o in ops if w.start_s <= o[0] < end])
        row["skipped_slots"] = sum(n for t, n in load.skips if w.start_s <= t < end)
        rows.append(row)
    measured = [life for life in rig.lifetimes if life["fds_start"] is not None and life["fds_end"] is not None]
    for life in rig.lifetimes:
        t_start, t_end = life.pop("_t_start", None), life.pop("_t_end", None)
        life["measured_over_s"] = round(t_end - t_start, 1) if t_start and t_end else None
    failures = []
    if v.lost:
        failures.append(f"{v.lost} acknowledged keys lost")
    if v.corrupt:
        failures.append(f"{v.corrupt} corrupt reads")
    if load.data_loss_reads:
        failures.append(f"{load.data_loss_reads} reads served bytes that failed their checksum")
    if check["failed_batches"]:
        failures.append(f"{check['failed_batches']} verification reads failed 3 times (their keys count as lost)")
    if rss["max"] > bound:
        failures.append(f"RSS {rss['max']:.1f} MiB over its bound {bound:.1f} MiB")
    for life in measured:
        if life["fds_end"] - life["fds_start"] > FD_SLACK:
            failures.append(f"pid {life['pid']}: fds {life['fds_start']} -> {life['fds_end']} (> {FD_SLACK} more)")
    if hung:
        failures.append(f"{len(hung)} requests hung")
    missing = sorted(set(FAULT_KINDS) - {f["kind"] for f in fault_log})
    if missing:
        failures.append(f"fault kinds never injected: {missing}")
    stalls = [s for f in fault_log for s in f.get("stalls", [])]
    uncut = [s for s in stalls if s["sent"] == s["length"] // 2 and s["closed_after_s"] is None]
    if uncut:
        failures.append(f"{len(uncut)} stalled uploads not closed within read_timeout + 6 s")
    served_in_stall = sum(r["ops"] - r["errors"] for r in rows if r["kind"] == "stall_client")
    if not served_in_stall:
        failures.append("no request served while a client stalled")
    fields = {
        "title": "Soak with a fault schedule", "duration_s": a.duration, "seed": a.seed,
        "passed": not failures, "failures": failures,
        "acknowledged": v.acknowledged, "lost": v.lost, "corrupt": v.corrupt,
        "attempted": len(ledger.attempted_keys()), "unacknowledged_found": v.unacknowledged_found,
        "lost_keys": v.lost_keys, "corrupt_keys": v.corrupt_keys,
        "max_rss_mib": round(rss["max"], 1), "rss_bound_mib": round(bound, 1), "rss_bound_source": bound_source,
        "fds_start": None, "fds_end": None, "fd_slack": FD_SLACK,
        "fd_lifetimes": rig.lifetimes,
        "hung": len(hung), "hung_requests": hung, "skipped_slots": sum(n for _, n in load.skips),
        "data_loss_reads": load.data_loss_reads,
        "ops": len(ops), "errors_by_code": load.codes,
        "verification": check,
        "faults": fault_log, "windows": rows,
        "load": {"clients": CLIENTS, "ops_per_client_s": OPS_PER_CLIENT_S, "weights": WEIGHTS,
                 "block_bytes": [BLOCK_MIN, BLOCK_MAX], "blocks_per_write": [1, 4], "deadline_s": DEADLINE_S,
                 "hang_grace_s": HANG_GRACE_S},
        "server_config": rig.config.replace(Minio.password, "***"),
        "proxy": {"accepted": rig.store_proxy.accepted, "upstream_failures": rig.store_proxy.upstream_failures},
    }
    fields["fds_start"], fields["fds_end"] = _top_fds(measured)
    write_record(a.out / "soak.json", fields, header(versions=head_versions))
    print(f"soak: acknowledged {v.acknowledged}, lost {v.lost}, corrupt {v.corrupt}, max RSS {rss['max']:.1f} "
          f"of {bound:.1f} MiB, hung {len(hung)}: {'PASS' if not failures else 'FAIL: ' + '; '.join(failures)}",
          flush=True)
    return 0 if not failures else 1


def _top_fds(measured: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """The top-level pair: the lifetime that served the most load (the
    longest between its two measurements); every lifetime is in fd_lifetimes."""
    if not measured:
        return None, None
    life = max(measured, key=lambda x: x["measured_over_s"] or 0.0)
    return life["fds_start"], life["fds_end"]


if __name__ == "__main__":
    sys.exit(main())
