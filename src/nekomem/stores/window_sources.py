"""Which journal rows each edited item of the recent window came from:
``recent_sources.json`` beside recent.json, nekomem's own file.

An item of the window is matched to the row it came from by role, text and time (what a
forget compares). An edit (``PATCH .../recent/{i}``) changes the item's text, so that
match is lost: the erasure of the row would leave the edited item in recent.json, in the
window base and in /new_dialog. This file keeps the match: for each edited item, the ids of
the rows it came from. recent.json keeps the reference's format (no key is added to its
items: the reference's reader loads them into its message type, and this mapping is none
of its business); a reference that rewrites recent.json meanwhile only loses the mapping.

Items are named by a SHA-256 digest of role, text and time (:func:`item_digest`), so the
file holds no memory text. ``{"items": {digest: [row id, ...]}}``; an unreadable file is
moved aside and read as empty (the edited items are then matched by text only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import msgspec

from nekomem.domain.turns import Turn
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.timeindex_read import to_utc_iso

SOURCES_FILE = "recent_sources.json"


class _File(msgspec.Struct):
    items: dict[str, list[int]] = msgspec.field(default_factory=dict)


def item_key(turn: Turn) -> tuple[str, str, str]:
    """(role, stripped text, time in UTC when readable): how an item and a row are compared."""
    try:
        ts = to_utc_iso(turn.ts)
    except ValueError:
        ts = turn.ts
    return turn.role, turn.text.strip(), ts


def item_digest(turn: Turn) -> str:
    role, text, ts = item_key(turn)
    return hashlib.sha256(f"{role}\x1f{text}\x1f{ts}".encode("utf-8", "surrogatepass")).hexdigest()


class WindowSources:
    """The row ids of the edited window items of one character (see the module)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / SOURCES_FILE
        self.items: dict[str, list[int]] = {}

    def load(self) -> None:
        """Read the file (missing or unreadable: no mapping). Raises OSError when it
        cannot be read at all."""
        value, _status = read_json(self.path, type=_File, default=None)
        self.items = dict(value.items) if isinstance(value, _File) else {}

    def rows_of(self, turn: Turn) -> list[int]:
        """The rows ``turn`` (a window item) was edited from; [] when it was not edited."""
        return list(self.items.get(item_digest(turn), ()))

    def edited(self, old: Turn, new: Turn | None, rows: Iterable[int]) -> None:
        """Item ``old`` (which came from ``rows``) became ``new`` (None: it was deleted)."""
        self.items.pop(item_digest(old), None)
        ids = sorted({int(r) for r in rows})
        if new is not None and ids:
            key = item_digest(new)
            self.items[key] = sorted({*self.items.get(key, ()), *ids})

    def from_rows(self, turn: Turn, gone: Collection[int]) -> bool:
        """Whether window item ``turn`` was edited from any of the rows ``gone``."""
        return any(r in gone for r in self.items.get(item_digest(turn), ()))

    def keep_only(self, window: Sequence[Turn]) -> bool:
        """Drop the entries of items no longer in ``window``; True when any went."""
        present = {item_digest(t) for t in window}
        stale = [k for k in self.items if k not in present]
        for key in stale:
            del self.items[key]
        return bool(stale)

    def save(self) -> None:
        """Write the file durably (removed when nothing is mapped). Raises OSError."""
        if not self.items:
            self.path.unlink(missing_ok=True)
            return
        atomic_write_json(self.path, _File(items=self.items))
