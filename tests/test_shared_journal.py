from __future__ import annotations

from nekomem.stores.applied import SharedJournal

OWNERS = {"fact.added": "facts", "reflection.synthesized": "reflections"}
TS = "2026-01-01T00:00:00+00:00"


def test_per_owner_marks_and_unapplied(tmp_path):
    j = SharedJournal(tmp_path / "events.ndjson", tmp_path / "events_applied.json", OWNERS)
    a = j.append("fact.added", {"n": 1}, TS)
    b = j.append("reflection.synthesized", {"n": 2}, TS)
    c = j.append("fact.added", {"n": 3}, TS)
    assert [e.event_id for e in j.unapplied_for("facts")] == [a.event_id, c.event_id]
    j.mark("facts", a.event_id)
    assert [e.event_id for e in j.unapplied_for("facts")] == [c.event_id]
    assert [e.event_id for e in j.unapplied_for("reflections")] == [b.event_id]
    reopened = SharedJournal(tmp_path / "events.ndjson", tmp_path / "events_applied.json", OWNERS)
    assert [e.event_id for e in reopened.unapplied_for("facts")] == [c.event_id]
    assert reopened.has_unapplied()


def test_compaction_once_every_owner_applied_everything(tmp_path):
    j = SharedJournal(tmp_path / "events.ndjson", tmp_path / "events_applied.json", OWNERS)
    events = [j.append("fact.added", {"n": i}, TS) for i in range(12)]
    assert j.compact_if_applied(10) == 0  # nothing marked yet
    j.mark("facts", events[-2].event_id)
    assert j.compact_if_applied(10) == 0  # one event still unapplied
    j.mark("facts", events[-1].event_id)
    assert j.compact_if_applied(10) == 12
    assert j.line_count == 0
    assert not j.has_unapplied()
    j.append("fact.added", {"n": 99}, TS)
    assert len(j.unapplied_for("facts")) == 1
