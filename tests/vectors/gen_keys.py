#!/usr/bin/env python3
"""Generates tests/vectors/keys.json from an implementation independent of the
Rust one (Python's xxhash and hashlib). Rust and the Python SDK must both
reproduce every case. Re-run only when adding cases; never edit expected keys by hand.

Key scheme (docs/keys.md):
  xxh3-64-v1: key[i] = xxh3_64(prev || tokens as u32 LE).to_bytes(8, "big"), prev = 8 zero bytes for block 0
  sha256-v1:  key[i] = sha256(prev || tokens as u32 LE), prev = 32 zero bytes for block 0
Only full blocks are hashed; trailing tokens are ignored.
A salted chain (case field "salt", UTF-8; "" = unsalted) starts from
  prev = sha256(b"kvtier-salt-v1\0" + salt)[:klen] instead of zeros.
"""
import hashlib
import json
import random
import struct
import sys

import xxhash


def chain(hash_name, tokens, block_size, salt=""):
    klen = {"xxh3-64-v1": 8, "sha256-v1": 32}[hash_name]
    prev = bytes(klen)
    if salt:
        prev = hashlib.sha256(b"kvtier-salt-v1\0" + salt.encode()).digest()[:klen]
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start:start + block_size]
        data = prev + struct.pack(f"<{len(block)}I", *block)
        if hash_name == "xxh3-64-v1":
            key = xxhash.xxh3_64_intdigest(data).to_bytes(8, "big")
        else:
            key = hashlib.sha256(data).digest()
        keys.append(key)
        prev = key
    return [k.hex() for k in keys]


def main():
    rng = random.Random(20261122)
    cases = []
    specs = [
        ("empty", [], 128),
        ("one-partial-block", list(range(100)), 128),
        ("one-block", list(range(128)), 128),
        ("two-blocks-plus-tail", list(range(300)), 128),
        ("block-size-16", [rng.randrange(0, 152064) for _ in range(64)], 16),
        ("block-size-1", [0, 1, 4294967295], 1),
        ("random-8-blocks", [rng.randrange(0, 2**32) for _ in range(128 * 8)], 128),
        ("block-size-256", [rng.randrange(0, 128256) for _ in range(600)], 256),
    ]
    salted = [
        ("salted-two-blocks-plus-tail", list(range(300)), 128, "acme-secret-salt"),
        ("salted-block-size-16", [rng.randrange(0, 152064) for _ in range(64)], 16, "another tenant"),
    ]
    for hash_name in ("xxh3-64-v1", "sha256-v1"):
        for name, toks, bs, salt in [(*s, "") for s in specs] + salted:
            cases.append({
                "name": f"{hash_name}/{name}",
                "hash": hash_name,
                "block_size": bs,
                "salt": salt,
                "tokens": toks,
                "keys": chain(hash_name, toks, bs, salt),
            })
    json.dump({"version": 1, "description": __doc__.strip().splitlines()[0], "cases": cases},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
