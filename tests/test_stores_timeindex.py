"""time_indexed.db: schema, appends, idempotency in the same transaction, reads."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nekomem.domain.turns import Turn
from nekomem.stores.timeindex import IdempotencyConflict, TimeIndex, to_utc_iso


@pytest.fixture
def index(tmp_path: Path):
    store = TimeIndex(tmp_path / "time_indexed.db", clock=lambda: 1000.0)
    yield store
    store.close()


def _turns(*specs: tuple[str, str, str]) -> list[Turn]:
    return [Turn(role=role, text=text, ts=ts) for role, text, ts in specs]  # type: ignore[arg-type]


def test_opening_is_lazy_and_creates_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "char" / "time_indexed.db"
    store = TimeIndex(path)
    assert not path.exists()
    assert store.count() == 0
    store.close()
    db = sqlite3.connect(path)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"time_indexed_original", "time_indexed_compressed", "idempotency"} <= tables
    columns = [row[1] for row in db.execute("PRAGMA table_info(time_indexed_original)")]
    assert columns == ["id", "session_id", "message", "timestamp"]
    indexes = [row[1] for row in db.execute("PRAGMA index_list(time_indexed_original)")]
    assert any("timestamp" in name for name in indexes)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_append_tail_count_and_last_timestamp(index: TimeIndex) -> None:
    assert index.last_timestamp() is None and index.tail(5) == []
    written = index.append(
        "req-1",
        _turns(
            ("human", "おはよう", "2024-05-01T09:00:00+09:00"),
            ("ai", "good morning", "2024-05-01T00:00:01+00:00"),
        ),
    )
    assert written == 2
    index.append("req-2", _turns(("human", "again", "2024-05-01T00:05:00Z")))
    assert index.count() == 3
    assert index.last_timestamp() == "2024-05-01T00:05:00.000000+00:00"
    tail = index.tail(2)
    assert [t.text for t in tail] == ["good morning", "again"]
    assert tail[0] == Turn(role="ai", text="good morning", ts="2024-05-01T00:00:01.000000+00:00")
    first = index.tail(10)[0]
    assert first.role == "human" and first.ts == "2024-05-01T00:00:00.000000+00:00"  # converted to UTC


def test_stored_rows_use_the_reference_message_shape(index: TimeIndex) -> None:
    index.append("req-9", _turns(("human", "hi", "2024-05-01T00:00:00+00:00")))
    db = sqlite3.connect(index.path)
    session_id, message, timestamp = db.execute("SELECT session_id, message, timestamp FROM time_indexed_original").fetchone()
    db.close()
    assert session_id == "req-9"
    assert timestamp == "2024-05-01T00:00:00.000000+00:00"
    assert json.loads(message) == {
        "type": "human",
        "data": {"content": "hi", "additional_kwargs": {"timestamp": timestamp}},
    }


def test_timestamps_sort_as_text_in_time_order() -> None:
    stamps = [
        "2024-05-01T10:00:00+09:00",  # 01:00Z
        "2024-05-01T00:30:00-01:00",  # 01:30Z
        "2024-05-01T01:30:00.000001Z",
        "2024-05-01T02:00:00",  # naive: UTC
    ]
    converted = [to_utc_iso(s) for s in stamps]
    assert converted == sorted(converted)
    assert len({len(c) for c in converted}) == 1
    with pytest.raises(ValueError):
        to_utc_iso("not a time")


def test_turn_without_timestamp_is_refused_and_nothing_written(index: TimeIndex) -> None:
    with pytest.raises(ValueError):
        index.append("req", [Turn(role="human", text="a", ts="2024-01-01T00:00:00Z"), Turn(role="ai", text="b")])
    assert index.count() == 0


def test_idempotency_row_commits_with_the_rows(index: TimeIndex) -> None:
    turns = _turns(("human", "hello", "2024-05-01T00:00:00+00:00"))
    index.append("req-1", turns, idempotency_key="key-1", response=b'{"status":"cached","count":1}')
    assert index.idempotent_response("key-1") == b'{"status":"cached","count":1}'
    assert index.idempotent_response("other") is None
    with pytest.raises(IdempotencyConflict):
        index.append("req-2", turns * 3, idempotency_key="key-1", response=b"{}")
    assert index.count() == 1  # the conflicting append wrote none of its rows
    with pytest.raises(ValueError):
        index.append("req-3", turns, idempotency_key="key-3")
    assert index.count() == 1 and index.idempotent_response("key-3") is None


def test_idempotency_expiry_and_purge(tmp_path: Path) -> None:
    now = [100.0]
    store = TimeIndex(tmp_path / "t.db", clock=lambda: now[0])
    store.append("a", [], idempotency_key="old", response=b"1")
    now[0] = 200.0
    store.append("b", [], idempotency_key="new", response=b"2")
    assert store.idempotent_response("old", newer_than=150.0) is None
    assert store.idempotent_response("new", newer_than=150.0) == b"2"
    assert store.purge_idempotency(older_than=150.0) == 1
    assert store.idempotent_response("old") is None and store.idempotent_response("new") == b"2"
    store.close()


def test_between_is_inclusive_ordered_by_time_and_limited(index: TimeIndex) -> None:
    # inserted out of time order: between() sorts by timestamp, ties by insertion
    index.append("r1", _turns(("human", "late", "2024-05-03T00:00:00+00:00")))
    index.append(
        "r2",
        _turns(
            ("human", "early", "2024-05-01T00:00:00+00:00"),
            ("ai", "early reply", "2024-05-01T00:00:00+00:00"),
            ("human", "middle", "2024-05-02T00:00:00+00:00"),
        ),
    )
    got = index.between("2024-05-01T09:00:00+09:00", "2024-05-03T00:00:00Z")
    assert [t.text for t in got] == ["early", "early reply", "middle", "late"]
    assert [t.text for t in index.between("2024-05-01T00:00:01Z", "2024-05-02T23:59:59Z")] == ["middle"]
    assert [t.text for t in index.between("2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z", limit=2)] == [
        "early",
        "early reply",
    ]
    rows = index.rows_between("2024-05-01T00:00:00Z", "2024-05-01T00:00:00Z")
    assert [r.session_id for r in rows] == ["r2", "r2"] and rows[0].id < rows[1].id


def test_iter_all_crosses_batches_and_skips_unreadable_rows(index: TimeIndex) -> None:
    turns = [Turn(role="human", text=f"m{i}", ts=f"2024-05-01T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00") for i in range(1203)]
    assert index.append("bulk", turns) == 1203
    db = sqlite3.connect(index.path)
    db.execute("INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('x', 'garbage', NULL)")
    db.commit()
    db.close()
    texts = [t.text for t in index.iter_all()]
    assert texts == [f"m{i}" for i in range(1203)]
    assert index.count() == 1204


def test_data_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with TimeIndex(path) as store:
        store.append("a", _turns(("human", "kept", "2024-05-01T00:00:00Z")))
    with TimeIndex(path) as store:
        assert [t.text for t in store.tail(1)] == ["kept"]


def test_legacy_table_without_timestamp_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE time_indexed_original (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR, message TEXT)")
    db.execute(
        "INSERT INTO time_indexed_original (session_id, message) VALUES ('old', ?)",
        (json.dumps({"type": "ai", "data": {"content": "from before"}}),),
    )
    db.commit()
    db.close()
    with TimeIndex(path) as store:
        assert store.tail(1) == [Turn(role="ai", text="from before", ts="")]
        store.append("new", _turns(("human", "now", "2024-05-01T00:00:00Z")))
        assert store.last_timestamp() == "2024-05-01T00:00:00.000000+00:00"


_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nekomem.domain.turns import Turn
    from nekomem.stores.timeindex import TimeIndex
    store = TimeIndex(Path(sys.argv[1]))
    n = 0
    while True:
        turns = [Turn(role="human", text="x" * 2000, ts="2024-05-01T00:00:00Z") for _ in range(20)]
        store.append(f"req-{n}", turns, idempotency_key=f"k{n}", response=b"ok")
        n += 1
        print(n * 20, flush=True)
    """
)


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL")
def test_sigkill_keeps_every_committed_append_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    child = subprocess.Popen([sys.executable, "-c", _APPENDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        reported = 0
        for _ in range(15):
            line = child.stdout.readline()
            assert line, "appender died early"
            reported = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with TimeIndex(path) as store:
        count = store.count()
        assert count >= reported and count % 20 == 0  # whole transactions only
        db = sqlite3.connect(path)
        keys = db.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0]
        db.close()
        assert keys * 20 == count


def test_cursors_move_with_an_append_and_last_row_id_names_the_turns_row(tmp_path: Path) -> None:
    db = TimeIndex(tmp_path / "time_indexed.db")
    assert db.cursor("post_turn") is None
    assert not TimeIndex.rows_after_cursor(tmp_path / "time_indexed.db", "post_turn")
    db.append("s1", [Turn(role="human", text="one", ts="2026-01-01T00:00:00+00:00")])
    first = db.last_row_id
    db.set_cursors({"post_turn": first})
    # The cursor row is written in the same transaction, after the turns: last_row_id
    # still names the turn's row, not the cursor's.
    db.append("s2", [Turn(role="human", text="two", ts="2026-01-01T00:00:01+00:00")], cursors={"post_turn": first})
    second = db.last_row_id
    assert second == first + 1
    assert [r.turn.text for r in db.rows_after(first)] == ["two"] and db.rows_after(first)[0].id == second
    assert db.max_row_id() == second
    db.close()
    assert TimeIndex.rows_after_cursor(tmp_path / "time_indexed.db", "post_turn")
    db = TimeIndex(tmp_path / "time_indexed.db")
    db.set_cursors({"post_turn": second})
    db.close()
    assert not TimeIndex.rows_after_cursor(tmp_path / "time_indexed.db", "post_turn")


def test_appends_with_and_without_a_transaction_number_rows_alike(tmp_path: Path) -> None:
    """Rows alone go in as one statement; with a cursor, in an explicit transaction. Either
    way the rows get consecutive ids in order and last_row_id names the last of them."""
    db = TimeIndex(tmp_path / "time_indexed.db")
    texts = iter(f"t{i}" for i in range(100))

    def batch(count: int) -> list[Turn]:
        return [Turn(role="human", text=next(texts), ts="2026-01-01T00:00:00+00:00") for _ in range(count)]

    expected: list[tuple[int, str]] = []
    for count, cursors in ((1, None), (3, None), (2, {"post_turn": 1}), (1, None), (70, None)):
        turns = batch(count)
        assert db.append("s", turns, cursors=cursors) == count
        top = db.last_row_id
        expected += [(top - count + 1 + k, t.text) for k, t in enumerate(turns)]
    assert [(r.id, r.turn.text) for r in db.rows_after(0)] == expected
    assert db.max_row_id() == expected[-1][0] and db.cursor("post_turn") == 1
    db.close()


def test_count_and_last_timestamp_follow_the_appends(tmp_path: Path) -> None:
    """Read once from the file, then kept by the writer: the same answers as the queries."""
    path = tmp_path / "time_indexed.db"
    seed = TimeIndex(path)
    seed.append("s", [Turn(role="human", text="old", ts="2026-01-01T00:00:05+00:00")])
    seed.close()
    db = TimeIndex(path)
    assert (db.count(), db.last_timestamp()) == (1, "2026-01-01T00:00:05.000000+00:00")
    db.append("s", [Turn(role="human", text="earlier", ts="2026-01-01T00:00:01+00:00")])  # not newer
    db.append("s", [Turn(role="ai", text=f"r{i}", ts=f"2026-01-01T00:01:0{i}+00:00") for i in range(3)], cursors={"c": 1})
    db.append_rows([("imp", Turn(role="human", text="imported", ts="2026-01-01T00:02:00+00:00"))])
    fresh = TimeIndex(path)
    assert (db.count(), db.last_timestamp()) == (fresh.count(), fresh.last_timestamp()) == (6, "2026-01-01T00:02:00.000000+00:00")
    fresh.close()
    db.close()


def test_the_read_only_looks_find_a_journal_under_a_path_with_uri_characters(tmp_path: Path) -> None:
    # A memory root may sit under a folder named like "notes #2?" or "100%": the read-only
    # looks address the file by URI, so those characters must be escaped, not parsed.
    folder = tmp_path / "memory #2? 100%"
    folder.mkdir()
    db = TimeIndex(folder / "time_indexed.db")
    db.append("s1", [Turn(role="human", text="one", ts="2026-01-01T00:00:00+00:00")])
    db.set_cursors({"post_turn": 0})
    db.close()
    assert TimeIndex.rows_after_cursor(folder / "time_indexed.db", "post_turn")


def test_the_activation_check_keeps_this_process_locks_so_no_other_process_drops_the_wal(tmp_path: Path) -> None:
    """The check an activation runs on the journal (``timeindex_check.check_journal``) must
    not open the file outside SQLite: closing any descriptor of a file drops every POSIX
    lock the process holds on it, SQLite's shared lock included, which is what tells other
    processes the WAL is in use. A read connection open meanwhile (a browse request, the
    listing's count) is enough for SQLite to believe it still holds the lock, so the writer
    opened next takes none; another process's connection (a previous owner's, closed at
    its exit) then checkpoints and deletes the WAL at its close, and every turn the writer
    commits after that is gone for the next reader."""
    from nekomem.stores import timeindex_check
    from nekomem.stores.timeindex_read import TimeIndexReader

    path = (tmp_path / "time_indexed.db").absolute()
    seed = TimeIndex(path)
    seed.append("s", [Turn(role="human", text="one", ts="2026-01-01T00:00:00+00:00")])
    seed.close()
    with TimeIndexReader.read_only(path) as reader:
        assert reader.count() == 1  # a connection of this process, open
        assert timeindex_check.check_journal(path, 1, full=False) is None
        writer = TimeIndex(path)
        writer.append("s", [Turn(role="human", text="two", ts="2026-01-01T00:00:01+00:00")])
        other = "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); db.execute('SELECT COUNT(*) FROM sqlite_master').fetchall(); db.close()"
        subprocess.run([sys.executable, "-c", other, str(path)], check=True)
        assert os.path.exists(f"{path}-wal"), "another process checkpointed and removed the WAL under the open writer"
        writer.append("s", [Turn(role="human", text="three", ts="2026-01-01T00:00:02+00:00")])
        count = (
            "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM time_indexed_original').fetchone()[0])"
        )
        seen = subprocess.run([sys.executable, "-c", count, str(path)], check=True, capture_output=True, text=True).stdout.strip()
        assert seen == "3"
        writer.close()


def _open_descriptors(path: Path) -> int:
    """How many of this process's descriptors are open on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_held_look_keeps_its_connection_until_the_hold_closes_and_blocks_no_checkpoint(tmp_path: Path) -> None:
    """Start-up recovery and a cluster take-over look at a crashed journal, then activate
    the character: the look's read-only connection stays open until the activation has
    loaded (its writer then finds the WAL indexed), reads no snapshot meanwhile, and is
    closed with the hold. The answer is the one an unheld look gives."""
    from contextlib import ExitStack

    live = tmp_path / "live"
    live.mkdir()
    writer = TimeIndex(live / "time_indexed.db")
    writer.append("s", [Turn(role="human", text=f"t{i}", ts="2026-01-01T00:00:00+00:00") for i in range(5)], cursors={"post_turn": 2})
    # The files as a process killed now leaves them: the rows only in the WAL.
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for suffix in ("", "-wal"):
        (crashed / f"time_indexed.db{suffix}").write_bytes((live / f"time_indexed.db{suffix}").read_bytes())
    writer.close()
    path = (crashed / "time_indexed.db").absolute()
    assert TimeIndex.rows_after_cursor(path, "post_turn")
    assert _open_descriptors(path) == 0

    with ExitStack() as held:
        assert TimeIndex.rows_after_cursor(path, "post_turn", hold=held)
        assert _open_descriptors(path) == 1  # the look's connection, still open
        activation = TimeIndex(path)
        activation.append("s", [Turn(role="ai", text="after", ts="2026-01-01T00:00:01+00:00")], cursors={"post_turn": 6})
        # The held connection reads nothing: a checkpoint copies the whole WAL back.
        other = sqlite3.connect(path)
        busy, frames, done = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        other.close()
        assert busy == 0 and frames == done
        assert not TimeIndex.rows_after_cursor(path, "post_turn", hold=held)  # the answer as it is now
    # SQLite closes a file only when no other connection of the process has it open (its
    # locks belong to the process): every descriptor is gone once the writer closes, so
    # the held connection was closed with its hold.
    activation.close()
    assert _open_descriptors(path) == 0
    # Nothing to hold when there is nothing to look at.
    with ExitStack() as held:
        assert not TimeIndex.rows_after_cursor(tmp_path / "none.db", "post_turn", hold=held)
    assert not (tmp_path / "none.db").exists()
