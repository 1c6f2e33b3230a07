"""outbox.ndjson: pending, attempts, done, dead letters, compaction, damaged lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nekomem.stores.outbox import Outbox, OutboxRecord

TS = "2024-05-01T00:00:00+00:00"
TS2 = "2024-05-01T00:01:00+00:00"


def test_add_records_a_pending_line(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson")
    op_id = outbox.add("extract_facts", {"messages": [{"type": "human", "data": {"content": "x"}}]}, TS)
    (line,) = outbox.path.read_text().splitlines()
    assert json.loads(line) == {
        "status": "pending",
        "op_id": op_id,
        "type": "extract_facts",
        "ts": TS,
        "payload": {"messages": [{"type": "human", "data": {"content": "x"}}]},
    }
    assert outbox.pending() == [OutboxRecord(op_id=op_id, type="extract_facts", payload=json.loads(line)["payload"], attempts=0, ts=TS)]


def test_attempts_done_and_dead_letters(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson")
    a = outbox.add("extract_facts", {"n": 1}, TS)
    b = outbox.add("extract_facts", {"n": 2}, TS)
    c = outbox.add("synth_reflection", {"n": 3}, TS)
    outbox.attempt(b, "TimeoutError: model did not answer", TS2)
    outbox.attempt(b, "ProviderError: 503", TS2)
    outbox.attempt(c, "ValueError", TS2)
    assert [(r.op_id, r.attempts, r.last_error) for r in outbox.pending()] == [
        (a, 0, ""),
        (b, 2, "ProviderError: 503"),
        (c, 1, "ValueError"),
    ]
    outbox.done(a, TS2)
    outbox.done(c, TS2, dead=True)
    reopened = Outbox(outbox.path)
    assert [r.op_id for r in reopened.pending()] == [b]
    (dead,) = reopened.dead_letters()
    assert (dead.op_id, dead.type, dead.payload, dead.attempts, dead.done_ts) == (c, "synth_reflection", {"n": 3}, 1, TS2)
    assert reopened.line_count == 8


def test_validation_before_writing(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson", known_types={"extract_facts"})
    with pytest.raises(ValueError):
        outbox.add("unknown_op", {}, TS)
    with pytest.raises(ValueError):
        outbox.add("extract_facts", {}, "later")
    with pytest.raises(TypeError):
        outbox.add("extract_facts", {"bad": object()}, TS)
    assert not outbox.path.exists()


def test_long_errors_are_cut(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson", error_max_chars=10)
    op = outbox.add("extract_facts", {}, TS)
    outbox.attempt(op, "E" * 1000, TS)
    (record,) = outbox.pending()
    assert record.last_error == "E" * 10 + "…"


def test_reference_lines_and_damage_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "outbox.ndjson"
    lines = [
        {"op_id": "p1", "type": "extract_facts", "payload": {"locale_order": 1}, "status": "pending", "ts": "2024-05-01T08:00:00"},
        {"op_id": "p1", "status": "attempt", "ts": "2024-05-01T08:01:00"},  # no "error": reference shape
        {"op_id": "p2", "type": "extract_facts", "payload": {}, "status": "pending", "ts": "2024-05-01T08:02:00"},
        {"op_id": "p2", "status": "done", "ts": "2024-05-01T08:03:00"},  # no "dead"
        {"op_id": "ghost", "status": "attempt", "ts": "2024-05-01T08:04:00"},  # unknown op: ignored
        {"op_id": "p3", "status": "weird", "ts": "x"},  # unknown status: skipped
    ]
    body = "\n".join(json.dumps(line) for line in lines) + "\nnot json at all\n"
    path.write_text(body + '{"op_id": "p4", "type": "extract_facts", "payl')  # torn tail
    outbox = Outbox(path)
    (record,) = outbox.pending()
    assert (record.op_id, record.attempts, record.payload) == ("p1", 1, {"locale_order": 1})
    assert outbox.dead_letters() == []
    assert outbox.line_count == 7
    p5 = outbox.add("extract_facts", {}, TS)  # cuts the torn tail first
    assert [r.op_id for r in Outbox(path).pending()] == ["p1", p5]
    assert path.read_text().count("p4") == 0


def test_compact_keeps_unfinished_records_byte_for_byte(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson")
    a = outbox.add("extract_facts", {"n": 1}, TS)
    b = outbox.add("extract_facts", {"n": 2}, TS)
    c = outbox.add("extract_facts", {"n": 3}, TS)
    outbox.attempt(a, "E1", TS)
    outbox.attempt(b, "E2", TS)
    outbox.done(a, TS2)
    outbox.attempt(c, "E3", TS)
    outbox.done(c, TS2, dead=True)
    before = outbox.path.read_text().splitlines()
    assert outbox.line_count == 8
    assert outbox.compact() == 2
    after = outbox.path.read_text().splitlines()
    assert after == [line for line in before if b in line]
    assert outbox.line_count == 2
    (record,) = Outbox(outbox.path).pending()
    assert (record.op_id, record.attempts, record.last_error) == (b, 1, "E2")
    assert outbox.dead_letters() == []
    # the compacted file keeps working
    outbox.done(b, TS2)
    assert outbox.pending() == [] and outbox.line_count == 3


def test_compact_can_keep_dead_letters(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.ndjson")
    a = outbox.add("extract_facts", {}, TS)
    outbox.done(a, TS2)
    d = outbox.add("extract_facts", {}, TS)
    outbox.attempt(d, "E", TS)
    outbox.done(d, TS2, dead=True)
    assert outbox.compact(keep_dead_letters=True) == 3
    assert [r.op_id for r in outbox.dead_letters()] == [d]
    assert outbox.pending() == []


def test_held_lines_reach_the_file_in_call_order(tmp_path: Path) -> None:
    """Deferred lines stay in memory until sync() or the next direct append writes them,
    ahead of that append's own line; a reader sees them too."""
    outbox = Outbox(tmp_path / "outbox.ndjson")
    first = outbox.add("extract_facts", {"rows": [1, 1]}, TS, durable=False, defer=True)
    outbox.done(first, TS2, durable=False, defer=True)
    assert not outbox.path.exists() and outbox.held == 2 and outbox.line_count == 2
    outbox.sync()
    assert outbox.held == 0
    assert [(x["status"], x["op_id"]) for x in map(json.loads, outbox.path.read_text().splitlines())] == [
        ("pending", first),
        ("done", first),
    ]
    second = outbox.add("extract_facts", {"rows": [2, 2]}, TS, durable=False, defer=True)
    outbox.attempt(second, "boom", TS2)  # a direct append: the held pending line goes first
    assert [(x["status"], x["op_id"]) for x in map(json.loads, outbox.path.read_text().splitlines())][2:] == [
        ("pending", second),
        ("attempt", second),
    ]
    third = outbox.add("extract_facts", {"rows": [3, 3]}, TS, durable=False, defer=True)
    assert [r.op_id for r in outbox.pending()] == [second, third]  # the scan writes held lines first
    assert outbox.held == 0 and len(outbox.path.read_text().splitlines()) == 5


def test_a_record_dropped_while_held_never_reaches_the_file(tmp_path: Path) -> None:
    """drop_held forgets a record whose pending line is still held (and its held done
    line); a record whose pending line was written already is left alone."""
    outbox = Outbox(tmp_path / "outbox.ndjson")
    first = outbox.add("extract_facts", {"rows": [1, 2]}, TS, durable=False, defer=True)
    second = outbox.add("extract_facts", {"rows": [3, 4]}, TS, durable=False, defer=True)
    outbox.done(first, TS2, durable=False, defer=True)
    assert outbox.drop_held(first) is True
    assert outbox.held == 1 and outbox.drop_held(first) is False
    outbox.sync()
    assert outbox.drop_held(second) is False  # in the file now
    outbox.done(second, TS2, durable=False, defer=True)
    assert outbox.drop_held(second) is False and outbox.held == 1  # its done line stays held
    outbox.sync()
    assert [(x["status"], x["op_id"]) for x in map(json.loads, outbox.path.read_text().splitlines())] == [
        ("pending", second),
        ("done", second),
    ]
    assert outbox.pending() == []
