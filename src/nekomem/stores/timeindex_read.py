"""Reading time_indexed.db, the raw conversation journal (see :mod:`nekomem.stores.timeindex`).

:class:`TimeIndexReader` is the one path by which another layer than its writer (RecentActor)
reads the journal: :meth:`TimeIndexReader.read_only` opens the file with SQLite's
``mode=ro`` URI, runs no DDL and takes no write lock, so a reader never waits on nor
blocks the writer (WAL readers see the last committed state). The writer
(:class:`~nekomem.stores.timeindex.TimeIndex`) inherits these queries over its own
read-write connection.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import timezone
from pathlib import Path

import msgspec

from nekomem.domain.turns import Turn, from_disk, parse_timestamp
from nekomem.stores.turn_coverage import MINED_TABLE, uncovered_spans

log = logging.getLogger("nekomem.stores.timeindex")

ORIGINAL_TABLE = "time_indexed_original"
DEFAULT_BUSY_TIMEOUT_MS = 5000
# Rows fetched per query by iter_all: bounds memory, not a tunable.
_ITER_BATCH_ROWS = 500
_ORIGINAL = ORIGINAL_TABLE


def to_utc_iso(ts: str) -> str:
    """Canonical stored form of an ISO 8601 timestamp: UTC, microseconds, ``+00:00``.

    A value without offset is taken as UTC. Raises ValueError for anything unparseable.
    """
    if not isinstance(ts, str) or not ts.strip():
        raise ValueError("timestamp must be a non-empty ISO 8601 string")
    try:
        return parse_timestamp(ts).astimezone(timezone.utc).isoformat(timespec="microseconds")
    except (ValueError, OverflowError):
        raise ValueError(f"timestamp {ts!r} is not ISO 8601 (or is out of range)") from None


class TimeIndexRow(msgspec.Struct, frozen=True):
    """A stored turn with its row id and the write request (session) that stored it."""

    id: int
    session_id: str | None
    turn: Turn


class JournalRow(msgspec.Struct, frozen=True):
    """A stored row as the memory browser lists it: ``timestamp`` as stored, ``turn`` None
    when the row's message cannot be read (the browser shows such a row, it does not skip it)."""

    id: int
    session_id: str | None
    timestamp: str | None
    turn: Turn | None


# The SQL of a turn's text inside the stored message (what a journal search matches).
# json_extract raises "malformed JSON" on a row that is not JSON (damaged, edited by hand),
# which would fail the whole search: such a row has no text to match (NULL).
_CONTENT = "(CASE WHEN json_valid(message) THEN json_extract(message, '$.data.content') END)"


class TimeIndexReader:
    """Queries over time_indexed.db. Every method raises sqlite3.Error when the database
    cannot be used (a read-only reader also when the file does not exist)."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._db: sqlite3.Connection | None = None

    @classmethod
    def read_only(cls, path: Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> TimeIndexReader:
        """A reader that never writes (the connection opens on first use)."""
        return cls(path, busy_timeout_ms=busy_timeout_ms)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            db = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_ms / 1000.0, check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            self._db = db
        return self._db

    def close(self) -> None:
        """Close the connection (it reopens on the next use)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> TimeIndexReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------

    @staticmethod
    def _decoded(message: object, timestamp: object) -> Turn | None:
        """The turn of a stored message (its time the row's ``timestamp`` when set), or None
        when the message cannot be read."""
        try:
            raw = msgspec.json.decode(message) if isinstance(message, (str, bytes)) else None
        except msgspec.DecodeError:
            raw = None
        turn = from_disk(raw) if raw is not None else None
        if turn is not None and isinstance(timestamp, str) and timestamp:
            turn = msgspec.structs.replace(turn, ts=timestamp)
        return turn

    def _turn(self, row_id: int, message: object, timestamp: object) -> Turn | None:
        turn = self._decoded(message, timestamp)
        if turn is None:
            log.warning("%s: row %d has no readable message; skipped", self.path.name, row_id)
        return turn

    def _rows(self, sql: str, params: Sequence[object]) -> list[TimeIndexRow]:
        rows: list[TimeIndexRow] = []
        for row_id, session_id, message, timestamp in self._conn().execute(sql, params):
            turn = self._turn(row_id, message, timestamp)
            if turn is not None:
                rows.append(TimeIndexRow(id=row_id, session_id=session_id, turn=turn))
        return rows

    def probe(self) -> None:
        """Read one row: raises sqlite3.OperationalError while the table does not exist yet
        and sqlite3.DatabaseError when the file is damaged (or not a database)."""
        self._conn().execute(f"SELECT 1 FROM {_ORIGINAL} LIMIT 1").fetchall()

    def rows_between_cursors(self, low: str, high: str) -> int:
        """How many rows lie after cursor ``low`` up to cursor ``high`` (0 when either is
        missing or ``high`` is not past ``low``). Raises sqlite3.Error as the reads do."""
        found = dict(self._conn().execute("SELECT name, row_id FROM cursors WHERE name IN (?, ?)", (low, high)).fetchall())
        lo, hi = found.get(low), found.get(high)
        if lo is None or hi is None or hi <= lo:
            return 0
        row = self._conn().execute(f"SELECT COUNT(*) FROM {_ORIGINAL} WHERE id > ? AND id <= ?", (int(lo), int(hi))).fetchone()
        return int(row[0]) if row else 0

    def summary(self) -> tuple[int, str | None]:
        """(number of stored turns, the newest one's time or None), in one query."""
        count, last = self._conn().execute(f"SELECT COUNT(*), MAX(timestamp) FROM {_ORIGINAL}").fetchone()
        return int(count), last

    def search(
        self, *, since: str | None, until: str | None, text: str, newest_first: bool, offset: int, limit: int
    ) -> tuple[int, list[JournalRow]]:
        """(rows matching in all, the page of them from ``offset``): ``since``/``until`` ISO
        8601 bounds (inclusive; ValueError if unparseable), ``text`` a case-insensitive
        (ASCII) substring of the turn's text (blank: any), ordered by time then insertion,
        newest first or oldest first. Unreadable rows are in the page with ``turn`` None."""
        clauses: list[str] = []
        params: list[object] = []
        if since:
            clauses.append("timestamp >= ?")
            params.append(to_utc_iso(since))
        if until:
            clauses.append("timestamp <= ?")
            params.append(to_utc_iso(until))
        if text.strip():
            clauses.append(f"instr(lower({_CONTENT}), lower(?)) > 0")
            params.append(text.strip())
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        order = "DESC" if newest_first else "ASC"
        db = self._conn()
        total = int(db.execute(f"SELECT COUNT(*) FROM {_ORIGINAL}{where}", params).fetchone()[0])
        rows = db.execute(
            f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL}{where} ORDER BY timestamp {order}, id {order} LIMIT ? OFFSET ?",
            [*params, limit, offset],
        ).fetchall()
        page = [
            JournalRow(id=row_id, session_id=session_id, timestamp=timestamp, turn=self._decoded(message, timestamp))
            for row_id, session_id, message, timestamp in rows
        ]
        return total, page

    def last_timestamp(self) -> str | None:
        """``MAX(timestamp)``: the newest stored turn's time, or None when empty."""
        row = self._conn().execute(f"SELECT MAX(timestamp) FROM {_ORIGINAL}").fetchone()
        return row[0] if row and row[0] is not None else None

    def count(self) -> int:
        """Number of stored turns."""
        return int(self._conn().execute(f"SELECT COUNT(*) FROM {_ORIGINAL}").fetchone()[0])

    def mined_ranges(self) -> list[tuple[int, int]] | None:
        """The covered row ranges (:mod:`nekomem.stores.turn_coverage`), ordered; None when
        the journal does not track coverage (yet)."""
        try:
            found = self._conn().execute(f"SELECT first, last FROM {MINED_TABLE} ORDER BY first").fetchall()
        except sqlite3.OperationalError:
            return None
        return [(int(a), int(b)) for a, b in found]

    def shape(self) -> tuple[int, int]:
        """``(newest row id, number of rows)``: changes with every append and erasure."""
        row = self._conn().execute(f"SELECT MAX(id), COUNT(*) FROM {_ORIGINAL}").fetchone()
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

    def uncovered_ids(self, mined: Sequence[tuple[int, int]], top: int, limit: int) -> list[int]:
        """The ids of the newest ``limit`` rows up to id ``top`` outside the ranges
        ``mined``, ascending (one index-only query per gap between the ranges, newest gap
        first)."""
        out: list[int] = []
        for first, last in uncovered_spans(mined, top):
            if len(out) >= limit:
                break
            found = self._conn().execute(
                f"SELECT id FROM {_ORIGINAL} WHERE id >= ? AND id <= ? ORDER BY id DESC LIMIT ?", (first, last, limit - len(out))
            )
            out += [int(r[0]) for r in found]
        out.reverse()
        return out

    def covered_ids(self, mined: Sequence[tuple[int, int]], limit: int) -> list[int]:
        """The ids of the newest ``limit`` rows inside the ranges ``mined``, ascending (one
        index-only query per range, newest range first)."""
        out: list[int] = []
        for first, last in sorted(mined, reverse=True):
            if len(out) >= limit:
                break
            found = self._conn().execute(
                f"SELECT id FROM {_ORIGINAL} WHERE id >= ? AND id <= ? ORDER BY id DESC LIMIT ?", (first, last, limit - len(out))
            )
            out += [int(r[0]) for r in found]
        out.reverse()
        return out

    def rows_by_id(self, ids: Sequence[int]) -> list[TimeIndexRow]:
        """The rows with these ids (those that exist and can be read), ascending."""
        out: list[TimeIndexRow] = []
        wanted = sorted(set(ids))
        for start in range(0, len(wanted), _ITER_BATCH_ROWS):
            chunk = wanted[start : start + _ITER_BATCH_ROWS]
            marks = ",".join("?" * len(chunk))
            out += self._rows(f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE id IN ({marks}) ORDER BY id", chunk)
        return out

    def tail_rows(self, n: int) -> list[TimeIndexRow]:
        """The newest ``n`` rows, oldest first."""
        if n <= 0:
            return []
        rows = self._rows(f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} ORDER BY id DESC LIMIT ?", (n,))
        rows.reverse()
        return rows

    def tail(self, n: int) -> list[Turn]:
        """The newest ``n`` turns, oldest first (insertion order)."""
        if n <= 0:
            return []
        rows = self._rows(
            f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} ORDER BY id DESC LIMIT ?",
            (n,),
        )
        return [row.turn for row in reversed(rows)]

    def rows_between(self, start_iso: str, end_iso: str, limit: int | None = None) -> list[TimeIndexRow]:
        """Rows with ``start <= timestamp <= end`` ordered by timestamp, then insertion.

        Bounds are converted with :func:`to_utc_iso` (ValueError if unparseable). Rows that
        share a timestamp come out together in insertion order, so a caller draining in
        batches can extend a batch to the rows sharing its boundary timestamp.
        """
        start, end = to_utc_iso(start_iso), to_utc_iso(end_iso)
        sql = f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE timestamp BETWEEN ? AND ? ORDER BY timestamp, id"
        params: list[object] = [start, end]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(0, limit))
        return self._rows(sql, params)

    def rows_past(self, after_ts: str, after_id: int, end_iso: str, limit: int) -> list[TimeIndexRow]:
        """At most ``limit`` rows after the position ``(after_ts, after_id)`` in (timestamp,
        id) order and with ``timestamp <= end``, in that order: a cursor over this position
        visits every row once, however many rows share a timestamp.

        Bounds are converted with :func:`to_utc_iso` (ValueError if unparseable).
        """
        start, end = to_utc_iso(after_ts), to_utc_iso(end_iso)
        sql = (
            f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} "
            "WHERE (timestamp > ? OR (timestamp = ? AND id > ?)) AND timestamp <= ? ORDER BY timestamp, id LIMIT ?"
        )
        return self._rows(sql, (start, start, after_id, end, max(0, limit)))

    def between(self, start_iso: str, end_iso: str, limit: int | None = None) -> list[Turn]:
        """Turns of :meth:`rows_between`."""
        return [row.turn for row in self.rows_between(start_iso, end_iso, limit)]

    def iter_all(self) -> Iterator[Turn]:
        """Every stored turn in insertion order, fetched in bounded batches."""
        for row in self.iter_rows():
            yield row.turn

    def _stored(self) -> Iterator[tuple[int, str | None, str, str]]:
        """Every row's stored ``(id, session_id, message, timestamp)`` in insertion order,
        read in bounded batches."""
        last_id = 0
        while True:
            batch = (
                self._conn()
                .execute(
                    f"SELECT id, session_id, message, timestamp FROM {_ORIGINAL} WHERE id > ? ORDER BY id LIMIT ?",
                    (last_id, _ITER_BATCH_ROWS),
                )
                .fetchall()
            )
            if not batch:
                return
            yield from batch
            last_id = batch[-1][0]

    def raw_rows(self) -> Iterator[tuple[str | None, str, str]]:
        """Every row's stored ``(session_id, message, timestamp)``, undecoded, in bounded batches."""
        for _row_id, session_id, message, timestamp in self._stored():
            yield session_id, message, timestamp

    def latest_texts(self, role: str, limit: int, scan_max: int) -> tuple[list[str], int]:
        """The newest ``limit`` texts of turns of ``role``, oldest first, scanning at most
        ``scan_max`` rows from the newest back; also how many rows were unreadable."""
        texts: list[str] = []
        skipped = 0
        before: int | None = None
        scanned = 0
        while len(texts) < limit and scanned < scan_max:
            size = min(_ITER_BATCH_ROWS, scan_max - scanned)
            # Rows below ``before`` (the first batch: below any id), newest first.
            upper = before if before is not None else 2**63 - 1
            sql = f"SELECT id, message, timestamp FROM {_ORIGINAL} WHERE id < ? ORDER BY id DESC LIMIT ?"
            batch = self._conn().execute(sql, (upper, size)).fetchall()
            if not batch:
                break
            scanned += len(batch)
            before = batch[-1][0]
            for row_id, message, timestamp in batch:
                turn = self._turn(row_id, message, timestamp)
                if turn is None:
                    skipped += 1
                elif turn.role == role and turn.text.strip() and len(texts) < limit:
                    texts.append(turn.text)
        texts.reverse()
        return texts, skipped

    def iter_rows(self) -> Iterator[TimeIndexRow]:
        """Every readable row (id, session, turn) in insertion order, in bounded batches."""
        for row_id, session_id, message, timestamp in self._stored():
            turn = self._turn(row_id, message, timestamp)
            if turn is not None:
                yield TimeIndexRow(id=row_id, session_id=session_id, turn=turn)
