"""events.ndjson + events_applied.json: append, sentinel, torn tails, compaction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nekomem.stores.journal import Event, EventJournal

TYPES = {"fact.added", "fact.archived", "reflection.surfaced"}
TS = "2024-05-01T00:00:00+00:00"


def _journal(tmp_path: Path) -> EventJournal:
    return EventJournal(
        tmp_path / "events.ndjson",
        tmp_path / "events_applied.json",
        TYPES,
        clock=lambda: "2024-06-01T00:00:00+00:00",
    )


def test_append_writes_one_line_per_event(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    event = journal.append("fact.added", {"fact_id": "f1", "text_sha256": "ab"}, TS)
    assert isinstance(event, Event) and len(event.event_id) == 32
    lines = journal.events_path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"event_id": event.event_id, "type": "fact.added", "ts": TS, "payload": {"fact_id": "f1", "text_sha256": "ab"}}
    ]
    assert journal.all_events() == [event]
    assert journal.line_count == 1


def test_invalid_events_are_refused_before_writing(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    with pytest.raises(ValueError):
        journal.append("fact.invented", {}, TS)
    with pytest.raises(ValueError):
        journal.append("fact.added", {}, "not a time")
    with pytest.raises(TypeError):
        journal.append("fact.added", {"x": object()}, TS)
    with pytest.raises(ValueError):
        journal.append_many([("fact.added", {}, TS), ("nope", {}, TS)])
    assert not journal.events_path.exists()


def test_unapplied_follows_the_sentinel(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    events = journal.append_many([("fact.added", {"n": i}, TS) for i in range(4)])
    assert journal.line_count == 4
    assert journal.unapplied() == events  # no sentinel yet: full replay
    journal.mark_applied(events[1].event_id)
    assert json.loads(journal.applied_path.read_text()) == {
        "last_applied_event_id": events[1].event_id,
        "ts": "2024-06-01T00:00:00+00:00",
    }
    assert journal.unapplied() == events[2:]
    journal.mark_applied(events[3].event_id)
    assert journal.unapplied() == []
    later = journal.append("fact.archived", {"n": 9}, TS)
    assert EventJournal(journal.events_path, journal.applied_path, TYPES).unapplied() == [later]


def test_unknown_or_corrupt_sentinel_means_full_replay(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    events = journal.append_many([("fact.added", {"n": i}, TS) for i in range(3)])
    journal.mark_applied("0" * 32)
    assert journal.unapplied() == events
    journal.applied_path.write_text("{broken")
    assert journal.unapplied() == events
    assert any(p.name.startswith("events_applied.json.corrupt-") for p in tmp_path.iterdir())
    journal.mark_applied(None)
    assert journal.unapplied() == events


def test_torn_last_line_is_ignored_then_cut_on_next_append(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    first = journal.append("fact.added", {"n": 1}, TS)
    with open(journal.events_path, "ab") as handle:
        handle.write(b'{"event_id": "abc", "type": "fact.ad')  # a crash mid-append
    reopened = _journal(tmp_path)
    assert reopened.all_events() == [first]
    assert reopened.unapplied() == [first]
    assert reopened.line_count == 1
    second = reopened.append("fact.added", {"n": 2}, TS)
    raw = journal.events_path.read_bytes()
    assert raw.endswith(b"\n") and b'"abc"' not in raw and raw.count(b"\n") == 2
    assert _journal(tmp_path).all_events() == [first, second]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    first = journal.append("fact.added", {"n": 1}, TS)
    raw = journal.events_path.read_bytes()
    journal.events_path.write_bytes(raw.rstrip(b"\n"))
    reopened = _journal(tmp_path)
    assert reopened.all_events() == [first]
    second = reopened.append("fact.added", {"n": 2}, TS)
    assert _journal(tmp_path).all_events() == [first, second]


def test_corrupt_middle_line_is_skipped(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    first = journal.append("fact.added", {"n": 1}, TS)
    with open(journal.events_path, "ab") as handle:
        handle.write(b"###garbage###\n")
        handle.write(b'{"event_id": "x"}\n')  # valid JSON, not an event
    second = journal.append("fact.added", {"n": 2}, TS)
    assert _journal(tmp_path).all_events() == [first, second]
    assert _journal(tmp_path).line_count == 4


def test_compact_keeps_unapplied_and_resets_the_sentinel(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    events = journal.append_many(
        [("fact.added", {"n": 0}, TS), ("fact.archived", {"n": 1}, TS), ("fact.added", {"n": 2}, TS), ("fact.added", {"n": 3}, TS)]
    )
    journal.mark_applied(events[2].event_id)
    kept = journal.compact(keep=lambda e: e.type == "fact.archived")
    assert kept == 2
    assert journal.all_events() == [events[1], events[3]]
    assert journal.last_applied_id() is None
    assert journal.unapplied() == [events[1], events[3]]
    assert journal.line_count == 2
    journal.mark_applied(events[3].event_id)
    assert journal.compact() == 0
    assert journal.all_events() == [] and journal.line_count == 0
    assert not any(p.name.startswith(".nkatmp") for p in tmp_path.iterdir())


def test_compact_without_sentinel_loses_nothing(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    events = journal.append_many([("fact.added", {"n": i}, TS) for i in range(3)])
    assert journal.compact() == 3
    assert journal.all_events() == events
    assert journal.oldest_ts() == TS


_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nekomem.stores.journal import EventJournal
    folder = Path(sys.argv[1])
    journal = EventJournal(folder / "events.ndjson", folder / "events_applied.json", {"fact.added"})
    n = 0
    while True:
        journal.append("fact.added", {"n": n, "pad": "p" * (1000 + n % 5000)}, "2024-05-01T00:00:00+00:00")
        print(n, flush=True)
        n += 1
    """
)


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL")
def test_sigkill_during_appends_loses_no_returned_event(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        last = -1
        for _ in range(40):
            line = child.stdout.readline()
            assert line, "appender died early"
            last = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    journal = EventJournal(tmp_path / "events.ndjson", tmp_path / "events_applied.json", {"fact.added"})
    numbers = [e.payload["n"] for e in journal.all_events()]
    assert numbers == list(range(len(numbers))) and len(numbers) > last
    extra = journal.append("fact.added", {"n": -1}, TS)
    assert journal.all_events()[-1] == extra
