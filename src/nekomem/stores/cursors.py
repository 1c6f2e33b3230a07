"""Per-character scan cursors (cursors.json): ``{"<cursor key>": "<ISO 8601>"}``.

A cursor says how far a periodic scan (e.g. ``rebuttal_checked_until``) has got. The file
is read once, kept in memory by its single owning actor, and rewritten atomically on every
change. A value that is not an ISO timestamp is dropped at load with a WARNING, and a
corrupt file is moved aside and read as empty: at worst a scan starts again from its
fallback.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.jsonl import require_iso

log = logging.getLogger(__name__)


class Cursors:
    """The cursors of one character. Not thread-safe: one owning actor."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._values: dict[str, str] | None = None

    def _load(self) -> dict[str, str]:
        if self._values is None:
            raw, _status = read_json(self.path, type=dict[str, Any], default={})
            values: dict[str, str] = {}
            for key, value in raw.items():
                try:
                    values[key] = require_iso(value, f"cursor {key!r}")
                except ValueError:
                    log.warning("%s: dropping cursor %r with a value that is not ISO 8601", self.path.name, key)
            self._values = values
        return self._values

    def get(self, key: str) -> str | None:
        """The cursor's ISO timestamp, or None when it was never set."""
        return self._load().get(key)

    def set(self, key: str, iso: str) -> None:
        """Set one cursor (other keys are kept) and write the file atomically.

        Raises ValueError when ``iso`` is not an ISO 8601 string, OSError when the write
        fails (the in-memory value then stays the old one).
        """
        if not isinstance(key, str) or not key:
            raise ValueError("cursor key must be a non-empty string")
        merged = dict(self._load())
        merged[key] = require_iso(iso, f"cursor {key!r}")
        atomic_write_json(self.path, merged)
        self._values = merged

    def all(self) -> dict[str, str]:
        """A copy of every cursor."""
        return dict(self._load())
