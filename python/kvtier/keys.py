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

**Placement** (cluster mode, docs/cluster.md): every block is placed on its
own by rendezvous hashing over the node names (:func:`score`, :func:`rank`,
:func:`owners`; golden vectors in tests/vectors/placement.json), the same
function as ``crates/kvtier-core/src/cluster.rs``.
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
    "check_keys",
    "DEFAULT_REPLICAS",
    "node_name",
    "score",
    "rank",
    "owners",
]

DEFAULT_HASH = "xxh3-64-v1"
DEFAULT_BLOCK_SIZE = 128
MAX_BLOCK_SIZE = 1 << 16
MAX_KEY_LEN = 512
MAX_NAMESPACE_LEN = 128

#: Owners of each block in a cluster unless configured otherwise (docs/cluster.md).
DEFAULT_REPLICAS = 2

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


def check_keys(keys: Sequence[bytes]) -> list[bytes]:
    """A call's ``keys`` argument as a list of ``bytes``; ``TypeError`` for a
    single key (a ``bytes`` is a sequence too) or an element that is not bytes-like."""
    if isinstance(keys, (bytes, bytearray, str)):
        raise TypeError("keys must be a sequence of bytes, not a single key")
    out = []
    for k in keys:
        if not isinstance(k, (bytes, bytearray, memoryview)):
            raise TypeError(f"key {k!r} is not bytes")
        out.append(bytes(k))
    return out


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


# -- placement (docs/cluster.md) ----------------------------------------------

#: Schemes a node address may carry; the node's name is the address without it.
_NODE_SCHEMES = ("grpc://", "http://")


def node_name(addr: str) -> str:
    """The name a node is placed by: its address ``host:port`` with a leading
    ``grpc://`` or ``http://`` and trailing ``/`` removed, otherwise exactly
    as given in the node list (docs/cluster.md; the server's
    ``cluster::node_name``). Raises ``ValueError`` for an address that is not
    ``host:port`` with a port in 1..=65535."""
    rest = addr
    for scheme in _NODE_SCHEMES:
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
            break
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) <= 0xFFFF):
        raise ValueError(f"cluster node {addr!r} is not grpc://host:port (with a port other than 0)")
    return rest


def score(node: str, namespace: str, key: bytes) -> int:
    """The rendezvous score of ``node`` for one block (docs/cluster.md): the
    first 8 bytes, big-endian, of ``sha256(node || 0x00 || namespace || 0x00 || key)``
    (names and namespace as UTF-8). An int in ``0 .. 2**64 - 1``."""
    h = hashlib.sha256(node.encode())
    h.update(b"\0")
    h.update(namespace.encode())
    h.update(b"\0")
    h.update(bytes(key))
    return int.from_bytes(h.digest()[:8], "big")


def rank(nodes: Iterable[str], namespace: str, key: bytes) -> list[str]:
    """``nodes`` (names, see :func:`node_name`) ordered by their :func:`score`
    for one block, best first; equal scores by name, ascending (docs/cluster.md)."""
    k = bytes(key)
    scored = [(score(n, namespace, k), n) for n in nodes]
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [n for _, n in scored]


def owners(nodes: Iterable[str], namespace: str, key: bytes, replicas: int = DEFAULT_REPLICAS) -> list[str]:
    """Where one block lives: the first ``replicas`` of :func:`rank` over
    ``nodes``, the *live* nodes (all of them when fewer; docs/cluster.md)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, not {replicas}")
    return rank(nodes, namespace, key)[:replicas]
