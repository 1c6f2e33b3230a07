"""Checking a ``nekomem-character`` document whole before anything of it is written.

``nekomem import`` and ``nekomem restore`` (and ``backup``, which writes the same
documents) call :func:`check_character` on every character first; only a document that
passes is written, so a bad one changes nothing (docs/OPERATIONS.md, "Backup and restore",
lists these rules). What is refused, each with a :class:`SnapshotError` that names the
character, the field and the row:

- a name the server would refuse (:func:`nekomem.stores.layout.validate_name`, with the
  configured limits);
- a file key that is not ``<name>.json`` or ``<archive dir>/<name>.json`` (or one of the
  logs), so nothing is written outside the character's folder;
- a view of the wrong JSON shape (a list view that is not a list, an object view that is
  not an object), a log that is not a list, and any value nested deeper than
  ``max_depth``;
- a journal row id that is not an integer in ``1..MAX_ROW_ID``, or repeated; a sequence
  below the highest row id (0 means "the highest row id"); a cursor that is not an
  integer in ``0..sequence``; a session id or timestamp that is not a string or null.

``MAX_ROW_ID`` is 2^53 - 1, far below SQLite's 2^63 - 1: row ids travel to the memory
browser in JSON, and a JavaScript number holds integers exactly only up to 2^53 - 1 (a
larger id would be rounded there and name another row); and a journal whose sequence
stands at SQLite's maximum can store no new turn (every write answers 507
``storage_full``), while 2^53 leaves about 2^63 - 2^53 ids for new rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from nekomem.domain.opaque import json_depth
from nekomem.stores.layout import (
    CURSORS_FILE,
    EVENTS_APPLIED_FILE,
    EVENTS_FILE,
    FACTS_ARCHIVE_FILE,
    FACTS_FILE,
    OUTBOX_FILE,
    PERSONA_ARCHIVE_DIR,
    PERSONA_CORRECTIONS_FILE,
    PERSONA_FILE,
    RECENT_FILE,
    RECENT_META_FILE,
    REFLECTION_ARCHIVE_DIR,
    REFLECTIONS_FILE,
    SELF_DISCLOSURE_FILE,
    STATE_FILE,
    SURFACED_FILE,
    InvalidName,
    validate_name,
)
from nekomem.stores.recent_watch import EDITS_FILE

FORMAT = "nekomem-character"
VERSION = 1
LOG_FILES = (EVENTS_FILE, OUTBOX_FILE, EDITS_FILE)
ARCHIVE_DIRS = (REFLECTION_ARCHIVE_DIR, PERSONA_ARCHIVE_DIR)
MAX_ROW_ID = 2**53 - 1
# The views nekomem reads as a list of records and as one object; any other ``*.json`` of
# the folder (a layer's small state file) may hold any JSON value.
LIST_VIEWS = frozenset({RECENT_FILE, FACTS_FILE, FACTS_ARCHIVE_FILE, REFLECTIONS_FILE, SURFACED_FILE, PERSONA_CORRECTIONS_FILE})
OBJECT_VIEWS = frozenset({RECENT_META_FILE, PERSONA_FILE, CURSORS_FILE, EVENTS_APPLIED_FILE, SELF_DISCLOSURE_FILE, STATE_FILE})


class SnapshotError(ValueError):
    """A document that is not a nekomem character, or a folder it cannot be written to."""


JournalRow = tuple[int, str | None, str, str | None]


@dataclass(frozen=True)
class CheckedCharacter:
    """A character document that passed :func:`check_character`, ready to write: the
    views and logs as the bytes of their files, the journal as rows to insert."""

    name: str
    files: dict[str, bytes]
    logs: dict[str, bytes]
    rows: list[JournalRow]
    cursors: dict[str, int]
    sequence: int


def check_header(doc: object, where: str) -> dict[str, Any]:
    """``doc`` when it is a character document of a known version; raises SnapshotError."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"{where}: not a {FORMAT} document")
    if doc.get("version") != VERSION:
        raise SnapshotError(f"{where}: {FORMAT} version {str(doc.get('version'))[:20]!r} is not supported (this nekomem reads {VERSION})")
    for key in ("files", "logs", "journal"):
        if not isinstance(doc.get(key), dict):
            raise SnapshotError(f"{where}: the document's {key!r} is not an object")
    return doc


def safe_rel(rel: object, where: str) -> str:
    """A document's relative path, refused unless it is a plain ``name.json`` or
    ``<archive dir>/name.json`` or a log's name (a document must not write outside its
    folder)."""
    if not isinstance(rel, str):
        raise SnapshotError(f"{where}: a file name in the document is not a string")
    parts = rel.split("/")
    ok = (len(parts) == 1 or (len(parts) == 2 and parts[0] in ARCHIVE_DIRS)) and all(
        p and p not in (".", "..") and "\\" not in p and "\x00" not in p and len(p.encode("utf-8", "replace")) <= 200 and p[0] != "."
        for p in parts
    )
    if not ok or not (rel.endswith(".json") or (len(parts) == 1 and rel in LOG_FILES)):
        raise SnapshotError(f"{where}: the document names a file nekomem does not keep: {rel[:80]!r}")
    return rel


def _shape(rel: str, value: object, where: str, max_depth: int) -> None:
    is_list_view = rel in LIST_VIEWS or "/" in rel
    if is_list_view and not isinstance(value, list):
        raise SnapshotError(f"{where}: files[{rel!r}] must be a JSON list")
    if rel in OBJECT_VIEWS and not isinstance(value, dict):
        raise SnapshotError(f"{where}: files[{rel!r}] must be a JSON object")
    if json_depth(value, max_depth) > max_depth:
        raise SnapshotError(f"{where}: files[{rel!r}] nests deeper than {max_depth} levels")


def _encode(value: object, where: str) -> bytes:
    try:
        return msgspec.json.encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise SnapshotError(f"{where}: cannot be written as JSON ({exc})") from None


def _journal(journal: dict[str, Any], where: str, max_depth: int) -> tuple[list[JournalRow], dict[str, int], int]:
    rows = journal.get("rows", [])
    cursors = journal.get("cursors", {})
    sequence = journal.get("sequence", 0)
    if not isinstance(rows, list) or not isinstance(cursors, dict) or type(sequence) is not int:
        raise SnapshotError(f"{where}: the journal needs 'rows' (a list), 'cursors' (an object) and an integer 'sequence'")
    seen: set[int] = set()
    encoded: list[JournalRow] = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SnapshotError(f"{where}: journal row {index} is not an object")
        row_id = row.get("id")
        if type(row_id) is not int:
            raise SnapshotError(f"{where}: journal row {index} has no integer id")
        if not 1 <= row_id <= MAX_ROW_ID:
            raise SnapshotError(f"{where}: journal row {index} has the id {row_id}, outside 1..{MAX_ROW_ID}")
        if row_id in seen:
            raise SnapshotError(f"{where}: journal row {index} repeats the id {row_id}")
        seen.add(row_id)
        session, stamp, message = row.get("session_id"), row.get("timestamp"), row.get("message")
        if session is not None and not isinstance(session, str):
            raise SnapshotError(f"{where}: journal row {row_id}: session_id is not a string")
        if stamp is not None and not isinstance(stamp, str):
            raise SnapshotError(f"{where}: journal row {row_id}: timestamp is not a string")
        if json_depth(message, max_depth) > max_depth:
            raise SnapshotError(f"{where}: journal row {row_id}: the message nests deeper than {max_depth} levels")
        text = message if isinstance(message, str) else _encode(message, f"{where}: journal row {row_id}").decode("utf-8")
        for value in (session, stamp, text):
            if isinstance(value, str) and "\x00" in value:
                raise SnapshotError(f"{where}: journal row {row_id} holds a NUL character")
        encoded.append((row_id, session, text, stamp))
    top = max(seen, default=0)
    if not 0 <= sequence <= MAX_ROW_ID:
        raise SnapshotError(f"{where}: the journal's sequence {sequence} is outside 0..{MAX_ROW_ID}")
    if 0 < sequence < top:
        raise SnapshotError(f"{where}: the journal's sequence {sequence} is below its highest row id {top}")
    last = max(sequence, top)
    checked: dict[str, int] = {}
    for name, value in cursors.items():
        if not isinstance(name, str) or not name or len(name) > 200:
            raise SnapshotError(f"{where}: a journal cursor has no usable name")
        if type(value) is not int or not 0 <= value <= last:
            raise SnapshotError(
                f"{where}: the journal cursor {name[:40]!r} is {repr(value)[:30]}, not an integer in 0..{last} (the sequence)"
            )
        checked[name] = value
    return encoded, checked, sequence


def check_character(doc: object, *, where: str, max_depth: int, name_max_length: int, name_max_units: int) -> CheckedCharacter:
    """Check the character document ``doc`` whole (``where`` says where it came from, for
    the messages) and return it ready to write. Raises SnapshotError naming the character,
    the field and the row of the first problem."""
    header = check_header(doc, where)
    raw_name = header.get("name")
    try:
        name = validate_name(raw_name if isinstance(raw_name, str) else "", name_max_length, name_max_units)
    except InvalidName as exc:
        raise SnapshotError(f"{where}: the name is refused ({exc.code}: {exc.message})") from None
    if not where.endswith(name):
        where = f"{where} ({name})"
    files: dict[str, bytes] = {}
    for rel, value in header["files"].items():
        rel = safe_rel(rel, where)
        if rel in LOG_FILES:
            raise SnapshotError(f"{where}: {rel!r} is a log, not a view (it belongs under 'logs')")
        _shape(rel, value, where, max_depth)
        files[rel] = _encode(value, f"{where}: files[{rel!r}]")
    logs: dict[str, bytes] = {}
    for rel, lines in header["logs"].items():
        rel = safe_rel(rel, where)
        if rel not in LOG_FILES:
            raise SnapshotError(f"{where}: logs[{rel!r}] is not one of nekomem's logs ({', '.join(LOG_FILES)})")
        if not isinstance(lines, list):
            raise SnapshotError(f"{where}: logs[{rel!r}] is not a list")
        if json_depth(lines, max_depth + 1) > max_depth + 1:
            raise SnapshotError(f"{where}: a line of logs[{rel!r}] nests deeper than {max_depth} levels")
        logs[rel] = b"".join(_encode(v, f"{where}: logs[{rel!r}]") + b"\n" for v in lines)
    rows, cursors, sequence = _journal(header["journal"], where, max_depth)
    return CheckedCharacter(name, files, logs, rows, cursors, sequence)
