"""``idempotency_keys.json`` of a character: the keys of ``scoped_history`` writes that
are done, so a retry under the same key is answered, not extracted again.

The file is the reference's (``app/memory_server/idempotency.py``, read at commit
``03452dd8e2931479ca8a3ee0772e7cabcd88f0f5``): ``{key: {"state", "written_at",
"updated_at", ...}}`` with state ``pending`` / ``done`` / ``cancelled``, kept forever (the
caller retries without a bound). nekomem writes only ``done`` records and adds
``request_sha256`` (what the keyed request was: a retry must be the same request) and
``answer`` (the JSON answered, ids and counts, never memory text). Records it did not
write are kept as read. An unreadable file is never read as empty: that would forget
every done key and let a retry extract again; :class:`KeyStateError` is raised instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_json

FILENAME = "idempotency_keys.json"
DONE = "done"


class KeyStateError(RuntimeError):
    """The key file exists but cannot be read as ``{key: record}``."""


class ScopedKeys:
    """The key records of one character folder (blocking file I/O; callers serialise)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILENAME

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise KeyStateError(f"{FILENAME} unreadable: {exc.__class__.__name__}") from exc
        try:
            data = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise KeyStateError(f"{FILENAME} is not valid JSON") from exc
        if not isinstance(data, dict):
            raise KeyStateError(f"{FILENAME} is not an object")
        return data

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of ``key``, or None. Raises KeyStateError."""
        record = self._read().get(key)
        if record is None:
            return None
        if not isinstance(record, dict):
            raise KeyStateError(f"the record of an idempotency key in {FILENAME} is malformed")
        return record

    def mark_done(self, key: str, request_sha256: str, answer: dict[str, Any], now: float, **extra: Any) -> None:
        """Record ``key`` as done with its request fingerprint and answer (a done record is
        never changed again). Raises KeyStateError, OSError."""
        data = self._read()
        current = data.get(key)
        if isinstance(current, dict) and current.get("state") == DONE:
            return
        record: dict[str, Any] = dict(current) if isinstance(current, dict) else {}
        record.setdefault("written_at", now)
        record.update({"state": DONE, "updated_at": now, "request_sha256": request_sha256, "answer": answer})
        record.update({k: v for k, v in extra.items() if v is not None})
        data[key] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, data)
