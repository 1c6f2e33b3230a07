"""The read-only path into time_indexed.db: other layers read the raw journal without DDL
and without the writer's lock."""

from __future__ import annotations

import sqlite3

import pytest

from nekomem.domain.turns import Turn
from nekomem.stores.timeindex import TimeIndex
from nekomem.stores.timeindex_read import TimeIndexReader


def _turn(text: str, ts: str) -> Turn:
    return Turn(role="human", text=text, ts=ts)


def test_reader_sees_committed_rows_while_the_writer_holds_its_lock(tmp_path):
    path = tmp_path / "time_indexed.db"
    writer = TimeIndex(path)
    writer.append("s1", [_turn("first", "2026-01-01T10:00:00+00:00"), _turn("second", "2026-01-01T11:00:00+00:00")])
    db = writer._conn()
    db.execute("BEGIN IMMEDIATE")  # the writer is mid-transaction: a second writer would wait
    try:
        with TimeIndexReader.read_only(path, busy_timeout_ms=100) as reader:
            turns = reader.between("2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00")
            assert [t.text for t in turns] == ["first", "second"]
            assert reader.count() == 2
    finally:
        db.execute("ROLLBACK")
        writer.close()


def test_reader_cannot_write_and_does_not_create_the_file(tmp_path):
    path = tmp_path / "time_indexed.db"
    reader = TimeIndexReader.read_only(path)
    with pytest.raises(sqlite3.Error):
        reader.count()
    assert not path.exists()
    with TimeIndex(path) as writer:
        writer.append("s1", [_turn("x", "2026-01-01T10:00:00+00:00")])
    with TimeIndexReader.read_only(path) as reader, pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._conn().execute("CREATE TABLE t (x)")
