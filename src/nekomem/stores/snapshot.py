"""The portable form of one character folder (``nekomem export`` / ``backup`` / ``import``).

:func:`read_character` turns a *quiet* folder (no actor writing it: the server holds the
character stopped, or no server runs) into one JSON-ready document;
:func:`write_character` makes a folder from it again. The document (format
``nekomem-character``, version 1; docs/OPERATIONS.md, "Backup, export and restore"):

``{"format", "version", "name", "files": {relative path: JSON value}, "logs": {relative
path: [one JSON value per line]}, "journal": {"rows": [{"id", "session_id", "timestamp",
"message"}], "cursors": {name: row id}, "sequence": last id given}}``

- ``files``: every JSON view of the folder (facts, reflections, persona, the window and
  its meta, the archives' shards, ...), as parsed JSON;
- ``logs``: the append-only files (``events.ndjson``, ``outbox.ndjson``,
  ``recent_edits.ndjson``), one parsed value per line;
- ``journal``: time_indexed.db, row by row with the row ids kept (the browser and the
  cursors name rows by id), ``message`` parsed when it is JSON; and the cursors (how far
  derived work has got, so nothing is redone or skipped after a restore).

Left out: idempotency answers (a retried request older than the copy is new to it), the
never-written ``time_indexed_compressed`` table, and files nekomem keeps aside
(``*.corrupt-*``, temporary and swap files): they are not memory.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_bytes, atomic_write_json, fsync_dir, read_json
from nekomem.stores.layout import (
    ADOPTED_FILE,
    EVENTS_FILE,
    MIRROR_FILE,
    OUTBOX_FILE,
    PERSONA_ARCHIVE_DIR,
    RECENT_FILE,
    REFLECTION_ARCHIVE_DIR,
    TIME_INDEX_FILE,
    CharacterPaths,
    validate_name,
)
from nekomem.stores.recent_watch import EDITS_FILE
from nekomem.stores.timeindex import TimeIndex
from nekomem.stores.timeindex_read import ORIGINAL_TABLE

FORMAT = "nekomem-character"
VERSION = 1
LOG_FILES = (EVENTS_FILE, OUTBOX_FILE, EDITS_FILE)
ARCHIVE_DIRS = (REFLECTION_ARCHIVE_DIR, PERSONA_ARCHIVE_DIR)


class SnapshotError(ValueError):
    """A document that is not a nekomem character, or a folder it cannot be written to."""


# A N.E.K.O. memory folder's bookkeeping of its reference files (importer.neko_folder): not
# memory, and wrong for any other folder (a restored character is adopted afresh).
_NEKO_FOLDER_FILES = frozenset({ADOPTED_FILE, MIRROR_FILE})


def _view_paths(folder: Path) -> list[str]:
    names = [p.name for p in sorted(folder.glob("*.json")) if ".nkatmp" not in p.name and p.name not in _NEKO_FOLDER_FILES]
    for sub in ARCHIVE_DIRS:
        names += [f"{sub}/{p.name}" for p in sorted((folder / sub).glob("*.json")) if ".nkatmp" not in p.name]
    return names


def _log_lines(path: Path) -> list[Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                lines.append(msgspec.json.decode(raw))
            except msgspec.DecodeError:
                continue  # a torn last line of an interrupted append: readers skip it too
    return lines


def _journal(db_path: Path) -> dict[str, Any]:
    if not db_path.exists():
        return {"rows": [], "cursors": {}, "sequence": 0}
    # A private copy through SQLite's backup API: one consistent state of the file, WAL
    # included, whatever the source's journal mode.
    source = sqlite3.connect(f"file:{db_path.resolve()}?mode=ro", uri=True)
    copy = sqlite3.connect(":memory:")
    try:
        source.backup(copy)
    finally:
        source.close()
    try:
        rows = []
        for row_id, session_id, message, timestamp in copy.execute(
            f"SELECT id, session_id, message, timestamp FROM {ORIGINAL_TABLE} ORDER BY id"
        ):
            try:
                parsed: Any = msgspec.json.decode(message) if isinstance(message, str) else message
            except msgspec.DecodeError:
                parsed = message
            rows.append({"id": row_id, "session_id": session_id, "timestamp": timestamp, "message": parsed})
        try:
            cursors = {name: row for name, row in copy.execute("SELECT name, row_id FROM cursors")}
            seq = copy.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (ORIGINAL_TABLE,)).fetchone()
        except sqlite3.OperationalError:  # a file from before those tables
            cursors, seq = {}, None
    finally:
        copy.close()
    return {"rows": rows, "cursors": cursors, "sequence": int(seq[0]) if seq else 0}


def read_character(folder: Path, recent: Path | None = None) -> dict[str, Any]:
    """The document of the character folder ``folder`` (see the module docstring). The
    folder must be quiet. ``recent``: the character's recent.json when it is not in
    ``folder`` (a N.E.K.O. memory folder: ``folder`` is ``<name>/.nekomem``, the name is
    its parent's). Raises OSError and sqlite3.Error when it cannot be read."""
    files: dict[str, Any] = {}
    for rel in _view_paths(folder):
        value, status = read_json(folder / rel, default=None)
        if status == "ok":
            files[rel] = value
    if recent is not None and recent != folder / RECENT_FILE:
        value, status = read_json(recent, default=None)
        if status == "ok":
            files[RECENT_FILE] = value
    logs = {name: _log_lines(folder / name) for name in LOG_FILES if (folder / name).exists()}
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": recent.parent.name if recent is not None else folder.name,
        "files": files,
        "logs": logs,
        "journal": _journal(folder / TIME_INDEX_FILE),
    }


def _safe_rel(rel: object) -> str:
    """A document's relative path, refused unless it is a plain ``name.json`` or
    ``<archive dir>/name.json`` (a document must not write outside its folder)."""
    if not isinstance(rel, str):
        raise SnapshotError("a file name in the document is not a string")
    parts = rel.split("/")
    ok = (len(parts) == 1 or (len(parts) == 2 and parts[0] in ARCHIVE_DIRS)) and all(
        p and p not in (".", "..") and "\\" not in p for p in parts
    )
    if not ok or not (rel.endswith(".json") or (len(parts) == 1 and rel in LOG_FILES)):
        raise SnapshotError(f"the document names a file nekomem does not keep: {rel[:80]!r}")
    return rel


def check_document(doc: object) -> dict[str, Any]:
    """``doc`` when it is a character document of a known version; raises SnapshotError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"not a {FORMAT} document")
    if doc.get("version") != VERSION:
        raise SnapshotError(f"{FORMAT} version {doc.get('version')!r} is not supported (this nekomem reads {VERSION})")
    for key in ("files", "logs", "journal"):
        if not isinstance(doc.get(key), dict):
            raise SnapshotError(f"the document's {key!r} is not an object")
    return doc


def write_character(root: Path, doc: dict[str, Any], *, name: str | None = None, replace: bool = False) -> Path:
    """Make the folder of the character ``doc`` describes under ``root`` (as ``name`` when
    given) and return it. The whole document is checked first: a bad one (SnapshotError)
    or an existing folder without ``replace`` writes nothing. Raises OSError and
    sqlite3.Error on write failures; a failed write leaves a partial folder, which a second
    run with ``replace`` rewrites."""
    check_document(doc)
    target_name = validate_name(name or str(doc.get("name", "")))
    files = {_safe_rel(rel): value for rel, value in doc["files"].items()}
    logs: dict[str, bytes] = {}
    for rel, lines in doc["logs"].items():
        if not isinstance(lines, list):
            raise SnapshotError(f"the document's log {str(rel)[:80]!r} is not a list")
        logs[_safe_rel(rel)] = b"".join(msgspec.json.encode(v) + b"\n" for v in lines)
    journal = doc["journal"]
    rows = journal.get("rows", [])
    cursors = journal.get("cursors", {})
    sequence = journal.get("sequence", 0)
    if not isinstance(rows, list) or not isinstance(cursors, dict) or not isinstance(sequence, int):
        raise SnapshotError("the document's journal needs 'rows' (a list), 'cursors' (an object) and an integer 'sequence'")
    encoded: list[tuple[int, str | None, str, str | None]] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("id"), int):
            raise SnapshotError(f"journal row {index} has no integer id")
        message = row.get("message")
        text = message if isinstance(message, str) else msgspec.json.encode(message).decode("utf-8")
        session, stamp = row.get("session_id"), row.get("timestamp")
        encoded.append((row["id"], session if isinstance(session, str) else None, text, stamp if isinstance(stamp, str) else None))
    # In a N.E.K.O. memory folder nekomem's files go to <name>/.nekomem/ and recent.json to
    # <name>/; the reference's files are written by the next adoption (start or /reload).
    paths = CharacterPaths(Path(root), target_name)
    folder = paths.folder
    if paths.home.exists():
        if not replace:
            raise SnapshotError(f"{target_name}: the character already exists in the target (use --replace)")
        shutil.rmtree(paths.home)
    folder.mkdir(parents=True)
    for rel, value in files.items():
        atomic_write_json(paths.recent if rel == RECENT_FILE else folder / rel, value)
    for rel, data in logs.items():
        atomic_write_bytes(folder / rel, data)
    with TimeIndex(folder / TIME_INDEX_FILE) as db:
        db.restore_rows(encoded, {str(k): v for k, v in cursors.items() if isinstance(v, int)}, sequence)
    fsync_dir(folder)
    return folder
