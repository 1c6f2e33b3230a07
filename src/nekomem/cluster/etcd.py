"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``, keys and values base64).

Only what ownership needs: lease grant / keepalive / revoke, range (by key or prefix),
put and delete inside transactions that compare a key's revision. Every call is one
HTTP request on a pooled keep-alive connection, bounded by ``timeout``. ``etcd3gw`` (PyPI)
does the same over the same gateway but pulls in a futures/pbr stack for a handful of
calls; these are written out here instead.

Errors: :class:`EtcdUnavailable` when etcd cannot be reached or answers 5xx,
:class:`EtcdError` for an answer that is not what the call expects (e.g. a lease that no
longer exists on keepalive).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx


class EtcdError(RuntimeError):
    """etcd answered, but not with what the call needs."""


class EtcdUnavailable(EtcdError):
    """etcd could not be reached, timed out, or answered with a server error."""


class LeaseLost(EtcdError):
    """A keepalive found the lease gone (expired or revoked)."""


def b64(text: str | bytes) -> str:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range end that selects every key starting with ``prefix`` (its last byte + 1)."""
    raw = bytearray(prefix.encode("utf-8"))
    raw[-1] += 1
    return b64(bytes(raw))


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the transaction (the put's mod_revision)


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key")).decode("utf-8", "replace"),
        value=_unb64(raw.get("value")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def compare_revision(key: str, target: str, revision: int) -> dict[str, Any]:
    """A txn compare: the key's ``target`` ("CREATE" or "MOD") revision equals ``revision``
    (CREATE 0 means: the key does not exist)."""
    field = {"CREATE": "create_revision", "MOD": "mod_revision"}[target]
    return {"key": b64(key), "result": "EQUAL", "target": target, field: str(revision)}


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


class EtcdClient:
    """Calls to one etcd endpoint (thread-safe: httpx.Client is)."""

    def __init__(self, url: str, *, timeout: float) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=4))

    def close(self) -> None:
        self._http.close()

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise EtcdUnavailable(f"etcd at {self.url} unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            raise EtcdUnavailable(f"etcd answered {response.status_code} to {path}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise EtcdError(f"etcd answered non-JSON to {path}") from exc
        if response.status_code != 200 or not isinstance(answer, dict) or "error" in answer:
            raise EtcdError(f"etcd refused {path}: {str(answer)[:200]}")
        # A streaming call (keepalive) wraps its one message in "result".
        result = answer.get("result", answer)
        return result if isinstance(result, dict) else {}

    # -- leases --------------------------------------------------------------------------
    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id."""
        answer = self._call("/v3/lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; returns the TTL granted. Raises LeaseLost when it is gone."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        ttl = int(answer.get("TTL", 0))
        if ttl <= 0:
            raise LeaseLost(f"lease {lease:x} is gone")
        return ttl

    def revoke(self, lease: int) -> None:
        """Revoke ``lease``: every key attached to it is deleted at once."""
        self._call("/v3/lease/revoke", {"ID": str(lease)})

    # -- keys ----------------------------------------------------------------------------
    def range(self, key: str, *, prefix: bool = False) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix) and the store's revision."""
        body: dict[str, Any] = {"key": b64(key)}
        if prefix:
            body["range_end"] = prefix_end(key)
        answer = self._call("/v3/kv/range", body)
        revision = int(answer.get("header", {}).get("revision", 0))
        return [_kv(kv) for kv in answer.get("kvs", [])], revision

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Unconditional put; returns the new revision."""
        body = put_op(key, value, lease)["request_put"]
        answer = self._call("/v3/kv/put", body)
        return int(answer.get("header", {}).get("revision", 0))

    def delete(self, key: str) -> None:
        self._call("/v3/kv/deleterange", {"key": b64(key)})

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]], failure: list[dict[str, Any]] | None = None) -> TxnResult:
        """One transaction: ``success`` runs when every compare holds, else ``failure``."""
        answer = self._call("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return TxnResult(succeeded=bool(answer.get("succeeded", False)), revision=int(answer.get("header", {}).get("revision", 0)))
