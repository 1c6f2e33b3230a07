"""The raw conversation journal of one character: time_indexed.db (SQLite).

Schema (compatible with the reference implementation's file):

- ``time_indexed_original(id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR,
  message TEXT, timestamp DATETIME)``: one row per turn; ``session_id`` is the id of the
  write request that stored it, ``message`` the JSON of :meth:`Turn.to_disk`;
- ``time_indexed_compressed`` with the same columns: created for compatibility, never
  written;
- ``idempotency(key TEXT PRIMARY KEY, response BLOB, created_at REAL)``: the answer of a
  write request that carried an ``Idempotency-Key``, stored in the same transaction as its
  rows, so a retried request is either fully new or fully answered from here. ``key`` is
  ``sha256:`` and the hex SHA-256 of the header (:func:`idempotency_digest`): a client may
  put a turn's text in its key, and a key is only ever compared, so its text never reaches
  the file (nothing to erase when the turn is forgotten). Keys of older files are hashed
  in place when the file is opened (cursor ``idempotency_hashed`` marks it done);
- ``cursors(name TEXT PRIMARY KEY, row_id INTEGER)``: how far the owner's derived work
  has got (e.g. the last row whose post-turn work is recorded in the outbox), written in
  the same transaction as the next append, so work derived from rows is rebuilt from here;
- ``mined_rows(first INTEGER PRIMARY KEY, last INTEGER)``: nekomem's own, the row ranges
  a fact extraction has covered (:mod:`nekomem.stores.turn_coverage`).

**Timestamps.** Every ``timestamp`` this module writes is UTC in one fixed-width form,
``YYYY-MM-DDTHH:MM:SS.ffffff+00:00`` (see :func:`to_utc_iso`); inputs with another offset
are converted, inputs without an offset are taken as UTC. SQLite compares the column as
text, and with a single fixed-width UTC form text order is time order, which is what
``MAX(timestamp)``, ``ORDER BY timestamp`` and ``BETWEEN`` rely on. (A reference database
carries naive local ``YYYY-MM-DD HH:MM:SS`` stamps, which do not sort with these; it is
never used in place: ``nekomem import-neko`` converts its rows into this form.)

Durability: WAL journal with ``synchronous=FULL``, so a committed append survives a crash
or power loss. Erasure: ``secure_delete`` is on, so SQLite overwrites a deleted row's
bytes and the pages it frees; :meth:`TimeIndex.delete_rows` then checkpoints the WAL with
TRUNCATE, which empties the ``-wal`` file that still held the rows' frames. The connection is opened lazily and used by one owning actor at a time
(``check_same_thread`` is off because that actor may be restarted on another thread).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import msgspec

from nekomem.domain.theater import is_theater
from nekomem.domain.turns import Turn
from nekomem.stores import fence
from nekomem.stores.atomic import fsync_dir
from nekomem.stores.private import private_database, private_folder
from nekomem.stores.timeindex_read import (
    DEFAULT_BUSY_TIMEOUT_MS,
    ORIGINAL_TABLE,
    TimeIndexReader,
    TimeIndexRow,
    to_utc_iso,
)
from nekomem.stores.turn_coverage import MINED_SCHEMA, MINED_TABLE, merge_ranges

log = logging.getLogger(__name__)

_ORIGINAL = ORIGINAL_TABLE
_COMPRESSED = "time_indexed_compressed"
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {_ORIGINAL} (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR, message TEXT, timestamp DATETIME)",
    f"CREATE TABLE IF NOT EXISTS {_COMPRESSED} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "session_id VARCHAR, message TEXT, timestamp DATETIME)",
    "CREATE TABLE IF NOT EXISTS idempotency (key TEXT PRIMARY KEY, response BLOB, created_at REAL)",
    "CREATE INDEX IF NOT EXISTS ix_idempotency_created_at ON idempotency(created_at)",
    "CREATE TABLE IF NOT EXISTS cursors (name TEXT PRIMARY KEY, row_id INTEGER)",
    # The window base: recent.json's content after its last change that was not an append
    # of journal rows (compression, review, edit, a cut by the hard cap, an adopted outside
    # edit), and the last row it covers. The window is this plus every later row.
    "CREATE TABLE IF NOT EXISTS recent_base (id INTEGER PRIMARY KEY CHECK (id = 1), row_id INTEGER NOT NULL, items BLOB NOT NULL)",
)
_INSERT_ROW = f"INSERT INTO {_ORIGINAL} (session_id, message, timestamp) VALUES (?, ?, ?)"
_DELETE_CHUNK = 500  # ids bound per DELETE statement
_ONE_STATEMENT_MAX_ROWS = 64  # 3 bound values per row, far below SQLite's variable limit
_INSERT_SQL_BY_COUNT: dict[int, str] = {}


# Connections to fenced files, never closed (see TimeIndex.close).
_ABANDONED: list[sqlite3.Connection] = []


_UPSERT_CURSOR = "INSERT OR REPLACE INTO cursors (name, row_id) VALUES (?, ?)"
_UPSERT_SQL_BY_COUNT: dict[int, str] = {}


def _upsert_cursors(db: sqlite3.Connection, cursors: Mapping[str, int]) -> None:
    """Store ``cursors`` (name -> row id) in one statement: each statement step hands the
    interpreter lock to another thread and back, and a turn's transaction moves two."""
    count = len(cursors)
    sql = _UPSERT_SQL_BY_COUNT.get(count)
    if sql is None:
        sql = _UPSERT_SQL_BY_COUNT[count] = _UPSERT_CURSOR + ", (?, ?)" * (count - 1)
    db.execute(sql, [v for item in cursors.items() for v in item])


def _insert_rows_sql(count: int) -> str:
    """One INSERT statement of ``count`` rows (cached: SQLite's statement cache keys on the text)."""
    sql = _INSERT_SQL_BY_COUNT.get(count)
    if sql is None:
        sql = _INSERT_ROW + ", (?, ?, ?)" * (count - 1)
        _INSERT_SQL_BY_COUNT[count] = sql
    return sql


_TIMESTAMP_INDEX = f"CREATE INDEX IF NOT EXISTS ix_{_ORIGINAL}_timestamp ON {_ORIGINAL}(timestamp)"

_encoder = msgspec.json.Encoder()
IMPORTED_CURSOR = "imported"  # the last row written by append_rows (an import)


def encode_row(session_id: str, turn: Turn) -> tuple[str, str, str]:
    """``(session_id, message, timestamp)`` exactly as :meth:`TimeIndex.append_rows` stores
    them (compare with :meth:`TimeIndex.raw_rows`). Raises ValueError for an invalid ts."""
    ts = to_utc_iso(turn.ts)
    stored = msgspec.structs.replace(turn, ts=ts)
    return session_id, _encoder.encode(stored.to_disk()).decode("utf-8"), ts


_KEYS_HASHED = "idempotency_hashed"  # a cursors row: the keys of this file are digests


def idempotency_digest(key: str) -> str:
    """What the idempotency table stores for the header value ``key``."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class IdempotencyConflict(ValueError):
    """The idempotency key is already stored; nothing of the append was written."""

    def __init__(self, key: str) -> None:
        super().__init__("idempotency key already stored")
        self.key = key


class TimeIndex(TimeIndexReader):
    """time_indexed.db of one character, opened by its one writer (RecentActor).

    ``clock`` supplies ``created_at`` (epoch seconds) of idempotency rows. Every method
    raises sqlite3.Error when the database cannot be used.
    """

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(path, busy_timeout_ms=busy_timeout_ms)
        self._clock = clock
        self.last_row_id = 0  # id of the last row the latest append wrote
        # COUNT(*) and MAX(timestamp), read once and then kept up to date by this writer's
        # appends (rows are never updated; an erasure forgets both, and so does
        # reconcile_theater, which deletes rows; an import writes while the character's
        # actors, and so this object, are closed).
        self._count: int | None = None
        self._last_ts: str | None = None
        self._last_ts_known = False

    def count(self) -> int:
        """Number of stored turns (one COUNT(*) per opening, then counted by the appends)."""
        if self._count is None:
            self._count = super().count()
        return self._count

    def last_timestamp(self) -> str | None:
        """``MAX(timestamp)``: the newest stored turn's time, or None when empty."""
        if not self._last_ts_known:
            self._last_ts = super().last_timestamp()
            self._last_ts_known = True
        return self._last_ts

    def _account(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Account for ``rows`` (session, message, timestamp) just committed."""
        if self._count is not None:
            self._count += len(rows)
        if self._last_ts_known and rows:
            newest = max(ts for _s, _m, ts in rows)
            if self._last_ts is None or newest > self._last_ts:
                self._last_ts = newest

    def close(self) -> None:
        self._count, self._last_ts, self._last_ts_known = None, None, False
        if self._db is not None and not fence.allowed(self.path):
            # Cluster mode, a shard this node lost: SQLite's close may checkpoint the WAL
            # into the file and rewrites the -shm index, i.e. writes after the lease is
            # gone. The connection is left open instead (one descriptor until exit).
            _ABANDONED.append(self._db)
            self._db = None
            log.warning("%s: connection of a lost shard left open unclosed (no write after the fence)", self.path.name)
            return
        super().close()

    # -- connection ----------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        private_folder(self.path.parent)
        created = not self.path.exists()
        private_database(self.path)
        db = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000.0,
            isolation_level=None,  # explicit BEGIN/COMMIT below
            check_same_thread=False,
        )
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("%s: journal_mode is %s, not wal", self.path.name, mode)
            db.execute("PRAGMA synchronous=FULL")
            # An erased turn must not stay readable in a free page or a freed cell.
            db.execute("PRAGMA secure_delete=ON")
            db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            db.execute("BEGIN IMMEDIATE")
            try:
                fence.check_open(self.path)
                schema = db.execute("PRAGMA schema_version").fetchone()[0]
                for statement in _SCHEMA:
                    db.execute(statement)
                for table in (_ORIGINAL, _COMPRESSED):
                    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if "timestamp" not in columns:  # files from before the column existed
                        db.execute(f"ALTER TABLE {table} ADD COLUMN timestamp DATETIME")
                db.execute(_TIMESTAMP_INDEX)
                rehashed = _hash_idempotency_keys(db)
                if rehashed or created or db.execute("PRAGMA schema_version").fetchone()[0] != schema:
                    # The open changes the file (a new one, an older one's schema or keys):
                    # that is a write, checked as every commit is.
                    fence.check(self.path)
                db.execute("COMMIT")
                if rehashed:
                    # The plaintext keys' old page images are in the WAL until it is
                    # copied back and truncated.
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            if created:
                fsync_dir(self.path.parent)
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            fence.check(self.path)  # cluster mode: the last look before the commit
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def __enter__(self) -> TimeIndex:
        return self

    # -- writing -----------------------------------------------------------------------

    def append(
        self,
        session_id: str,
        turns: Sequence[Turn],
        *,
        idempotency_key: str | None = None,
        response: bytes | None = None,
        cursors: Mapping[str, int] | None = None,
    ) -> int:
        """Store the turns (and the idempotency answer, if a key is given, and ``cursors``)
        in one transaction; :attr:`last_row_id` is then the id of the last row written.

        Each row's ``timestamp`` is the turn's ``ts`` in UTC (:func:`to_utc_iso`); the stored
        message carries the same value. Returns the number of rows written. Raises
        ValueError (a turn without a valid ts, a key without a response) and
        :class:`IdempotencyConflict` (key already stored) with nothing written.
        """
        if idempotency_key is not None and response is None:
            raise ValueError("an idempotency key needs the response to remember")
        rows: list[tuple[str, str, str]] = []
        for index, turn in enumerate(turns):
            try:
                ts = to_utc_iso(turn.ts)
            except ValueError as exc:
                raise ValueError(f"turn {index}: {exc}") from None
            stored = msgspec.structs.replace(turn, ts=ts)
            rows.append((session_id, _encoder.encode(stored.to_disk()).decode("utf-8"), ts))
        last_row_id = self.last_row_id
        if 0 < len(rows) <= _ONE_STATEMENT_MAX_ROWS and idempotency_key is None and not cursors:
            # Rows alone: one multi-row INSERT is its own transaction (autocommit), with
            # the same durability as BEGIN/COMMIT around it but one statement step instead
            # of four (each step hands the interpreter lock to another thread and back).
            # AUTOINCREMENT numbers the rows of one statement consecutively.
            db = self._conn()
            fence.check(self.path)  # cluster mode: this statement commits by itself
            last_row_id = int(db.execute(_insert_rows_sql(len(rows)), [v for row in rows for v in row]).lastrowid or 0)
            self.last_row_id = last_row_id
            self._account(rows)
            return len(rows)
        with self._transaction() as db:
            if 0 < len(rows) <= _ONE_STATEMENT_MAX_ROWS:
                # One statement for the rows (numbered consecutively, see above).
                last_row_id = int(db.execute(_insert_rows_sql(len(rows)), [v for row in rows for v in row]).lastrowid or 0)
            else:
                # Each INSERT's lastrowid is the row's id, so no SELECT last_insert_rowid().
                for row in rows:
                    last_row_id = int(db.execute(_INSERT_ROW, row).lastrowid or 0)
            if idempotency_key is not None:
                try:
                    db.execute(
                        "INSERT INTO idempotency (key, response, created_at) VALUES (?, ?, ?)",
                        (idempotency_digest(idempotency_key), response, self._clock()),
                    )
                except sqlite3.IntegrityError:
                    raise IdempotencyConflict(idempotency_key) from None
            if cursors:
                _upsert_cursors(db, cursors)
        self.last_row_id = last_row_id
        self._account(rows)
        return len(rows)

    @staticmethod
    def rows_after_cursor(path: Path, name: str, *, hold: ExitStack | None = None) -> bool:
        """Whether the database at ``path`` holds rows after cursor ``name``, read through a
        read-only connection (no schema change, no writer lock). False when the file, the
        cursor table or the cursor does not exist. ``hold``: the connection, once it has
        read the journal, stays open until ``hold`` closes, so that a writer opened
        meanwhile (the activation this look decides) finds the WAL's index built: the first
        connection to a journal after a crash reads the whole WAL to build it, and a
        connection that closes as the last one leaves the next to build it again."""
        if not Path(path).exists():
            return False
        try:
            db = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True, timeout=DEFAULT_BUSY_TIMEOUT_MS / 1000.0)
        except sqlite3.Error:
            return False
        keeper: ExitStack | None = None  # set once the journal was read
        try:
            # fetchall: each statement ends here, so a held connection holds no read snapshot.
            rows = db.execute("SELECT row_id FROM cursors WHERE name = ?", (name,)).fetchall()
            keeper = hold
            if not rows or rows[0][0] is None:
                return False
            top = db.execute(f"SELECT MAX(id) FROM {_ORIGINAL}").fetchall()
            return bool(top) and top[0][0] is not None and int(top[0][0]) > int(rows[0][0])
        except sqlite3.Error:
            keeper = None
            return False
        finally:
            if keeper is not None:
                keeper.callback(db.close)
            else:
                db.close()

    def set_cursors(self, cursors: Mapping[str, int]) -> None:
        """Store ``cursors`` (name -> row id) in a transaction of their own."""
        if not cursors:
            return
        with self._transaction() as db:
            _upsert_cursors(db, cursors)

    def set_window_base(self, items: bytes) -> int:
        """Store ``items`` (recent.json's bytes) as the window base, covering every row stored
        so far, in a transaction of its own (durable when it returns). Returns that row id.

        The caller must have made recent.json with these bytes durable first: at load, a
        recent.json that is not one of the states since the base is taken as an outside edit.
        """
        with self._transaction() as db:
            top = int(db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {_ORIGINAL}").fetchone()[0])
            db.execute("INSERT OR REPLACE INTO recent_base (id, row_id, items) VALUES (1, ?, ?)", (top, items))
        return top

    def shrink_memory(self) -> None:
        """Free the connection's page cache (after the rows read at load: an active
        character keeps its connection, and those pages would stay with it)."""
        if self._db is not None:
            self._db.execute("PRAGMA shrink_memory")

    def coverage_started(self) -> bool:
        """Whether the journal tracks which rows a memory covers (the ``mined_rows`` table,
        :mod:`nekomem.stores.turn_coverage`)."""
        row = self._conn().execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (MINED_TABLE,)).fetchone()
        return row is not None

    def start_coverage(self, seed: Sequence[tuple[int, int]]) -> None:
        """Create the ``mined_rows`` table with the ranges ``seed`` taken as covered (a
        journal from before coverage was tracked). Raises sqlite3.Error."""
        with self._transaction() as db:
            db.execute(MINED_SCHEMA)
            db.executemany(f"INSERT OR REPLACE INTO {MINED_TABLE} (first, last) VALUES (?, ?)", merge_ranges(seed))

    def mark_mined(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Add the inclusive row ranges ``ranges`` to the covered rows (merged with those
        stored, so the table stays small). Raises sqlite3.Error."""
        if not ranges:
            return
        with self._transaction() as db:
            db.execute(MINED_SCHEMA)
            stored = [(int(a), int(b)) for a, b in db.execute(f"SELECT first, last FROM {MINED_TABLE}")]
            merged = merge_ranges([*stored, *ranges])
            if merged != stored:
                db.execute(f"DELETE FROM {MINED_TABLE}")
                db.executemany(f"INSERT INTO {MINED_TABLE} (first, last) VALUES (?, ?)", merged)

    def window_base(self) -> tuple[int, bytes] | None:
        """The stored window base ``(last row covered, recent.json bytes)``, or None when none
        was ever stored (a folder from before the base existed)."""
        row = self._conn().execute("SELECT row_id, items FROM recent_base WHERE id = 1").fetchone()
        return (int(row[0]), bytes(row[1])) if row is not None else None

    def cursor(self, name: str) -> int | None:
        """The stored row id of cursor ``name``; None when never set."""
        row = self._conn().execute("SELECT row_id FROM cursors WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else None

    def max_row_id(self) -> int:
        """The id of the newest row (0 when empty)."""
        row = self._conn().execute(f"SELECT MAX(id) FROM {_ORIGINAL}").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def count_between(self, after: int, upto: int) -> int:
        """How many rows have ``after < id <= upto`` (0 when the range is empty)."""
        if upto <= after:
            return 0
        row = self._conn().execute(f"SELECT COUNT(*) FROM {_ORIGINAL} WHERE id > ? AND id <= ?", (int(after), int(upto))).fetchone()
        return int(row[0]) if row else 0

    def rows_after(self, row_id: int, limit: int | None = None) -> list[TimeIndexRow]:
        """Rows with an id above ``row_id``, oldest first (at most ``limit``)."""
        sql = f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE id > ? ORDER BY id"
        params: list[object] = [row_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return self._rows(sql, params)

    def append_rows(self, rows: Sequence[tuple[str, Turn]]) -> int:
        """Store ``(session_id, turn)`` rows of several sessions in one transaction (an
        import of another server's journal). Timestamps as in :meth:`append`; raises
        ValueError (nothing written) when a turn has no valid ts. Imported rows are
        history: in the same transaction every cursor moves past them and ``imported``
        records the last of them, so no work is derived from them later."""
        encoded: list[tuple[str, str, str]] = []
        for index, (session_id, turn) in enumerate(rows):
            try:
                encoded.append(encode_row(session_id, turn))
            except ValueError as exc:
                raise ValueError(f"row {index}: {exc}") from None
        with self._transaction() as db:
            db.executemany(
                f"INSERT INTO {_ORIGINAL} (session_id, message, timestamp) VALUES (?, ?, ?)",
                encoded,
            )
            if encoded:
                top = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
                db.execute("UPDATE cursors SET row_id = ? WHERE row_id < ?", (top, top))
                db.execute("INSERT OR REPLACE INTO cursors (name, row_id) VALUES (?, ?)", (IMPORTED_CURSOR, top))
        self._account(encoded)
        return len(encoded)

    def reconcile_theater(self, events: Sequence[tuple[str, Sequence[tuple[Turn, str | None]]]], marker: str) -> tuple[int, int]:
        """Rebuild the theater rows from ``events`` (session id -> ``(turn, stamp)`` list;
        ``stamp`` an ISO time or None) in one transaction: every row whose message contains
        ``marker`` (the theater's source tag) and is a theater row goes, then each event's
        turns are inserted. An event whose rows are unchanged keeps its stored timestamps.
        Returns ``(rows removed, rows stored)``. Rows of ordinary turns are never touched."""
        db = self._conn()
        # Deleting a memory deletes it: freed pages are zeroed (secure_delete) and, after
        # the commit, the WAL holding the old page images is checkpointed and truncated.
        db.execute("PRAGMA secure_delete=ON")
        with self._transaction() as db:
            found = db.execute(
                f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE message LIKE ? ORDER BY id", (f"%{marker}%",)
            ).fetchall()
            existing: dict[str, list[tuple[str, object]]] = {}
            doomed: list[int] = []
            for row_id, session_id, message, stamp in found:
                turn = self._turn(int(row_id), message, stamp)
                if turn is None or not is_theater(turn):
                    continue
                doomed.append(int(row_id))
                existing.setdefault(str(session_id or ""), []).append((str(message), stamp))
            db.executemany(f"DELETE FROM {_ORIGINAL} WHERE id = ?", [(i,) for i in doomed])
            stored = 0
            for session_id, turns in events:
                encoded = [_encoder.encode(turn.to_disk()).decode("utf-8") for turn, _ in turns]
                before = existing.get(session_id, [])
                same = [m for m, _ in before] == encoded
                for index, (message, (_turn, stamp)) in enumerate(zip(encoded, turns, strict=True)):
                    ts = before[index][1] if same else (to_utc_iso(stamp) if stamp else None)
                    last = int(db.execute(_INSERT_ROW, (session_id, message, ts)).lastrowid or 0)
                    self.last_row_id = last
                    stored += 1
        if doomed:
            self.scrub_wal()
        # Rows were deleted: the counters kept by appends are read again on next use.
        self._count, self._last_ts, self._last_ts_known = None, None, False
        return len(doomed), stored

    def delete_rows(self, row_ids: Collection[int]) -> list[TimeIndexRow]:
        """Erase the rows with these ids (unknown ids are skipped) so that no byte of them
        stays in the files: deleted with ``secure_delete`` on, in one transaction, then the
        WAL is checkpointed and truncated (:meth:`scrub_wal`). Returns the readable rows
        that were erased, oldest first (their turns name what must go from the copies)."""
        ids = sorted({int(i) for i in row_ids})
        if not ids:
            return []
        erased: list[TimeIndexRow] = []
        self._conn()
        with self._transaction() as db:
            for start in range(0, len(ids), _DELETE_CHUNK):
                chunk = ids[start : start + _DELETE_CHUNK]
                marks = ",".join("?" * len(chunk))
                erased += self._rows(f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE id IN ({marks}) ORDER BY id", chunk)
                db.execute(f"DELETE FROM {_ORIGINAL} WHERE id IN ({marks})", chunk)
        self._count, self._last_ts, self._last_ts_known = None, None, False
        self.scrub_wal()
        return erased

    def row_ids_of(self, turn: Turn) -> list[int]:
        """Ids of the rows that store ``turn`` (same role, text and time; a window item
        whose time is not readable matches nothing)."""
        try:
            ts = to_utc_iso(turn.ts)
        except ValueError:
            return []
        rows = self._rows(f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE timestamp = ? ORDER BY id", (ts,))
        text = turn.text.strip()
        return [r.id for r in rows if r.turn.role == turn.role and r.turn.text.strip() == text]

    def row_ids_between(self, start_iso: str, end_iso: str) -> list[int]:
        """Ids of the rows with ``start <= timestamp <= end`` (bounds as in
        :meth:`rows_between`, ValueError when unparseable), unreadable rows included."""
        start, end = to_utc_iso(start_iso), to_utc_iso(end_iso)
        sql = f"SELECT id FROM {_ORIGINAL} WHERE timestamp BETWEEN ? AND ? ORDER BY id"
        return [int(r[0]) for r in self._conn().execute(sql, (start, end))]

    def scrub_wal(self) -> bool:
        """Copy the WAL into the database and truncate it to zero bytes (readers are waited
        for up to the busy timeout); True when it was emptied."""
        busy, _frames, _done = self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            log.warning("%s: the WAL could not be emptied (a reader held it)", self.path.name)
        return not busy

    def restore_rows(
        self, rows: Sequence[tuple[int, str | None, str, str | None]], cursors: Mapping[str, int] | None = None, sequence: int = 0
    ) -> int:
        """Store ``(id, session_id, message, timestamp)`` rows exactly as given, ids kept,
        ``cursors``, and the last id ever given (``sequence``: a new row never takes the id
        of an erased one), in one transaction (a restore into an empty database, or the rows
        salvaged from a damaged journal into a new one: rows and cursors of the copy, so
        derived work resumes where the copy stood). Raises
        sqlite3.IntegrityError (nothing written) when an id is already stored."""
        with self._transaction() as db:
            db.executemany(f"INSERT INTO {_ORIGINAL} (id, session_id, message, timestamp) VALUES (?, ?, ?, ?)", list(rows))
            if sequence > max((r[0] for r in rows), default=0):
                db.execute("DELETE FROM sqlite_sequence WHERE name = ?", (_ORIGINAL,))
                db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (_ORIGINAL, sequence))
            if cursors:
                db.executemany("INSERT OR REPLACE INTO cursors (name, row_id) VALUES (?, ?)", list(cursors.items()))
        self._count, self._last_ts, self._last_ts_known = None, None, False
        return len(rows)

    def idempotent_response(self, key: str, *, newer_than: float | None = None) -> bytes | None:
        """The stored answer for ``key``; None when unknown (or created before ``newer_than``)."""
        row = self._conn().execute("SELECT response, created_at FROM idempotency WHERE key = ?", (idempotency_digest(key),)).fetchone()
        if row is None:
            return None
        response, created_at = row
        if newer_than is not None and (created_at is None or created_at < newer_than):
            return None
        return bytes(response) if response is not None else None

    def purge_idempotency(self, older_than: float) -> int:
        """Forget idempotency answers created before the epoch time ``older_than``; return how many."""
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM idempotency WHERE created_at < ?", (older_than,))
            return cursor.rowcount


def _hash_idempotency_keys(db: sqlite3.Connection) -> int:
    """Replace the plaintext keys of a file from before they were hashed by their digests
    (once: the ``idempotency_hashed`` cursor marks it), inside the caller's transaction;
    returns how many keys were replaced."""
    if db.execute("SELECT 1 FROM cursors WHERE name = ?", (_KEYS_HASHED,)).fetchone() is not None:
        return 0
    keys = [str(row[0]) for row in db.execute("SELECT key FROM idempotency")]
    for key in keys:
        db.execute("UPDATE OR REPLACE idempotency SET key = ? WHERE key = ?", (idempotency_digest(key), key))
    db.execute("INSERT OR REPLACE INTO cursors (name, row_id) VALUES (?, 1)", (_KEYS_HASHED,))
    return len(keys)


__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "IdempotencyConflict", "idempotency_digest", "TimeIndex", "TimeIndexRow", "encode_row", "to_utc_iso"]
