"""The key scheme: every case of tests/vectors/keys.json, plus its edge cases."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier import keys
from kvtier._crc import crc32c, crc32c_pure

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "keys.json"
CASES = json.loads(VECTORS.read_text())["cases"]


def test_vector_file_has_cases():
    assert len(CASES) >= 16
    assert {c["hash"] for c in CASES} == set(keys.HASHES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vectors(case):
    salt = case.get("salt", "")
    got = keys.chain(case["tokens"], case["block_size"], case["hash"], salt=salt)
    assert [k.hex() for k in got] == case["keys"]
    assert all(len(k) == keys.key_len(case["hash"]) for k in got)
    # block_key step by step gives the same chain.
    prev = keys.seed(salt, case["hash"])
    bs = case["block_size"]
    for i, want in enumerate(case["keys"]):
        prev = keys.block_key(prev, case["tokens"][i * bs:(i + 1) * bs], case["hash"])
        assert prev.hex() == want


def test_defaults_and_iterables():
    toks = list(range(300))
    assert keys.chain(toks) == keys.chain(toks, 128, "xxh3-64-v1")
    assert keys.chain(iter(toks)) == keys.chain(toks)
    assert keys.chain(toks, hash="") == keys.chain(toks)  # empty = default, as on the wire
    assert len(keys.chain(toks)) == 2  # trailing 44 tokens ignored


def test_salt_changes_every_key_and_empty_salt_is_unsalted():
    toks = list(range(512))
    plain = keys.chain(toks)
    assert keys.chain(toks, salt=b"") == plain
    a, b = keys.chain(toks, salt="tenant-a"), keys.chain(toks, salt="tenant-b")
    assert len(a) == len(plain) == 4
    assert not set(a) & set(plain) and not set(a) & set(b)
    assert keys.chain(toks, salt=b"tenant-a") == a  # str and bytes agree


def test_chain_depends_on_prefix():
    toks = list(range(256))
    other = [999] + toks[1:]
    a, b = keys.chain(toks), keys.chain(other)
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix
    assert keys.chain(toks[:128]) == a[:1]


def test_invalid_arguments():
    with pytest.raises(ValueError):
        keys.chain([1, 2, 3], 0)
    with pytest.raises(ValueError):
        keys.chain([1], keys.MAX_BLOCK_SIZE + 1)
    with pytest.raises(ValueError, match="unknown hash"):
        keys.chain([1], 1, "md5")
    with pytest.raises(ValueError, match="u32"):
        keys.chain([2**32], 1)
    with pytest.raises(ValueError, match="u32"):
        keys.chain([-1], 1)


def test_keys_module_does_not_need_grpc():
    code = "import sys, kvtier.keys, kvtier; kvtier.chain([1], 1); assert 'grpc' not in sys.modules, 'grpc imported'"
    env = dict(os.environ, PYTHONPATH=str(Path(keys.__file__).parent.parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_crc32c_known_values():
    # RFC 3720 / iSCSI check value and test vectors.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c_pure(b"123456789") == 0xE3069283
    assert crc32c_pure(bytes(32)) == 0x8A9136AA
    assert crc32c_pure(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_pure(b"") == 0


def test_crc32c_pure_matches_accelerated_and_continues():
    data = os.urandom(10_000)
    assert crc32c_pure(data) == crc32c(data)
    assert crc32c_pure(data[5000:], crc32c_pure(data[:5000])) == crc32c(data)
