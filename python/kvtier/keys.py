"""The chained block-key scheme of kvtier (docs/keys.md, tests/vectors/keys.json).

A block's key is ``h[i] = H(h[i-1] || tokens of block i as u32 little-endian)``
with ``h[-1]`` all zeros, so equal keys mean equal prefixes:

* ``xxh3-64-v1`` (default): ``xxh3_64(prev 8 bytes || tokens)``, key = the
  64-bit result as 8 bytes, big-endian.
* ``sha256-v1``: ``sha256(prev 32 bytes || tokens)``, key = the 32-byte digest.

Only full blocks are hashed: trailing tokens that do not fill a block are
ignored (they cannot be cached until the block is complete).

A **salted** chain starts from ``h[-1] = sha256(b"kvtier-salt-v1\\0" + salt)``
cut to the key length (:func:`seed`): with a secret salt, nobody without it
can compute a tenant's keys from the tokens, so nobody can pre-write them
(docs/security.md). The salt stays with the client; ``b""`` is unsalted.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

__all__ = [
    "HASHES",
    "DEFAULT_HASH",
    "DEFAULT_BLOCK_SIZE",
    "MAX_BLOCK_SIZE",
    "MAX_KEY_LEN",
    "MAX_NAMESPACE_LEN",
    "key_len",
    "seed",
    "block_key",
    "chain",
    "check_block_size",
]

DEFAULT_HASH = "xxh3-64-v1"
DEFAULT_BLOCK_SIZE = 128
MAX_BLOCK_SIZE = 1 << 16
MAX_KEY_LEN = 512
MAX_NAMESPACE_LEN = 128

#: Supported hash functions and the key length each produces.
HASHES = {"xxh3-64-v1": 8, "sha256-v1": 32}

_U32_MAX = 0xFFFFFFFF


def key_len(hash: str = DEFAULT_HASH) -> int:
    """Key length in bytes produced by ``hash``."""
    try:
        return HASHES[hash or DEFAULT_HASH]
    except KeyError:
        raise ValueError(
            f"unknown hash function {hash!r}; supported: {', '.join(HASHES)}"
        ) from None


def check_block_size(block_size: int) -> None:
    """Rejects block sizes of 0 or above :data:`MAX_BLOCK_SIZE` (as the server does)."""
    if not isinstance(block_size, int) or isinstance(block_size, bool):
        raise TypeError(f"block size must be an int, not {type(block_size).__name__}")
    if block_size < 1 or block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block size {block_size} out of range 1..={MAX_BLOCK_SIZE}")


def _xxh3_64(data: bytes) -> bytes:
    import xxhash  # imported lazily: only needed for this hash

    return xxhash.xxh3_64_intdigest(data).to_bytes(8, "big")


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


_FNS = {"xxh3-64-v1": _xxh3_64, "sha256-v1": _sha256}


def _pack(tokens: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        bad = next((t for t in tokens if not isinstance(t, int) or not 0 <= t <= _U32_MAX), None)
        raise ValueError(f"token {bad!r} is not a u32 (0..=4294967295)") from None


def block_key(prev: bytes | None, tokens: Sequence[int], hash: str = DEFAULT_HASH) -> bytes:
    """Key of one block given the previous block's key (``None`` for the first block)."""
    klen = key_len(hash)
    if prev is None:
        prev = bytes(klen)
    return _FNS[hash or DEFAULT_HASH](bytes(prev) + _pack(tokens))


def seed(salt: bytes | str, hash: str = DEFAULT_HASH) -> bytes | None:
    """``h[-1]`` of a chain salted with ``salt``; ``None`` (zeros) when empty."""
    if isinstance(salt, str):
        salt = salt.encode()
    if not salt:
        return None
    return hashlib.sha256(b"kvtier-salt-v1\0" + bytes(salt)).digest()[:key_len(hash)]


def chain(
    tokens: Iterable[int],
    block_size: int = DEFAULT_BLOCK_SIZE,
    hash: str = DEFAULT_HASH,
    salt: bytes | str = b"",
) -> list[bytes]:
    """Keys of every *full* block of ``tokens``, in chain order (salted with
    ``salt``, if given)."""
    check_block_size(block_size)
    hash = hash or DEFAULT_HASH
    klen = key_len(hash)
    fn = _FNS[hash]
    toks = tokens if isinstance(tokens, Sequence) else list(tokens)
    prev = seed(salt, hash) or bytes(klen)
    keys: list[bytes] = []
    for start in range(0, len(toks) - block_size + 1, block_size):
        key = fn(prev + _pack(toks[start:start + block_size]))
        keys.append(key)
        prev = key
    return keys
