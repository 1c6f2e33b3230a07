"""Read-only access to a reference (N.E.K.O.) memory folder.

Nothing here writes into the source: JSON files are read as bytes (never through
:func:`nekomem.stores.atomic.read_json`, which moves a corrupt file aside), and
``time_indexed.db`` is opened with a ``mode=ro&immutable=1`` URI, so SQLite creates no
``-journal``, ``-wal`` or ``-shm`` file next to it. A database left with a non-empty
``-wal`` (the reference server died before a checkpoint) is copied to a temporary folder
first, because an immutable open would not see the rows that only live in the WAL.

The reference writes naive local times; :class:`TimeLocalizer` gives them the offset of the
zone they were written in, so a stored ``created_at[:10]`` is still the local date and every
time compares correctly with nekomem's offset-aware ones.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from nekomem.domain.turns import Turn, from_disk, parse_iso
from nekomem.importer.report import Problem

# Files of a reference character folder, by layer.
RECENT = "recent.json"
RECENT_META = "recent_meta.json"
TIME_INDEX = "time_indexed.db"
FACTS = "facts.json"
FACTS_ARCHIVE = "facts_archive.json"
REFLECTIONS = "reflections.json"
REFLECTION_ARCHIVE = "reflection_archive"
SURFACED = "surfaced.json"
PERSONA = "persona.json"
PERSONA_CORRECTIONS = "persona_corrections.json"
CURSORS = "cursors.json"
OUTBOX = "outbox.ndjson"
EVENTS = "events.ndjson"
EVENTS_APPLIED = "events_applied.json"
CHARACTER_FILES = (RECENT, TIME_INDEX, FACTS, REFLECTIONS, PERSONA)
# Per-character files the import reads for a report but does not take.
BOOKKEEPING_FILES = (
    OUTBOX,
    EVENTS,
    EVENTS_APPLIED,
    "synth_backoff.json",
    "facts_pending_dedup.json",
    "external_import_state.json",
    "anti_repeat_corpus.json",
)
# Process-wide files of a reference memory folder (nekomem has no counterpart).
ROOT_FILES = ("idle_maintenance_state.json", "speaker_trust.json", "core_config.json")

_V1_SECTIONS = {"user": "master", "ai": "neko"}
# Fields that scope a record to a group chat or participant instead of the owner.
SUBJECT_FIELDS = ("subject_kind", "subject_id", "scope")


class SourceError(ValueError):
    """The source folder cannot be imported at all (missing, not a folder, overlaps the
    target, a named character is absent); ``code`` is the machine-readable reason."""

    def __init__(self, message: str, code: str = "bad_source_dir") -> None:
        super().__init__(message)
        self.code = code


class TimeLocalizer:
    """Gives naive times the offset of the zone the source wrote them in.

    ``zone`` is an IANA name, or empty for this machine's local zone. Raises SourceError
    for an unknown zone name.
    """

    def __init__(self, zone: str = "") -> None:
        try:
            self._zone = ZoneInfo(zone) if zone else None
        except (ZoneInfoNotFoundError, ValueError):
            raise SourceError(f"unknown time zone {zone!r} (setting import_source_timezone)", "bad_timezone") from None

    def moment(self, value: Any) -> datetime | None:
        """The aware datetime of a stored time; None when it is not ISO 8601."""
        if not isinstance(value, str):
            return None
        parsed = parse_iso(value.strip().replace(" ", "T", 1), naive_tz=None)
        if parsed is None:
            return None
        if parsed.tzinfo is not None:
            return parsed
        return parsed.replace(tzinfo=self._zone) if self._zone is not None else parsed.astimezone()

    def text(self, value: Any) -> Any:
        """``value`` as an offset-aware ISO string; other values come back unchanged."""
        moment = self.moment(value)
        return moment.isoformat() if moment is not None else value

    def record(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A copy of a JSON record with every ``*_at`` time (also in ``version_history``)
        and every ``recent_mentions`` time made offset-aware."""
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key.endswith("_at") and isinstance(value, str):
                out[key] = self.text(value)
            elif key == "recent_mentions" and isinstance(value, list):
                out[key] = [self.text(v) for v in value]
            elif key == "version_history" and isinstance(value, list):
                out[key] = [self.record(v) if isinstance(v, dict) else v for v in value]
            else:
                out[key] = value
        return out


class JournalRow(msgspec.Struct, frozen=True):
    """One readable row of the source's time_indexed_original."""

    row_id: int
    session_id: str
    turn: Turn


def is_character_folder(folder: Path) -> bool:
    """True when ``folder`` holds a reference character's files (not a memory root)."""
    return any((folder / name).exists() for name in CHARACTER_FILES)


class SourceCharacter:
    """One character folder of the source. Every reader appends what it could not read
    to ``problems`` and returns what it could."""

    def __init__(self, name: str, folder: Path, localizer: TimeLocalizer, problems: list[Problem]) -> None:
        self.name = name
        self.folder = folder
        self.localize = localizer
        self.problems = problems
        self._records: dict[str, list[dict[str, Any]]] = {}
        self._recent: list[Turn] | None = None
        self._persona: list[tuple[str, dict[str, Any]]] | None = None

    def problem(self, layer: str, file: str, reason: str, record: str | None = None) -> None:
        self.problems.append(Problem(character=self.name, layer=layer, file=file, reason=reason, record=record))

    # -- JSON files --------------------------------------------------------------------
    def read_json(self, layer: str, relative: str) -> Any:
        """The decoded file, or None when it is missing or unreadable (a problem is noted)."""
        path = self.folder / relative
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.problem(layer, relative, f"cannot be read: {exc.strerror or exc}")
            return None
        try:
            return msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            self.problem(layer, relative, f"not valid JSON: {exc}")
            return None

    def records(self, layer: str, relative: str) -> list[dict[str, Any]]:
        """The object items of a JSON list file, times localized; other items are problems.
        Read once: a second call returns the same list without noting problems again."""
        if relative not in self._records:
            self._records[relative] = self._read_records(layer, relative)
        return self._records[relative]

    def _read_records(self, layer: str, relative: str) -> list[dict[str, Any]]:
        raw = self.read_json(layer, relative)
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.problem(layer, relative, f"expected a JSON list, found {type(raw).__name__}")
            return []
        out: list[dict[str, Any]] = []
        for index, item in enumerate(raw):
            if isinstance(item, dict):
                out.append(self.localize.record(item))
            else:
                self.problem(layer, relative, f"expected an object, found {type(item).__name__}", f"[{index}]")
        return out

    def recent(self) -> list[Turn]:
        """recent.json as turns (the memo, a system message, stays at index 0). Read once,
        like records(): the progress bar's count and the import see the same turns."""
        if self._recent is None:
            self._recent = self._read_recent()
        return self._recent

    def _read_recent(self) -> list[Turn]:
        raw = self.read_json("recent", RECENT)
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.problem("recent", RECENT, f"expected a JSON list, found {type(raw).__name__}")
            return []
        turns: list[Turn] = []
        for index, item in enumerate(raw):
            turn = from_disk(item)
            if turn is None:
                self.problem("recent", RECENT, "not a message with text content", f"[{index}]")
                continue
            turns.append(turn)
        return turns

    def recent_meta(self) -> str | None:
        """``last_past_block_update_at`` (older files: ``last_summary_at``), localized."""
        raw = self.read_json("recent_meta", RECENT_META)
        if not isinstance(raw, dict):
            return None
        value = raw.get("last_past_block_update_at") or raw.get("last_summary_at")
        return self.localize.text(value) if self.localize.moment(value) is not None else None

    def persona(self) -> list[tuple[str, dict[str, Any]]]:
        """(entity, entry) pairs of persona.json in file order; v1 sections are migrated.
        Read once, like records()."""
        if self._persona is None:
            self._persona = self._read_persona()
        return self._persona

    def _read_persona(self) -> list[tuple[str, dict[str, Any]]]:
        raw = self.read_json("persona", PERSONA)
        if raw is None:
            return []
        if not isinstance(raw, dict):
            self.problem("persona", PERSONA, f"expected a JSON object, found {type(raw).__name__}")
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        for key, section in raw.items():
            if key.startswith("__"):
                continue  # migration markers of the reference
            if not isinstance(section, dict):
                self.problem("persona", PERSONA, "section is not an object", key)
                continue
            items = section.get("facts", section.get("dynamics", []))
            if not isinstance(items, list):
                self.problem("persona", PERSONA, "section has no list of entries", key)
                continue
            entity = _V1_SECTIONS.get(key) or key
            # A scoped section (``@subject/<kind>:<id>``) names its subject in section
            # fields: every entry carries them, so the subject survives with the entry.
            stamp = {k: section[k] for k in SUBJECT_FIELDS if section.get(k) is not None}
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    out.append((entity, self.localize.record({**stamp, **item})))
                else:
                    self.problem("persona", PERSONA, f"expected an object, found {type(item).__name__}", f"{key}[{index}]")
        return out

    def reflection_shards(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """(shard file name, records) of every ``reflection_archive/*.json``, by name."""
        folder = self.folder / REFLECTION_ARCHIVE
        if not folder.is_dir():
            return []
        shards = []
        for path in sorted(folder.glob("*.json")):
            shards.append((path.name, self.records("reflection_archive", f"{REFLECTION_ARCHIVE}/{path.name}")))
        return shards

    def cursors(self) -> dict[str, str]:
        raw = self.read_json("cursors", CURSORS)
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem("cursors", CURSORS, f"expected a JSON object, found {type(raw).__name__}")
            return {}
        out: dict[str, str] = {}
        for key, value in raw.items():
            if self.localize.moment(value) is None:
                self.problem("cursors", CURSORS, "value is not an ISO 8601 time", key)
                continue
            out[key] = self.localize.text(value)
        return out

    # -- bookkeeping the import does not take ------------------------------------------
    def unapplied_events(self) -> int:
        """Lines of events.ndjson after the source's applied mark (all when unmarked)."""
        try:
            lines = (self.folder / EVENTS).read_bytes().splitlines()
        except OSError:
            return 0
        ids: list[str | None] = []
        for line in lines:
            try:
                event = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            ids.append(event.get("event_id") if isinstance(event, dict) else None)
        applied = self.read_json("events", EVENTS_APPLIED)
        mark = applied.get("last_applied_event_id") if isinstance(applied, dict) else None
        if mark in ids:
            return len(ids) - ids.index(mark) - 1
        return len(ids)

    def pending_outbox(self) -> int:
        """Outbox operations whose last status is not ``done``."""
        try:
            lines = (self.folder / OUTBOX).read_bytes().splitlines()
        except OSError:
            return 0
        status: dict[str, str] = {}
        for line in lines:
            try:
                op = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            if isinstance(op, dict) and isinstance(op.get("op_id"), str):
                status[op["op_id"]] = str(op.get("status"))
        return sum(1 for s in status.values() if s != "done")

    # -- time_indexed.db ---------------------------------------------------------------
    def journal_count(self) -> int:
        """Rows of time_indexed_original (0 when the database is missing or unreadable)."""
        try:
            with _SourceDb(self.folder / TIME_INDEX) as db:
                return int(db.execute("SELECT COUNT(*) FROM time_indexed_original").fetchone()[0])
        except (sqlite3.Error, OSError):
            return 0

    def journal(self) -> Iterator[JournalRow]:
        """Readable rows of time_indexed_original in id order, with localized times."""
        path = self.folder / TIME_INDEX
        if not path.exists():
            return
        try:
            with _SourceDb(path) as db:
                cursor = db.execute("SELECT id, session_id, message, timestamp FROM time_indexed_original ORDER BY id")
                for row_id, session_id, message, timestamp in cursor:
                    row = self._journal_row(row_id, session_id, message, timestamp)
                    if row is not None:
                        yield row
        except (sqlite3.Error, OSError) as exc:
            self.problem("journal", TIME_INDEX, f"cannot be read as SQLite: {exc}")

    def _journal_row(self, row_id: int, session_id: Any, message: Any, timestamp: Any) -> JournalRow | None:
        where = f"row {row_id}"
        try:
            raw = msgspec.json.decode(message) if isinstance(message, (str, bytes)) else None
        except msgspec.DecodeError:
            raw = None
        turn = from_disk(raw) if raw is not None else None
        if turn is None:
            self.problem("journal", TIME_INDEX, "message is not a JSON message with text content", where)
            return None
        moment = self.localize.moment(timestamp) or self.localize.moment(turn.ts or None)
        if moment is None:
            self.problem("journal", TIME_INDEX, "row has no readable timestamp", where)
            return None
        sid = session_id if isinstance(session_id, str) and session_id else f"neko-row-{row_id}"
        return JournalRow(row_id=row_id, session_id=sid, turn=msgspec.structs.replace(turn, ts=moment.isoformat()))


class _SourceDb:
    """A read-only connection to a source database that leaves its folder untouched."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._db: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            # Rows may live only in the WAL: recover them in a private copy.
            self._tmp = tempfile.TemporaryDirectory(prefix="nekomem-import-")
            copy = Path(self._tmp.name) / self.path.name
            shutil.copyfile(self.path, copy)
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            self._db = sqlite3.connect(copy)
        else:
            self._db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True)
        return self._db

    def __exit__(self, *exc: object) -> None:
        if self._db is not None:
            self._db.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def discover(source: Path, only: list[str] | None) -> tuple[list[tuple[str, Path]], list[str]]:
    """The (name, folder) pairs to import, and the root-level files nekomem does not take.

    ``source`` is a reference memory folder (one sub-folder per character) or a single
    character folder (its name is the character). ``only`` keeps the named characters.
    Raises SourceError when ``source`` is not a folder or a named character is absent.
    """
    if not source.is_dir():
        raise SourceError(f"{source} is not a folder")
    if is_character_folder(source):
        found = [(source.name, source)]
        ignored: list[str] = []
    else:
        # A dot-named folder with a character's files is a character (a legacy ".Carol");
        # temp folders (".nkatmp...") never are.
        found = sorted((p.name, p) for p in source.iterdir() if p.is_dir() and not p.name.startswith(".nkatmp") and is_character_folder(p))
        ignored = [name for name in ROOT_FILES if (source / name).exists()]
    if only:
        names = {name for name, _ in found}
        missing = [name for name in only if name not in names]
        if missing:
            raise SourceError(f"no character folder named {', '.join(missing)} in {source}", "unknown_character")
        found = [(name, folder) for name, folder in found if name in only]
    return found, ignored
