"""Read-only looks at a character's files for the memory browser.

time_indexed.db is read through :class:`~nekomem.stores.timeindex_read.TimeIndexReader`
(read-only; WAL lets it run beside the owning actor's writer); views are read for
characters that are not active, so listing characters never activates them. Every
function here blocks: call it in a thread.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from nekomem.stores import timeindex_check
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.timeindex_read import TimeIndexReader, to_utc_iso
from nekomem.stores.view_counts import archived_items


class JournalQuery(msgspec.Struct, kw_only=True, frozen=True):
    """A page of time_indexed.db: ``since``/``until`` ISO 8601 bounds (inclusive), ``text`` a
    case-insensitive (ASCII) substring of the message text, ``order`` "desc" (newest first)
    or "asc"."""

    since: str | None = None
    until: str | None = None
    text: str = ""
    order: str = "desc"
    offset: int = 0
    limit: int = 50


def read_journal(paths: CharacterPaths, q: JournalQuery) -> dict[str, Any]:
    """``{"total", "offset", "items"}`` of the stored turns matching ``q``; an empty page
    when the character has no database. Raises ValueError for a bad bound and
    sqlite3.Error when the file cannot be read."""
    # A bad bound is refused whether or not the character has a journal yet.
    for bound in (q.since, q.until):
        if bound:
            to_utc_iso(bound)
    if not paths.time_index_db.exists():
        return {"total": 0, "offset": q.offset, "items": []}
    with TimeIndexReader.read_only(paths.time_index_db) as reader:
        total, rows = reader.search(
            since=q.since, until=q.until, text=q.text, newest_first=q.order != "asc", offset=q.offset, limit=q.limit
        )
    items = []
    for row in rows:
        if row.turn is None:
            items.append({"id": row.id, "session_id": row.session_id, "role": "unreadable", "text": "", "ts": row.timestamp})
            continue
        items.append(
            {"id": row.id, "session_id": row.session_id, "role": row.turn.role, "text": row.turn.text, "ts": row.timestamp or row.turn.ts}
        )
    return {"total": total, "offset": q.offset, "items": items}


def archived_reflections(paths: CharacterPaths) -> list[dict[str, Any]]:
    """Every archived reflection in reflection_archive/ shards, newest shard first."""
    return archived_items(paths.reflection_archive_dir)


def storage_trouble(paths: CharacterPaths) -> list[str]:
    """Files of the character that were moved aside as corrupt (``*.corrupt-*``), damaged
    journals kept aside (``time_indexed.db.damaged-*``), and a journal that cannot be read
    now (damage not yet found by an activation)."""
    if not paths.folder.is_dir():
        return []
    trouble = sorted(p.name for p in paths.folder.rglob("*.corrupt-*"))
    trouble += [f"time_indexed.db was damaged and kept aside as {name}" for name in timeindex_check.damaged_copies(paths.folder)]
    if paths.time_index_db.exists():
        try:
            with TimeIndexReader.read_only(paths.time_index_db) as reader:
                reader.probe()
        except sqlite3.OperationalError:
            pass  # no table yet (an activation is making it)
        except sqlite3.DatabaseError as exc:
            trouble.append(f"time_indexed.db is damaged ({exc}); it is kept aside when the character next loads")
    return trouble


def journal_damaged(trouble: list[str]) -> bool:
    """Whether :func:`storage_trouble`'s list says the journal is or was damaged."""
    return any(item.startswith("time_indexed.db") for item in trouble)
