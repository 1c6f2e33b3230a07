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


def test_search_pages_matches_and_keeps_unreadable_rows_in_the_page(tmp_path):
    path = tmp_path / "time_indexed.db"
    with TimeIndex(path) as writer:
        writer.append("s1", [_turn("Flying KITES", "2026-01-01T10:00:00+00:00"), _turn("tea", "2026-01-01T11:00:00+00:00")])
        writer.append("s2", [_turn("more kites", "2026-01-01T12:00:00+00:00")])
    db = sqlite3.connect(path)
    db.execute(
        "INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('x', ?, '2026-01-01T13:00:00.000000+00:00')",
        ('{"not": "a turn"}',),
    )
    # Not JSON at all (a damaged row, a hand edit): a text search passes over it instead of
    # failing on SQLite's "malformed JSON", and an unfiltered page still lists it.
    db.execute(
        "INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('x', ?, '2026-01-01T09:00:00.000000+00:00')",
        ("{kites, not json",),
    )
    db.commit()
    db.close()
    with TimeIndexReader.read_only(path) as reader:
        total, page = reader.search(since=None, until=None, text=" kites ", newest_first=True, offset=0, limit=10)
        assert total == 2 and [r.turn.text for r in page if r.turn] == ["more kites", "Flying KITES"]
        total, page = reader.search(since="2026-01-01T10:30:00Z", until=None, text="", newest_first=False, offset=1, limit=1)
        assert total == 3 and page[0].turn is not None and page[0].turn.text == "more kites" and page[0].session_id == "s2"
        total, page = reader.search(since=None, until=None, text="", newest_first=True, offset=0, limit=1)
        assert total == 5 and page[0].turn is None and page[0].timestamp == "2026-01-01T13:00:00.000000+00:00"
        total, page = reader.search(since=None, until=None, text="", newest_first=False, offset=0, limit=1)
        assert total == 5 and page[0].turn is None and page[0].timestamp == "2026-01-01T09:00:00.000000+00:00"
        assert reader.summary() == (5, "2026-01-01T13:00:00.000000+00:00")
        with pytest.raises(ValueError):
            reader.search(since="yesterday-ish", until=None, text="", newest_first=True, offset=0, limit=1)
