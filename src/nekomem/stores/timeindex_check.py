"""A damaged time_indexed.db found on open, kept aside, and what could be read of it salvaged.

Before its writer opens the journal, :func:`check_journal` looks at it twice:

- SQLite's own ``PRAGMA quick_check`` (a garbage file fails with "file is not a database",
  a truncated one with "database disk image is malformed" or a list of problems);
- the rows the character's other files know of (``known_rows``: ``journal_row`` of
  recent_meta.json, the last row the window folded in) against the journal's high-water
  mark: a zero-length or replaced file passes SQLite's check but has lost rows.

A damaged journal is never repaired in place nor silently replaced: the file (with its
``-wal`` and ``-shm``) is renamed to ``time_indexed.db.damaged-<UTC stamp>`` beside it, the
rows that can still be read from that copy are copied, with their ids, into a new journal,
and the :class:`JournalDamage` returned says what happened, for ``/health`` and the memory
browser. :func:`damaged_copies` lists the copies kept aside (the browser shows the
character as damaged while one is there).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from nekomem.stores.atomic import fsync_dir
from nekomem.stores.timeindex_read import ORIGINAL_TABLE

log = logging.getLogger("nekomem.stores.timeindex")

DAMAGED_TAG = ".damaged-"
_SIDE_FILES = ("-wal", "-shm")
_SQLITE_MAGIC = b"SQLite format 3\x00"


class JournalDamage(msgspec.Struct, frozen=True):
    """``reason``: what was wrong; ``kept_aside``: the name of the damaged copy (None when
    the file was missing); ``salvaged_rows``: rows copied into the new journal;
    ``known_rows``: the last row id the character's views knew of."""

    reason: str
    kept_aside: str | None
    salvaged_rows: int
    known_rows: int

    def describe(self) -> str:
        kept = f"kept aside as {self.kept_aside}" if self.kept_aside else "no file to keep"
        return (
            f"time_indexed.db was damaged ({self.reason}); {kept}; serving a new journal with the "
            f"{self.salvaged_rows} row(s) that could be read (the views knew of {self.known_rows})"
        )


def _high_water(db: sqlite3.Connection) -> int:
    """The largest row id the journal ever gave (AUTOINCREMENT keeps it after deletions)."""
    top = db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {ORIGINAL_TABLE}").fetchone()[0]
    try:
        seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (ORIGINAL_TABLE,)).fetchone()
    except sqlite3.OperationalError:  # no AUTOINCREMENT table yet
        seq = None
    return max(int(top or 0), int(seq[0]) if seq and seq[0] is not None else 0)


def inspect(path: Path, known_rows: int) -> str | None:
    """What is wrong with the journal at ``path`` (None: nothing). A missing file is wrong
    only when rows are known. Raises nothing for a damaged file; OSError propagates."""
    if not path.exists():
        return f"the file is missing, the views knew of {known_rows} row(s)" if known_rows > 0 else None
    try:
        db = sqlite3.connect(path, timeout=5)
    except sqlite3.Error as exc:
        return f"cannot be opened: {exc}"
    try:
        problems = [str(row[0]) for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            return "SQLite's quick_check: " + "; ".join(problems[:3])
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        high = _high_water(db) if ORIGINAL_TABLE in tables else 0
    except sqlite3.DatabaseError as exc:
        return f"unreadable: {exc}"
    finally:
        db.close()
    if high < known_rows:
        size = path.stat().st_size
        return f"it holds rows up to {high} but the views knew of {known_rows} ({size} bytes)"
    return None


def _set_aside(path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}{DAMAGED_TAG}{stamp}")
    os.replace(path, target)
    for side in _SIDE_FILES:
        # The copy keeps its WAL under the name SQLite looks for (<copy>-wal).
        if Path(f"{path}{side}").exists():
            os.replace(f"{path}{side}", f"{target}{side}")
    fsync_dir(path.parent)
    return target


def salvage(copy: Path) -> list[tuple[int, str | None, str, str | None]]:
    """Every row of ``time_indexed_original`` that can still be read from ``copy``, in id
    order; reading stops at the first unreadable page. The copy itself is left as it is:
    the rows are read from a scratch copy beside it whose header's page count is set to
    the pages the file really has (a truncated file's header promises pages beyond its
    end, and SQLite then refuses even the schema)."""
    with tempfile.TemporaryDirectory(dir=copy.parent, prefix=".nkatmp-salvage-") as scratch:
        work = Path(scratch) / "journal.db"
        data = bytearray(copy.read_bytes())
        if data.startswith(_SQLITE_MAGIC) and len(data) >= 100:
            page_size = int.from_bytes(data[16:18], "big") or 65536
            if page_size == 1:
                page_size = 65536
            data[28:32] = (len(data) // page_size).to_bytes(4, "big")
        work.write_bytes(data)
        wal = Path(f"{copy}-wal")
        if wal.exists() and wal.stat().st_size:
            shutil.copyfile(wal, f"{work}-wal")
        return _read_rows(work)


def _read_rows(path: Path) -> list[tuple[int, str | None, str, str | None]]:
    rows: list[tuple[int, str | None, str, str | None]] = []
    try:
        db = sqlite3.connect(path, timeout=5)
    except sqlite3.Error:
        return rows
    try:
        # Row by row, so that the rows read before the first damaged page are kept.
        for row_id, session_id, message, timestamp in db.execute(
            f"SELECT id, session_id, message, timestamp FROM {ORIGINAL_TABLE} ORDER BY id"
        ):
            if isinstance(message, str):
                rows.append((int(row_id), session_id, message, timestamp))
    except sqlite3.DatabaseError:
        pass  # what was read before the damaged page is kept
    finally:
        db.close()
    return rows


def check_journal(path: Path, known_rows: int) -> tuple[JournalDamage, list[tuple[int, str | None, str, str | None]]] | None:
    """None when the journal at ``path`` is sound; else keep the damaged file aside (see the
    module docstring) and return the damage and the rows salvaged from it, which the caller
    stores into the new journal (see ``TimeIndex.restore_rows``). Raises OSError when the
    file cannot be moved aside."""
    reason = inspect(path, known_rows)
    if reason is None:
        return None
    copy = _set_aside(path) if path.exists() else None
    rows = salvage(copy) if copy is not None else []
    damage = JournalDamage(reason=reason, kept_aside=copy.name if copy else None, salvaged_rows=len(rows), known_rows=known_rows)
    log.warning("journal of %s: %s", path.parent.name, damage.describe())
    return damage, rows


def damaged_copies(folder: Path) -> list[str]:
    """Names of the damaged journals kept aside in ``folder`` (their side files left out)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    prefix = "time_indexed.db" + DAMAGED_TAG
    return sorted(n for n in names if n.startswith(prefix) and not n.endswith(_SIDE_FILES))
