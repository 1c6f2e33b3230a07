"""Read-only looks at a character's files for the memory browser.

time_indexed.db is read through a separate read-only SQLite connection (WAL lets it run
beside the owning actor's writer); views are read for characters that are not active, so
listing characters never activates them. Every function here blocks: call it in a thread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from nekomem.domain.turns import from_disk
from nekomem.stores import timeindex_check
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.timeindex import to_utc_iso

TABLE = "time_indexed_original"
_CONTENT = "json_extract(message, '$.data.content')"


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


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=5)
    db.execute("PRAGMA query_only = ON")
    return db


def _where(q: JournalQuery) -> tuple[str, list[Any]]:
    """The WHERE clause of ``q``; raises ValueError for a bound that is not ISO 8601."""
    clauses: list[str] = []
    params: list[Any] = []
    if q.since:
        clauses.append("timestamp >= ?")
        params.append(to_utc_iso(q.since))
    if q.until:
        clauses.append("timestamp <= ?")
        params.append(to_utc_iso(q.until))
    if q.text.strip():
        clauses.append(f"instr(lower({_CONTENT}), lower(?)) > 0")
        params.append(q.text.strip())
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def read_journal(paths: CharacterPaths, q: JournalQuery) -> dict[str, Any]:
    """``{"total", "offset", "items"}`` of the stored turns matching ``q``; an empty page
    when the character has no database. Raises ValueError for a bad bound and
    sqlite3.Error when the file cannot be read."""
    where, params = _where(q)
    if not paths.time_index_db.exists():
        return {"total": 0, "offset": q.offset, "items": []}
    order = "ASC" if q.order == "asc" else "DESC"
    db = _connect(paths.time_index_db)
    try:
        total = int(db.execute(f"SELECT COUNT(*) FROM {TABLE}{where}", params).fetchone()[0])
        rows = db.execute(
            f"SELECT id, session_id, message, timestamp FROM {TABLE}{where} ORDER BY timestamp {order}, id {order} LIMIT ? OFFSET ?",
            [*params, q.limit, q.offset],
        ).fetchall()
    finally:
        db.close()
    items = []
    for row_id, session_id, message, timestamp in rows:
        try:
            turn = from_disk(msgspec.json.decode(message)) if isinstance(message, (str, bytes)) else None
        except msgspec.DecodeError:
            turn = None
        if turn is None:
            items.append({"id": row_id, "session_id": session_id, "role": "unreadable", "text": "", "ts": timestamp})
            continue
        items.append({"id": row_id, "session_id": session_id, "role": turn.role, "text": turn.text, "ts": timestamp or turn.ts})
    return {"total": total, "offset": q.offset, "items": items}


def journal_summary(paths: CharacterPaths) -> tuple[int, str | None]:
    """(turn count, newest turn time) of time_indexed.db; (0, None) without one."""
    if not paths.time_index_db.exists():
        return 0, None
    try:
        db = _connect(paths.time_index_db)
    except sqlite3.Error:
        return 0, None  # unreadable: storage_trouble says so
    try:
        count, last = db.execute(f"SELECT COUNT(*), MAX(timestamp) FROM {TABLE}").fetchone()
    except sqlite3.OperationalError:
        # Created a moment ago by an activating character whose recent actor has not yet
        # made its tables (it loads on an actor worker, concurrently with this read).
        return 0, None
    except sqlite3.DatabaseError:
        return 0, None  # not a database, or malformed: storage_trouble says so
    finally:
        db.close()
    return int(count), last


def _length(path: Path) -> int:
    """Items in a JSON list (or entries of a persona object) view; 0 when missing or unreadable."""
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return 0
    if isinstance(raw, list):
        return len(raw)
    return 0


def _reflection_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return counts
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict):
            status = str(item.get("status", "pending"))
            counts[status] = counts.get(status, 0) + 1
    return counts


def _persona_count(path: Path) -> int:
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return 0
    total = 0
    for section in raw.values() if isinstance(raw, dict) else []:
        facts = section.get("facts") if isinstance(section, dict) else section
        total += len(facts) if isinstance(facts, list) else 0
    return total


def archived_reflections(paths: CharacterPaths) -> list[dict[str, Any]]:
    """Every archived reflection in reflection_archive/ shards, newest shard first."""
    folder = paths.reflection_archive_dir
    items: list[dict[str, Any]] = []
    if not folder.is_dir():
        return items
    for shard in sorted(folder.glob("*.json"), reverse=True):
        try:
            raw = msgspec.json.decode(shard.read_bytes())
        except (OSError, msgspec.DecodeError):
            continue
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict):
                item.pop("embedding", None)
                items.append({**item, "status": "archived"})
    return items


def disk_counts(paths: CharacterPaths) -> dict[str, Any]:
    """Layer counts from the views on disk (for a character that is not active)."""
    reflections = _reflection_counts(paths.reflections)
    reflections["archived"] = reflections.get("archived", 0) + len(archived_reflections(paths))
    return {
        "recent": _length(paths.recent),
        "facts": _length(paths.facts),
        "facts_archived": _length(paths.facts_archive),
        "reflections": reflections,
        "persona": _persona_count(paths.persona),
        "corrections": _length(paths.persona_corrections),
    }


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
            db = _connect(paths.time_index_db)
            try:
                db.execute(f"SELECT 1 FROM {TABLE} LIMIT 1").fetchall()
            finally:
                db.close()
        except sqlite3.OperationalError:
            pass  # no table yet (an activation is making it)
        except sqlite3.DatabaseError as exc:
            trouble.append(f"time_indexed.db is damaged ({exc}); it is kept aside when the character next loads")
    return trouble


def journal_damaged(trouble: list[str]) -> bool:
    """Whether :func:`storage_trouble`'s list says the journal is or was damaged."""
    return any(item.startswith("time_indexed.db") for item in trouble)
