"""A damaged time_indexed.db found on open, kept aside, and what could be read of it salvaged.

Before its writer opens the journal, :func:`check_journal` looks at it, through SQLite only:

- SQLite's first read: a garbage file fails with "file is not a database", a file shorter
  than the pages its header counts (a truncated copy, no WAL holding the rest) with
  "database disk image is malformed";
- SQLite's own ``PRAGMA quick_check`` (it reads every page), unless the caller knows the
  file was checked before and since then only written through SQLite on this machine (see
  :func:`journal_identity`): after a crash or a failover it made each activation several
  times dearer;
- the rows the character's other files know of (``known_rows``: ``journal_row`` of
  recent_meta.json, the last row the window folded in) against the journal's high-water
  mark: a zero-length or replaced file passes SQLite's check but has lost rows.

**Never a descriptor of the journal outside SQLite.** Closing any descriptor of a file drops
every POSIX lock the process holds on it, SQLite's included; SQLite does not know and does
not take them again. In WAL mode each connection's shared lock is what tells other
processes the WAL is in use: without it, another process closing its connection (in a
cluster, a previous owner's left open until it exits) checkpoints and deletes the WAL under
this process's writer, and every turn committed after that is lost to the next reader. A
read connection of this process may be open while an activation checks (a browse request,
the character list's counts), so the check reads the header through SQLite, as the first
read does, and never opens the file itself.

**When the full check can be left out.** A journal in WAL mode with ``synchronous=FULL``
is not damaged by a process killed mid-write (SQLite's commit protocol), only by what
happens below or beside it: a power cut on a disk that lies about flushes, a copy or
restore of the file, an outside writer, a failing disk. The caller stores
:func:`journal_identity` (the kernel's boot id, the file's device and inode) after a
full check that found nothing; while the identity is the same, no reboot (so no power
cut) happened and the file was not replaced, and SQLite's first read and the row check are enough.
A page damaged in place without either is found when SQLite reads it: the layer crashes,
and its restart runs the full check (the caller asks for it on every load but the first).

**The environment's faults are not damage.** A full disk, a read-only mount or a failing
disk makes SQLite's first read fail too (a WAL journal opened with no ``-shm`` left needs
room for one: ``SQLITE_IOERR_SHMSIZE`` on a full disk). Those raise the classified
:class:`~nekomem.stores.faults.StorageError` instead: the file is sound, the layer answers
with the fault and loads again once the disk recovers. Keeping a sound journal aside
because the disk was full would serve an empty one in its place.

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
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

import msgspec

from nekomem.stores.atomic import fsync_dir
from nekomem.stores.faults import StorageError, classify
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


_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_boot: list[str | None] = []  # read once per process


def _boot_id() -> str | None:
    """The running kernel's boot id (a new one after every reboot), or None where the
    system has none (the full check then always runs)."""
    if not _boot:
        try:
            _boot.append(_BOOT_ID.read_text(encoding="ascii").strip() or None)
        except OSError:
            _boot.append(None)
    return _boot[0]


def journal_identity(path: Path) -> str | None:
    """``<boot id>:<device>:<inode>`` of the journal at ``path``: equal to the value stored
    after its last full check while this machine has not rebooted and the file was not
    replaced (see the module docstring). None when the file is missing or the boot id
    unknown. Raises nothing."""
    boot = _boot_id()
    if boot is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return f"{boot}:{st.st_dev}:{st.st_ino}"


def quick_check(db: sqlite3.Connection) -> list[str]:
    """SQLite's ``PRAGMA quick_check`` of the open journal: ``["ok"]`` or the problems it
    found (it reads every page). Raises sqlite3.DatabaseError for an unreadable file."""
    return [str(row[0]) for row in db.execute("PRAGMA quick_check")]


def inspect(path: Path, known_rows: int, *, full: bool = True, hold: ExitStack | None = None) -> str | None:
    """What is wrong with the journal at ``path`` (None: nothing). A missing file is wrong
    only when rows are known. ``full``: run SQLite's quick_check too (see the module
    docstring for when it can be left out). ``hold``: when the journal is sound, its
    read connection stays open until ``hold`` closes, so that the writer opened meanwhile
    finds the WAL's index built (the first connection to a journal after a crash reads the
    whole WAL to build it). Raises nothing for a damaged file; raises StorageError (an
    OSError) when SQLite's failure is the environment's (see the module docstring), and
    OSError propagates."""
    if not path.exists():
        return f"the file is missing, the views knew of {known_rows} row(s)" if known_rows > 0 else None
    try:
        # Read-only: the last connection to close a journal in WAL mode copies the WAL
        # back into the file (a checkpoint, with its fsyncs). After a crash that is the
        # whole WAL, and it stalled every activation; the writer opens the file next and
        # checkpoints as it goes.
        db = sqlite3.connect(path.absolute().as_uri() + "?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        _raise_environmental(exc)
        return f"cannot be opened: {exc}"
    sound = False
    try:
        if full:
            problems = quick_check(db)
            if problems != ["ok"]:
                return "SQLite's quick_check: " + "; ".join(problems[:3])
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        high = _high_water(db) if ORIGINAL_TABLE in tables else 0
        sound = high >= known_rows
    except sqlite3.DatabaseError as exc:
        _raise_environmental(exc)
        return f"unreadable: {exc}"
    finally:
        if sound and hold is not None:
            hold.callback(db.close)
        else:
            db.close()
    if not sound:
        size = path.stat().st_size
        return f"it holds rows up to {high} but the views knew of {known_rows} ({size} bytes)"
    return None


def _raise_environmental(exc: sqlite3.Error) -> None:
    """Raise StorageError when SQLite failed on a fault of the disk, not of the file."""
    fault = classify(exc)
    if fault is not None:
        raise StorageError(fault, exc) from exc


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


def check_journal(
    path: Path, known_rows: int, *, full: bool = True, hold: ExitStack | None = None
) -> tuple[JournalDamage, list[tuple[int, str | None, str, str | None]]] | None:
    """None when the journal at ``path`` is sound; else keep the damaged file aside (see the
    module docstring) and return the damage and the rows salvaged from it, which the caller
    stores into the new journal (see ``TimeIndex.restore_rows``). ``full`` and ``hold``: as
    for :func:`inspect`. Raises OSError when the file cannot be moved aside."""
    reason = inspect(path, known_rows, full=full, hold=hold)
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
