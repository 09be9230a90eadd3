"""The per-tier lookup (docs/events.md, "Per-tier lookup") through every
client: gRPC via the Python client, HTTP ``POST /v1/lookup`` (and
``HttpClient.lookup``), and the CLI's ``kvtier lookup`` (the Rust client
core), against a real server whose blocks sit partly in memory, partly on
disk (write-back, a memory tier smaller than the chain). Blocks are 256 KiB."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest

from kvtier import Block, Client, HttpClient, Tier
from kvtier.server import Server

BS = 16
BLOCK = 256 << 10


@pytest.fixture
def tiered(kvtier_bin, tmp_path):
    s = Server.start(binary=kvtier_bin, args=["--disk-dir", str(tmp_path / "disk"), "--write-policy", "write-back",
                                              "--memory-capacity", "1MiB", "--kv-events-node", "node-1"])
    yield s
    assert s.stop() == 0


def _write_chain(c: Client, ns: str, n: int) -> tuple[list[int], list[bytes]]:
    toks = list(range(n * BS))
    keys = c.keys_for(toks)
    c.write(ns, [Block(key=k, payload=bytes([i]) * BLOCK, parent=keys[i - 1] if i else None, token_count=BS)
                 for i, k in enumerate(keys)])
    return toks, keys


def test_grpc_http_and_cli_report_each_tiers_share_of_the_prefix(tiered, kvtier_bin):
    ns = "acme/tiers"
    c = Client(tiered.grpc, block_size=BS)
    try:
        # Six blocks of 256 KiB in a 1 MiB memory tier (write-back): eviction takes the least
        # recently used leaf, so the chain's tail is demoted to disk and its head stays in memory.
        toks, keys = _write_chain(c, ns, 6)
        r = c.lookup(ns, tokens=toks)
        assert r.found == 6
        assert set(r.nodes) == {"node-1"}, r.nodes
        by_tier = {t.tier: (t.blocks, t.leading) for t in r.tier_counts}
        assert set(by_tier) == {Tier.MEMORY, Tier.DISK}, r.tier_counts
        assert sum(b for b, _ in by_tier.values()) == 6
        assert sum(lead for _, lead in by_tier.values()) == 6, "the node's leading run is the whole prefix"
        assert by_tier[Tier.MEMORY][0] == sum(t == Tier.MEMORY for t in r.tiers)

        h = HttpClient(tiered.http).lookup(ns, tokens=toks, block_size=BS)
        assert h["found_blocks"] == 6 and h["nodes"] == ["node-1"] * 6
        assert {(x["tier"], x["blocks"], x["leading"]) for x in h["tier_counts"]} == {
            (t.name.lower(), b, lead) for t, (b, lead) in by_tier.items()}
        assert HttpClient(tiered.http).lookup(ns, keys=keys)["found_blocks"] == 6

        out = subprocess.run([str(kvtier_bin), "lookup", "--server", f"http://{tiered.grpc}", "-n", ns, "--block-size", str(BS),
                              "--tokens", ",".join(map(str, toks))], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        j = json.loads(out.stdout)
        assert j["found"] == 6 and j["nodes"] == ["node-1"] * 6
        assert {(x["tier"], x["blocks"]) for x in j["tier_counts"]} == {
            (f"TIER_{t.name}", b) for t, (b, _) in by_tier.items()}
    finally:
        c.close()


def test_a_bad_http_lookup_gets_a_400_that_says_why(tiered):
    def post(body: bytes) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://{tiered.http}/v1/lookup", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            with e:
                return e.code, json.loads(e.read())

    code, body = post(b'{"namespace": "a", "tokens": [1], "keys": ["00"]}')
    assert code == 400 and "either keys or tokens" in body["error"]
    code, body = post(b'{"namespace": "a", "token": [1]}')
    assert code == 400 and "token" in body["error"], body
    code, body = post(b'{"namespace": "bad ns", "tokens": [1]}')
    assert code == 400, body
    code, body = post(b"not json")
    assert code == 400 and body["error"]
