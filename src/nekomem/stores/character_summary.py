"""The per-root summary behind the memory browser's character list.

``<memory root>/character_summary.json`` keeps, for each character folder, what its row of
``GET /api/browse/characters`` shows without asking its actors: its stored turns, the time
of its last one (the key of ``sort=last_conversation``) and the counts of its views. Each
row carries the *stamp* it was read under: the modification times of the character's
folder (an atomic view write renames a file in it), its view folder, its reflection
archive, each file its layers declare (one rewritten in place by hand) and its journal
(``time_indexed.db`` and its WAL). A row whose stamp moved is read
again: its journal at once; its counts by the start-up check below, or, after that, when
the row is next shown.

When the stamps are compared:

- **Every row, once per start** (:meth:`CharacterSummary.check`, run by the runtime after
  its start-up recovery, a few ``stat`` calls per character on a background thread): what
  changed while no server ran (an offline import, a restore, a hand edit) is read again,
  journal and counts, and rows of new characters are read for the first time. So any
  first page after a start reads nothing per character (the first start on a root without
  a summary pays for reading every character's views once). A summary that is missing or
  damaged is rebuilt from the journals this way.
- **After that, only where this process may have written**: a single-node server holds the
  root's lock exclusive, so its own actors and holds are the only writers. The registry
  names the characters active, stopping or held now (``writing``) and tells
  :meth:`CharacterSummary.touch` each one whose files it released since; those rows are
  compared at the next listing. So a page sorted by last conversation reads nothing of
  the other characters. A cluster node shares the root with other writers: it compares
  every row at every such listing (``writing=None``).
- **The rows of the page shown**, always (a constant cost): a file edited by hand while
  the server runs shows when its row does.

The root folder's own listing is reused while the root's modification time holds (a
character folder made or removed moves it), so a page does not read the directory again.

Beside the rows, the summary keeps the start-up recovery's *marks*: for each character it
found with nothing to finish, the identity (inode, size, modification time) of every file
that look read (:func:`recovery_stamp`). The look is a function of those files alone, so
a character whose files kept their identity since is not looked at again: a start opens
the journals of the characters written since the last start, not of every character.

The summary is derived and never authoritative: it holds names and numbers, no memory
text, and deleting it loses nothing (the next start or listing rebuilds it). A stamp is
taken before the files are read, so a write that lands during the read leaves a stamp
older than the files and is read again next time.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.fact_backlog import BACKLOG_FROM, BACKLOG_TO
from nekomem.stores.layout import CharacterPaths, known_entries, scan_characters
from nekomem.stores.timeindex_read import TimeIndexReader

log = logging.getLogger(__name__)

SUMMARY_FILE = "character_summary.json"
SUMMARY_VERSION = 2  # 2: rows carry the fact backlog; a summary of another version is rebuilt

# A cached listing of the root is reused only when the root's modification time was older
# than the listing by this much: a change within the file system's timestamp granularity
# of the previous one may leave the time as it was (coarse clocks tick in milliseconds).
_SETTLED_NS = 100_000_000
# Rows compared per hold of the lock by a full check (listings of a page get in between).
_CHECK_CHUNK = 256


class CharacterRow(msgspec.Struct, kw_only=True):
    """What the summary knows of one character."""

    stamp: list[int]
    turns: int = 0
    last_conversation_at: str | None = None
    # Journal rows waiting in the fact backlog (read with the turns; a passive character's
    # cannot change, an active one's is its recent actor's to publish).
    backlog: int = 0
    # None: not read since the stamp moved (read when the row is next shown).
    counts: dict[str, Any] | None = None


class _SummaryFile(msgspec.Struct, kw_only=True):
    version: int = SUMMARY_VERSION
    characters: dict[str, CharacterRow] = msgspec.field(default_factory=dict)
    # The character folders of the last listing (taken as characters while they are there).
    names: list[str] = msgspec.field(default_factory=list)
    # Start-up recovery found nothing to finish under these file identities (see the module).
    recovery_marks: dict[str, list[int]] = msgspec.field(default_factory=dict)


class _Scan(msgspec.Struct, frozen=True):
    """A listing of the root folder and the root's modification time before it."""

    mtime_ns: int
    started_ns: int
    names: tuple[str, ...]


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def stamp_of(paths: CharacterPaths) -> list[int]:
    """The modification times a change to the character's views or journal moves: its
    folders (an atomic write renames a file in one), every file its layers declare (a file
    rewritten in place, by hand) and the journal with its WAL."""
    folder = str(paths.folder)
    places = dict.fromkeys(
        (
            folder,
            str(paths.facts.parent),
            str(paths.reflection_archive_dir),
            str(paths.recent),
            *(os.path.join(folder, entry) for entry in known_entries()),
            str(paths.time_index_db) + "-wal",
        )
    )
    return [_mtime(p) for p in places]


def recovery_stamp(paths: CharacterPaths) -> list[int]:
    """(inode, size, modification time) of each file the start-up recovery's look at a
    character reads (its journal and the journal's WAL, the outbox, the shared event
    journal and its applied mark); -1s for a file that is missing, and for an empty WAL,
    which holds what a missing one does (a read-only look at the journal makes one)."""
    stamp: list[int] = []
    wal = str(paths.time_index_db) + "-wal"
    for path in (paths.time_index_db, wal, paths.outbox, paths.events, paths.events_applied):
        try:
            st = os.stat(path)
        except OSError:
            stamp += (-1, -1, -1)
            continue
        if path is wal and st.st_size == 0:
            stamp += (-1, -1, -1)
            continue
        stamp += (st.st_ino, st.st_size, st.st_mtime_ns)
    return stamp


def settled_stamp(stamp: Sequence[int], now_ns: int) -> bool:
    """Whether every modification time of a :func:`recovery_stamp` is older than ``now_ns``
    by more than the file system's timestamp granularity (a write within the same tick
    would leave the stamp as it was)."""
    return all(mtime < now_ns - _SETTLED_NS for mtime in stamp[2::3])


def journal_totals(paths: CharacterPaths) -> tuple[int, str | None, int]:
    """(turn count, newest turn time, rows waiting in the fact backlog) of the character's
    time_indexed.db, in one read-only connection; (0, None, 0) without one or when it
    cannot be read (the list's storage trouble says so)."""
    if not paths.time_index_db.exists():
        return 0, None, 0
    try:
        with TimeIndexReader.read_only(paths.time_index_db) as reader:
            turns, last = reader.summary()
            return turns, last, reader.rows_between_cursors(BACKLOG_FROM, BACKLOG_TO)
    except sqlite3.OperationalError:
        # Created a moment ago by an activating character whose recent actor has not yet
        # made its tables (it loads on an actor worker, concurrently with this read).
        return 0, None, 0
    except sqlite3.Error:
        return 0, None, 0  # unreadable, not a database, or malformed


PathsOf = Callable[[str], CharacterPaths]
JournalReader = Callable[[CharacterPaths], tuple[int, str | None, int]]
CountsReader = Callable[[CharacterPaths], dict[str, Any]]


def _chunks(names: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(names), size):
        yield names[start : start + size]


class CharacterSummary:
    """The summary of one memory root (see the module). Thread-safe: listings may run
    concurrently on worker threads."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / SUMMARY_FILE
        self._lock = threading.Lock()  # the rows, the names and the file
        self._rows: dict[str, CharacterRow] | None = None
        self._names: frozenset[str] = frozenset()
        self._marks: dict[str, list[int]] = {}
        self._scan: _Scan | None = None
        # Rows are trusted once a full check ran since the last recheck() (generations).
        self._check_lock = threading.Lock()  # one full check at a time
        self._generation = 0
        self._checked_generation = -1
        # Characters whose files this process released since the last listing looked.
        self._touched_lock = threading.Lock()
        self._touched: set[str] = set()

    # -- what the runtime and the registry tell it ----------------------------------------
    def touch(self, name: str) -> None:
        """Note that this process may have changed ``name``'s files (its actors stopped,
        or a hold of it ended): its row is compared at the next listing. Never blocks on
        a listing."""
        with self._touched_lock:
            self._touched.add(name)

    def recheck(self) -> None:
        """Trust no row until the next full :meth:`check` (a server starts, or folders
        were adopted from outside), and read the file again at the next use."""
        with self._lock:
            self._generation += 1
            self._scan = None
            self._rows = None

    def checked(self) -> bool:
        """Whether a full check ran since the last :meth:`recheck`."""
        with self._lock:
            return self._checked_generation == self._generation

    def check(self, names: Sequence[str], paths_of: PathsOf, read_journal: JournalReader, read_counts: CountsReader | None = None) -> None:
        """Compare the stamp of every one of ``names`` (every character of the root), read
        again the journal of each that moved or has no row, and with ``read_counts`` its
        counts too (the rows of characters gone are dropped by :meth:`names`), and write
        the file if anything changed; nothing when a check already ran since the last
        :meth:`recheck`. A concurrent caller waits for a running check. Raises nothing for
        a summary that cannot be written (logged)."""
        with self._check_lock:
            with self._lock:
                generation = self._generation
                if self._checked_generation == generation:
                    return
            changed = False
            for chunk in _chunks(names, _CHECK_CHUNK):
                changed |= self._refresh(chunk, paths_of, read_journal, read_counts)
            with self._lock:
                self._load()
                if changed or not self.path.exists():
                    self._write()
                self._checked_generation = generation

    # -- listings ------------------------------------------------------------------------
    def names(self, max_length: int) -> list[str]:
        """The characters of the root (:func:`~nekomem.stores.layout.list_characters`),
        the folders of the last listing (kept in the summary) taken as characters while
        they are there. The last listing is reused while the root's modification time
        holds (and no folder of it was still undecided). Rows of characters gone are
        dropped. Raises OSError for a root that cannot be read."""
        root = self.path.parent
        try:
            mtime = os.stat(root).st_mtime_ns
        except FileNotFoundError:
            return []
        with self._lock:
            self._load()
            scan, settled = self._scan, self._names
        if scan is not None and scan.mtime_ns == mtime and scan.started_ns - mtime > _SETTLED_NS:
            return list(scan.names)
        started = time.time_ns()
        names, undecided = scan_characters(root, max_length=max_length, settled=settled)
        with self._lock:
            self._scan = None if undecided else _Scan(mtime, started, tuple(names))
            if set(names) != self._names:
                self._names = frozenset(names)
                rows = self._load()
                for gone in [n for n in rows if n not in self._names]:
                    del rows[gone]
                for gone in [n for n in self._marks if n not in self._names]:
                    del self._marks[gone]
                self._write()
        return names

    def order(self, names: Sequence[str], paths_of: PathsOf, read_journal: JournalReader, *, writing: Collection[str] | None) -> list[str]:
        """``names`` newest conversation first (those without one last, by name). With
        ``writing`` (the characters this process may be writing now: a single-node
        server) and a full :meth:`check` done since the last recheck, the rows are
        trusted except those of ``writing``, of characters touched since the last
        listing and of characters without a row, which are compared; otherwise every
        row of ``names`` is compared (with None: another process may write, a cluster
        node)."""
        if writing is None or not self.checked():
            look: Sequence[str] = names
        else:
            with self._touched_lock:
                touched, self._touched = self._touched, set()
            with self._lock:
                rows = self._load()
                look = [n for n in names if n in touched or n in writing or n not in rows]
        changed = False
        for chunk in _chunks(look, _CHECK_CHUNK):
            changed |= self._refresh(chunk, paths_of, read_journal)
        with self._lock:
            rows = self._load()
            if changed:
                self._write()
            keys = {n: (row.last_conversation_at or "") if (row := rows.get(n)) else "" for n in names}
        # A stable sort: characters with the same time (or none) stay in name order.
        return sorted(names, key=keys.__getitem__, reverse=True)

    def rows(
        self,
        page: Sequence[str],
        paths_of: PathsOf,
        read_journal: JournalReader,
        read_counts: CountsReader,
        known: Collection[str] | None = None,
    ) -> dict[str, CharacterRow]:
        """The row of each of ``page`` (the characters shown), its stamp compared: a row
        that moved is read again (journal and counts), a row without counts gets them.
        Rows of characters not in ``known`` (when given: every character on disk) are
        dropped. The file is rewritten when a row changed; a summary file deleted since
        the last call is rebuilt. A summary that cannot be written is logged (the rows
        are right all the same)."""
        with self._lock:
            if self._rows is not None and not self.path.exists():
                # Deleted behind our back: rebuilt from the views (and checked in full again).
                self._rows, self._names, self._scan = None, frozenset(), None
                self._generation += 1
            rows = self._load()
            changed = bool(rows) and not self.path.exists()
            result: dict[str, CharacterRow] = {}
            for name in page:
                paths = paths_of(name)
                row, _ = _current_row(rows, name, paths, read_journal)
                if row.counts is None:
                    row.counts = read_counts(paths)
                    changed = True
                result[name] = row
            if known is not None:
                for name in [n for n in rows if n not in known]:
                    del rows[name]
                    changed = True
            if changed:
                self._write()
            return result

    def recovery_marks(self) -> dict[str, list[int]]:
        """The start-up recovery's marks (a copy): name -> the stamp it found nothing to
        finish under."""
        with self._lock:
            self._load()
            return dict(self._marks)

    def set_recovery_marks(self, marks: dict[str, list[int]]) -> None:
        """Replace the marks with ``marks`` and write the file (logged when it cannot be
        written: the next start then looks at every character again)."""
        with self._lock:
            self._load()
            if marks == self._marks:
                return
            self._marks = dict(marks)
            self._write()

    def forget(self, name: str) -> None:
        """Drop ``name`` from the summary now (a deleted character leaves no trace in it).
        Raises nothing (a summary that cannot be written is logged)."""
        with self._lock:
            self._scan = None
            rows = self._load()
            self._marks.pop(name, None)
            if name not in rows and name not in self._names:
                return
            rows.pop(name, None)
            self._names = self._names - {name}
            if rows or self._names:
                self._write()
            else:
                self.path.unlink(missing_ok=True)

    # -- under the lock ------------------------------------------------------------------
    def _refresh(
        self, names: Iterable[str], paths_of: PathsOf, read_journal: JournalReader, read_counts: CountsReader | None = None
    ) -> bool:
        """Compare the stamps of ``names``; read the journal of each row that moved or is
        missing, and with ``read_counts`` the counts of each row without them (else they
        wait for the row to be shown). Whether a row changed."""
        changed = False
        with self._lock:
            rows = self._load()
            for name in names:
                paths = paths_of(name)
                row, moved = _current_row(rows, name, paths, read_journal)
                if read_counts is not None and row.counts is None:
                    row.counts = read_counts(paths)
                    moved = True
                changed = changed or moved
        return changed

    def _write(self) -> None:
        rows = self._rows or {}
        if not rows and not self._names and not self._marks:
            return  # nothing to keep: a read of an empty root leaves it empty
        try:
            atomic_write_json(
                self.path, _SummaryFile(characters=rows, names=sorted(self._names), recovery_marks=self._marks), durable=False
            )  # derived: rebuilt when lost
        except OSError:
            log.warning("the character summary %s could not be written", self.path, exc_info=True)

    def _load(self) -> dict[str, CharacterRow]:
        if self._rows is None:
            kept = _SummaryFile()
            try:
                kept = msgspec.json.decode(self.path.read_bytes(), type=_SummaryFile)
            except FileNotFoundError:
                pass
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                log.warning("the character summary %s is unreadable: it is rebuilt from the views", self.path)
            if kept.version != SUMMARY_VERSION:
                kept = _SummaryFile()  # another version's rows lack fields: read them all again
            self._rows, self._names, self._marks = kept.characters, frozenset(kept.names), kept.recovery_marks
        return self._rows


_SUMMARIES: dict[Path, CharacterSummary] = {}
_SUMMARIES_LOCK = threading.Lock()


def summary_of(root: Path) -> CharacterSummary:
    """The one :class:`CharacterSummary` of ``root`` in this process."""
    key = Path(root)
    with _SUMMARIES_LOCK:
        summary = _SUMMARIES.get(key)
        if summary is None:
            summary = _SUMMARIES[key] = CharacterSummary(key)
        return summary


def _current_row(rows: dict[str, CharacterRow], name: str, paths: CharacterPaths, read_journal: JournalReader) -> tuple[CharacterRow, bool]:
    """``name``'s row of ``rows``, read again from its journal (and put in ``rows``) when it
    is missing or its stamp moved; whether it was."""
    stamp = stamp_of(paths)  # before the read: a write during it shows next time
    row = rows.get(name)
    if row is not None and row.stamp == stamp:
        return row, False
    turns, last, backlog = read_journal(paths)
    row = rows[name] = CharacterRow(stamp=stamp, turns=turns, last_conversation_at=last, backlog=backlog)
    return row, True
