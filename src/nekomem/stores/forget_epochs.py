"""``scoped_forget_epochs.json``: the erase generation of each forgotten scoped subject.

The reference's scoped client (``memory/scoped_client.py``) numbers the erasures of a
subject (``forget_epoch`` on ``scoped_forget``) and stamps its later history writes with
the generation it knew (``subject_epochs`` on ``scoped_history``); the server keeps the
highest generation per subject key (``<subject_kind>:<subject_id>``) as a tombstone, drops
a stamped write of an older generation (it was produced before the erase it would undo)
and answers ``GET forget_epochs`` from it. The file is ``{"epochs": {key: int},
"updated_at": iso}``, replaced atomically; an unreadable one reads as empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nekomem.stores.atomic import atomic_write_json, read_json

FILE_NAME = "scoped_forget_epochs.json"


class ForgetEpochs:
    """The tombstones of one character folder (the caller serialises writes)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / FILE_NAME

    def all(self) -> dict[str, int]:
        raw, status = read_json(self.path, default={})
        epochs = raw.get("epochs") if status == "ok" and isinstance(raw, dict) else None
        if not isinstance(epochs, dict):
            return {}
        return {str(k): v for k, v in epochs.items() if isinstance(v, int) and not isinstance(v, bool)}

    def get(self, keys: Iterable[str]) -> dict[str, int]:
        """The stored generation of each of ``keys`` that has one."""
        stored = self.all()
        return {key: stored[key] for key in keys if key in stored}

    def raise_to(self, key: str, epoch: int, now_iso: str) -> int:
        """Keep ``max(stored, epoch)`` for ``key``; returns the stored generation."""
        stored = self.all()
        value = max(stored.get(key, epoch), epoch)
        if stored.get(key) != value:
            stored[key] = value
            atomic_write_json(self.path, {"epochs": stored, "updated_at": now_iso})
        return value
