"""The portable form of one character folder (``nekomem export`` / ``backup`` / ``import``
/ ``restore``).

:func:`read_character` turns a character folder into one JSON-ready document: a *quiet*
folder of the server's own (no actor writing it: the server holds the character stopped,
or no server runs), or, with ``untrusted=True``, a folder of a backup, which is read as
something a stranger may have made (see below). :func:`write_characters` makes folders
from documents again. The document (format ``nekomem-character``, version 1;
docs/OPERATIONS.md, "Backup and restore"):

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

An untrusted folder (``nekomem restore``'s source) is read without following any symbolic
link (a linked view, log, archive folder or journal is refused: nekomem never makes one,
and following it would pull files from outside into the memory root), every file is
opened with ``O_NOFOLLOW`` and checked to be a regular file, a view that is not JSON is
refused rather than dropped, and the journal is opened read-only and ``immutable`` (SQLite
writes no ``-wal``/``-shm`` beside it; when the backup holds a ``-wal`` of its own, the
pair is copied into a private temporary folder and read there), reading only real tables
(a view named like the journal's table is refused: it could recurse forever), under a
deadline enforced by SQLite's progress handler.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.layout import ADOPTED_FILE, MIRROR_FILE, RECENT_FILE, TIME_INDEX_FILE
from nekomem.stores.snapshot_check import ARCHIVE_DIRS, FORMAT, LOG_FILES, VERSION, SnapshotError
from nekomem.stores.timeindex_read import ORIGINAL_TABLE

# How far a progress handler lets SQLite run between two looks at the clock.
_PROGRESS_STEPS = 10_000


def _refuse_or_skip(untrusted: bool, message: str) -> None:
    if untrusted:
        raise SnapshotError(message)


def read_regular(path: Path, what: str) -> bytes:
    """The bytes of ``path``, refused (SnapshotError) unless it is a regular file reached
    without a symbolic link at its last component. Raises OSError on I/O."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise SnapshotError(f"{what} is a symbolic link; nekomem never makes one, so it is not restored") from None
        raise exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{what} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def _decode(data: bytes, what: str) -> Any:
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise SnapshotError(f"{what} nests too deeply to be read") from None
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"{what} is not valid JSON ({exc})") from None


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []


# A N.E.K.O. memory folder's bookkeeping of its reference files (importer.neko_folder): not
# memory, and wrong for any other folder (a restored character is adopted afresh).
_NEKO_FOLDER_FILES = frozenset({ADOPTED_FILE, MIRROR_FILE})


def _views(folder: Path, label: str, untrusted: bool) -> dict[str, Any]:
    files: dict[str, Any] = {}

    def take(entry: os.DirEntry[str], rel: str) -> None:
        if not entry.name.endswith(".json") or ".nkatmp" in entry.name or rel in _NEKO_FOLDER_FILES:
            return
        if entry.is_symlink():
            _refuse_or_skip(untrusted, f"{label}/{rel} is a symbolic link; nekomem never makes one, so it is not restored")
            return
        if not entry.is_file(follow_symlinks=False):
            _refuse_or_skip(untrusted, f"{label}/{rel} is not a regular file")
            return
        try:
            files[rel] = _decode(read_regular(Path(entry.path), f"{label}/{rel}"), f"{label}/{rel}")
        except SnapshotError:
            if untrusted:
                raise
            # A live view that cannot be read is the server's to recover (it quarantines it).

    for entry in _entries(folder):
        if entry.name in ARCHIVE_DIRS:
            if entry.is_symlink():
                _refuse_or_skip(untrusted, f"{label}/{entry.name} is a symbolic link; nekomem never makes one, so it is not restored")
            elif entry.is_dir(follow_symlinks=False):
                for shard in _entries(Path(entry.path)):
                    take(shard, f"{entry.name}/{shard.name}")
        else:
            take(entry, entry.name)
    return files


def _log_lines(path: Path, what: str, untrusted: bool) -> list[Any] | None:
    """The parsed lines of a log (None when it is absent, or a link skipped)."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        _refuse_or_skip(untrusted, f"{what} is a symbolic link; nekomem never makes one, so it is not restored")
        return None
    data = read_regular(path, what)
    lines = []
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                lines.append(msgspec.json.decode(raw))
            except (msgspec.DecodeError, RecursionError):
                continue  # a torn last line of an interrupted append: readers skip it too
    return lines


def _check_tables(db: sqlite3.Connection, what: str) -> bool:
    """Whether ``db`` has the cursors table; SnapshotError unless the journal's table is a
    real table (a view of that name could be anything, a recursion without end included)."""
    kinds = dict(db.execute("SELECT name, type FROM sqlite_master WHERE name IN (?, 'cursors', 'sqlite_sequence')", (ORIGINAL_TABLE,)))
    if kinds.get(ORIGINAL_TABLE) != "table":
        raise SnapshotError(f"{what} has no {ORIGINAL_TABLE} table (it is not a nekomem journal)")
    return kinds.get("cursors") == "table" and kinds.get("sqlite_sequence") == "table"


def _read_rows(db: sqlite3.Connection, what: str) -> dict[str, Any]:
    with_cursors = _check_tables(db, what)
    rows = []
    for row_id, session_id, message, timestamp in db.execute(
        f"SELECT id, session_id, message, timestamp FROM {ORIGINAL_TABLE} ORDER BY id"
    ):
        try:
            parsed: Any = msgspec.json.decode(message) if isinstance(message, str) else message
        except (msgspec.DecodeError, RecursionError):
            parsed = message
        rows.append({"id": row_id, "session_id": session_id, "timestamp": timestamp, "message": parsed})
    cursors: dict[str, Any] = {}
    seq = None
    if with_cursors:
        cursors = {name: row for name, row in db.execute("SELECT name, row_id FROM cursors")}
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (ORIGINAL_TABLE,)).fetchone()
    sequence = seq[0] if seq else 0
    return {"rows": rows, "cursors": cursors, "sequence": sequence if isinstance(sequence, int) else 0}


@contextmanager
def _deadline(db: sqlite3.Connection, seconds: float) -> Iterator[None]:
    """SQLite interrupts whatever ``db`` runs once ``seconds`` have passed."""
    limit = time.monotonic() + seconds
    db.set_progress_handler(lambda: 1 if time.monotonic() > limit else 0, _PROGRESS_STEPS)
    try:
        yield
    finally:
        db.set_progress_handler(None, 0)


def _live_journal(db_path: Path) -> dict[str, Any]:
    if not db_path.is_file() or db_path.is_symlink():
        return {"rows": [], "cursors": {}, "sequence": 0}
    # A private copy through SQLite's backup API: one consistent state of the file, WAL
    # included, whatever the source's journal mode.
    source = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    copy = sqlite3.connect(":memory:")
    try:
        source.backup(copy)
    finally:
        source.close()
    try:
        return _read_rows(copy, str(db_path.name))
    finally:
        copy.close()


def _copy_regular(source: Path, target: Path, what: str) -> None:
    """Copy ``source`` (a regular file, not through a link) into a new ``target``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(source, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SnapshotError(f"{what} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as src, open(target, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        os.close(fd)


def _backup_journal(db_path: Path, what: str, seconds: float) -> dict[str, Any]:
    """The journal of a backup folder, read without writing beside it (see the module)."""
    if not os.path.lexists(db_path):
        return {"rows": [], "cursors": {}, "sequence": 0}
    wal = db_path.with_name(db_path.name + "-wal")
    for path, label in ((db_path, what), (wal, what + "-wal")):
        if path.is_symlink():
            raise SnapshotError(f"{label} is a symbolic link; nekomem never makes one, so it is not restored")
    if not db_path.is_file():
        raise SnapshotError(f"{what} is not a regular file")
    try:
        if wal.is_file() and wal.stat().st_size > 0:
            # Committed turns may live only in the -wal (a copy of a root whose server was
            # killed): read the pair in a private folder, where SQLite may write its -shm.
            with tempfile.TemporaryDirectory(prefix="nekomem-restore-") as scratch:
                copy = Path(scratch) / "journal.db"
                _copy_regular(db_path, copy, what)
                _copy_regular(wal, Path(scratch) / "journal.db-wal", what + "-wal")
                db = sqlite3.connect(copy)
                try:
                    with _deadline(db, seconds):
                        return _read_rows(db, what)
                finally:
                    db.close()
        db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            with _deadline(db, seconds):
                return _read_rows(db, what)
        finally:
            db.close()
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise SnapshotError(f"{what}: reading it took longer than {seconds:g} s (setting restore_read_timeout_seconds)") from None
        raise SnapshotError(f"{what} cannot be read as a nekomem journal ({exc})") from None
    except sqlite3.Error as exc:
        raise SnapshotError(f"{what} cannot be read as a nekomem journal ({exc})") from None


def read_character(
    folder: Path, recent: Path | None = None, *, untrusted: bool = False, read_timeout_seconds: float = 300.0
) -> dict[str, Any]:
    """The document of the character folder ``folder`` (see the module docstring).

    ``recent``: the character's recent.json when it is not in ``folder`` (a N.E.K.O. memory
    folder: ``folder`` is ``<name>/.nekomem``, the name is its parent's).
    A folder of the server's own (``untrusted=False``) must be quiet; links and unreadable
    views in it are skipped. A backup's folder (``untrusted=True``) is refused with
    SnapshotError for a link, a file that is not regular, a view that is not JSON, or a
    journal that is not one (or takes longer than ``read_timeout_seconds`` to read).
    Raises OSError (and, for a server's own folder, sqlite3.Error) when it cannot be read.
    """
    label = folder.name
    logs: dict[str, list[Any]] = {}
    for name in LOG_FILES:
        lines = _log_lines(folder / name, f"{label}/{name}", untrusted)
        if lines is not None:
            logs[name] = lines
    files = _views(folder, label, untrusted)
    if recent is not None and recent != folder / RECENT_FILE and os.path.lexists(recent):
        try:
            files[RECENT_FILE] = _decode(read_regular(recent, f"{recent.parent.name}/{RECENT_FILE}"), RECENT_FILE)
        except SnapshotError:
            if untrusted:
                raise
    journal_path = folder / TIME_INDEX_FILE
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": recent.parent.name if recent is not None else folder.name,
        "files": files,
        "logs": logs,
        "journal": _backup_journal(journal_path, f"{label}/{TIME_INDEX_FILE}", read_timeout_seconds)
        if untrusted
        else _live_journal(journal_path),
    }
