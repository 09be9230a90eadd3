"""Tiny stdlib client for kvtier's HTTP key/value API.

| method | path | success | errors |
|---|---|---|---|
| PUT | ``/v1/kv/{namespace}/{key}?ttl_ms=N`` | 204 | 400, 413, 507 |
| GET | ``/v1/kv/{namespace}/{key}`` | 200 + bytes | 404 |
| DELETE | ``/v1/kv/{namespace}/{key}`` | 204 | 404 |

Errors other than "not found" raise :class:`HttpError` with the status and the
server's JSON ``code`` / ``error``.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from .errors import Error

__all__ = ["HttpClient", "HttpError"]


class HttpError(Error):
    """A non-success HTTP answer: ``status`` (int), ``code`` and ``message`` from the JSON body."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class HttpClient:
    """``HttpClient("127.0.0.1:8080")`` (an ``http://`` prefix is accepted)."""

    def __init__(self, base: str, timeout: float = 10.0):
        if "://" not in base:
            base = "http://" + base
        self.base = base.rstrip("/")
        self.timeout = timeout

    def _url(self, ns: str, key: str, query: dict | None = None) -> str:
        # Each part is one path segment: '/' in a namespace is percent-encoded.
        url = f"{self.base}/v1/kv/{urllib.parse.quote(ns, safe='')}/{urllib.parse.quote(key, safe='')}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def _do(self, method: str, url: str, body: bytes | None = None) -> tuple[int, bytes, dict]:
        req = urllib.request.Request(url, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.read(), dict(e.headers)

    @staticmethod
    def _error(status: int, body: bytes) -> HttpError:
        try:
            j = json.loads(body)
            return HttpError(status, j.get("code", ""), j.get("error", ""))
        except (ValueError, AttributeError):
            return HttpError(status, "", body[:200].decode("utf-8", "replace"))

    def put(self, ns: str, key: str, value: bytes, ttl_ms: int | None = None) -> None:
        """Stores ``value`` (replacing any previous one); ``ttl_ms`` sets an expiry."""
        query = {"ttl_ms": int(ttl_ms)} if ttl_ms else None
        status, body, _ = self._do("PUT", self._url(ns, key, query), bytes(value))
        if status not in (200, 201, 204):
            raise self._error(status, body)

    def get(self, ns: str, key: str) -> bytes | None:
        """The value, or ``None`` when the key does not exist."""
        status, body, _ = self._do("GET", self._url(ns, key))
        if status == 200:
            return body
        if status == 404:
            return None
        raise self._error(status, body)

    def delete(self, ns: str, key: str) -> bool:
        """Deletes the key; ``False`` when it did not exist."""
        status, body, _ = self._do("DELETE", self._url(ns, key))
        if status in (200, 204):
            return True
        if status == 404:
            return False
        raise self._error(status, body)

    def lookup(self, ns: str, tokens: Sequence[int] | None = None, keys: Sequence[bytes] | None = None,
               block_size: int = 0, hash: str = "", token: str | None = None) -> dict[str, Any]:
        """``POST /v1/lookup``: how much of a prefix is stored, where (per node
        and tier: ``tier_counts``; docs/events.md, "Per-tier lookup"). Give
        ``tokens`` (hashed by the server with ``block_size`` and ``hash``, 0/""
        = its defaults) or ``keys``; ``token`` is a bearer token."""
        if (keys is None) == (tokens is None):
            raise ValueError("give exactly one of keys or tokens")
        doc: dict[str, Any] = {"namespace": ns}
        if tokens is not None:
            doc.update(tokens=[int(t) for t in tokens], block_size=block_size, hash=hash)
        else:
            assert keys is not None
            doc["keys"] = [bytes(k).hex() for k in keys]
        req = urllib.request.Request(f"{self.base}/v1/lookup", data=json.dumps(doc).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                out: dict[str, Any] = json.loads(r.read())
                return out
        except urllib.error.HTTPError as e:
            with e:
                raise self._error(e.code, e.read()) from None

    def healthz(self) -> bool:
        status, _, _ = self._do("GET", f"{self.base}/healthz")
        return status == 200


# Module-level convenience, e.g. ``kvtier.http.put("127.0.0.1:8080", ...)``
def put(base: str, ns: str, key: str, value: bytes, ttl_ms: int | None = None) -> None:
    HttpClient(base).put(ns, key, value, ttl_ms)


def get(base: str, ns: str, key: str) -> bytes | None:
    return HttpClient(base).get(ns, key)


def delete(base: str, ns: str, key: str) -> bool:
    return HttpClient(base).delete(ns, key)
