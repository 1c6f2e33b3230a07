"""The memory browser's character list on an install with many characters: paged, sorted,
filtered, and counted from the per-root summary (stores/character_summary.py), which
follows writes and comes back when deleted. A real server over HTTP; the characters are
written straight to disk (a view file each) so that many are cheap."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from nekomem.domain.records import Fact, fact_hash
from nekomem.runtime.clock import ManualClock
from nekomem.stores import character_summary
from nekomem.stores.character_summary import SUMMARY_FILE
from nekomem.stores.layout import CharacterPaths
from tests.support.live import LiveServer, make_settings
from tests.support.ui_seed import seed_journal


def _facts(root: Path, name: str, count: int) -> None:
    paths = CharacterPaths(root, name)
    paths.ensure()
    texts = [f"{name} fact {i}" for i in range(count)]
    facts = [Fact(id=f"f{i}", text=t, hash=fact_hash(t), created_at="2026-01-01T00:00:00+00:00") for i, t in enumerate(texts)]
    paths.facts.write_bytes(msgspec.json.encode(facts))


def _install(root: Path, count: int) -> list[str]:
    names = [f"Char{i:03d}" for i in range(count)]
    for i, name in enumerate(names):
        _facts(root, name, 1 + i % 5)
    return names


def test_the_list_pages_sorts_and_filters(tmp_path: Path) -> None:
    names = _install(tmp_path, 120)
    seed_journal(tmp_path, "Char007", 4)  # the only ones with a conversation:
    seed_journal(tmp_path, "Char050", 2)  # the same seeded times, so ties go by name
    with LiveServer(make_settings(tmp_path)) as srv:
        first = srv.get("/api/browse/characters", params={"limit": 50}).json()
        assert first["total"] == 120 and first["offset"] == 0 and first["sort"] == "name"
        assert [c["name"] for c in first["characters"]] == names[:50]
        last = srv.get("/api/browse/characters", params={"limit": 50, "offset": 100}).json()
        assert [c["name"] for c in last["characters"]] == names[100:]
        assert [c["counts"]["facts"] for c in last["characters"]] == [1 + i % 5 for i in range(100, 120)]

        found = srv.get("/api/browse/characters", params={"q": "char01"}).json()
        assert found["total"] == 10 and [c["name"] for c in found["characters"]] == names[10:20]

        recent = srv.get("/api/browse/characters", params={"sort": "last_conversation", "limit": 3}).json()
        assert [c["name"] for c in recent["characters"]][:2] in (["Char007", "Char050"], ["Char050", "Char007"])
        assert recent["characters"][0]["last_conversation_at"] is not None
        assert recent["characters"][2]["last_conversation_at"] is None

        brief = srv.get("/api/browse/characters", params={"brief": "true", "limit": 2}).json()["characters"]
        assert set(brief[0]) == {"name", "active", "turns", "last_conversation_at", "counts"}
        assert srv.get("/api/browse/characters", params={"sort": "size"}).status_code == 400
        assert srv.runtime.registry.active_names() == []  # listing activates nobody


def test_counts_follow_writes_and_come_back_when_the_summary_is_deleted(tmp_path: Path) -> None:
    _install(tmp_path, 30)
    with LiveServer(make_settings(tmp_path)) as srv:

        def row(name: str) -> dict[str, object]:
            [found] = srv.get("/api/browse/characters", params={"q": name}).json()["characters"]
            return found

        assert row("Char004")["counts"]["facts"] == 5  # type: ignore[index]
        summary = tmp_path / SUMMARY_FILE
        assert summary.exists()
        kept = json.loads(summary.read_text())["characters"]
        assert kept["Char004"]["counts"]["facts"] == 5

        # A write through the server: the character is active, its counts are live.
        added = srv.post("/api/characters/Char004/facts", json={"facts": [{"text": "Master plays the cello"}]})
        assert added.status_code == 200
        assert row("Char004")["counts"]["facts"] == 6  # type: ignore[index]

        # A write behind the server's back (an edit on disk): the stamp moved, it is read again.
        _facts(tmp_path, "Char009", 9)
        assert row("Char009")["counts"]["facts"] == 9  # type: ignore[index]

        summary.unlink()
        assert row("Char009")["counts"]["facts"] == 9  # type: ignore[index]
        assert row("Char003")["counts"]["facts"] == 4  # type: ignore[index]
        rebuilt = json.loads(summary.read_text())["characters"]
        assert rebuilt["Char009"]["counts"]["facts"] == 9 and "Char000" not in rebuilt  # a page reads only its own

        summary.write_text("{not json")  # damaged: rebuilt from the views, never an error
        assert row("Char003")["counts"]["facts"] == 4  # type: ignore[index]


def test_a_deleted_character_leaves_the_summary_at_once(tmp_path: Path) -> None:
    _install(tmp_path, 3)
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.get("/api/browse/characters").json()["total"] == 3
        assert "Char001" in (tmp_path / SUMMARY_FILE).read_text()
        assert srv.delete("/api/characters/Char001").status_code == 200
        assert "Char001" not in (tmp_path / SUMMARY_FILE).read_text()
        assert [c["name"] for c in srv.get("/api/browse/characters").json()["characters"]] == ["Char000", "Char002"]


def _order(srv: LiveServer, limit: int = 3) -> list[str]:
    page = srv.get("/api/browse/characters", params={"sort": "last_conversation", "limit": limit, "brief": "true"}).json()
    return [c["name"] for c in page["characters"]]


def test_last_conversation_order_follows_turns_and_a_restart_without_looking_at_every_character(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _install(tmp_path, 40)
    looked: list[str] = []
    real_stamp = character_summary.stamp_of

    def counting_stamp(paths: CharacterPaths) -> list[int]:
        looked.append(paths.name)
        return real_stamp(paths)

    monkeypatch.setattr(character_summary, "stamp_of", counting_stamp)
    clock = ManualClock(datetime(2026, 5, 1, 12, tzinfo=timezone.utc))

    def post(srv: LiveServer, name: str) -> None:
        clock.advance(60)
        assert srv.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "hello"}]}).status_code == 200

    with LiveServer(make_settings(tmp_path), clock=clock) as srv:
        assert _order(srv) == names[:3]  # nobody has talked yet: by name
        post(srv, "Char030")
        post(srv, "Char005")
        looked.clear()
        assert _order(srv) == ["Char005", "Char030", "Char000"]
        # Only the characters this server may have written, and the page's rows, were looked at.
        assert set(looked) <= {"Char005", "Char030", "Char000"}

        post(srv, "Char030")
        assert srv.runtime.registry.release("Char030")  # passivated: no longer active, told to the summary
        looked.clear()
        assert _order(srv) == ["Char030", "Char005", "Char000"]
        assert "Char030" in looked and len(set(looked)) <= 4

    # A restart: the summary kept on disk is checked once at start-up, then trusted.
    with LiveServer(make_settings(tmp_path), clock=clock) as srv:
        looked.clear()
        assert _order(srv) == ["Char030", "Char005", "Char000"]
        assert set(looked) <= {"Char030", "Char005", "Char000"}


def test_a_stale_or_missing_summary_is_caught_up_at_start(tmp_path: Path) -> None:
    _install(tmp_path, 20)
    summary = tmp_path / SUMMARY_FILE
    with LiveServer(make_settings(tmp_path)) as srv:
        assert _order(srv) == ["Char000", "Char001", "Char002"]
    assert summary.exists()

    # Written while no server ran (an offline import, a restore): the kept row is stale.
    seed_journal(tmp_path, "Char012", 3)
    with LiveServer(make_settings(tmp_path)) as srv:
        assert _order(srv) == ["Char012", "Char000", "Char001"]
        assert json.loads(summary.read_text())["characters"]["Char012"]["turns"] == 3

    summary.unlink()
    seed_journal(tmp_path, "Char017", 5)  # its last turn two minutes after Char012's
    with LiveServer(make_settings(tmp_path)) as srv:
        assert _order(srv, 2) == ["Char017", "Char012"]
        kept = json.loads(summary.read_text())["characters"]
        assert kept["Char017"]["turns"] == 5 and len(kept) == 20  # rebuilt at start, every character


def test_a_first_page_reads_no_backlog_the_start_up_check_has_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fact backlog of a passive character comes with its summary row (read with its
    turns at the start-up check), so showing a row for the first time reads no backlog
    from its journal; a summary of the version before (rows without a backlog) is read
    again whole."""
    from nekomem.http import system
    from nekomem.stores.fact_backlog import BACKLOG_FROM, BACKLOG_TO
    from nekomem.stores.timeindex import TimeIndex

    _install(tmp_path, 3)
    seed_journal(tmp_path, "Char001", 6)
    with TimeIndex(CharacterPaths(tmp_path, "Char001").time_index_db) as db:
        db.set_cursors({BACKLOG_FROM: 0, BACKLOG_TO: db.max_row_id()})  # every row still to mine
    read: list[str] = []
    real = system.backlog_remaining

    def spy(path: Path) -> int:
        read.append(Path(path).parent.name)
        return real(path)

    monkeypatch.setattr(system, "backlog_remaining", spy)
    settings = make_settings(tmp_path, embedding_enabled=False)
    with LiveServer(settings) as srv:
        rows = {c["name"]: c for c in srv.get("/api/browse/characters").json()["characters"]}
        assert rows["Char001"]["fact_backlog"] == 6 and rows["Char000"]["fact_backlog"] == 0
        assert read == []  # from the summary rows, not from the journals
    kept = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert kept["version"] == 2 and kept["characters"]["Char001"]["backlog"] == 6

    # A summary written by the version before: its rows had no backlog, so it is not trusted.
    kept["version"] = 1
    for row in kept["characters"].values():
        del row["backlog"]
    (tmp_path / SUMMARY_FILE).write_text(json.dumps(kept))
    with LiveServer(settings) as srv:
        rows = {c["name"]: c for c in srv.get("/api/browse/characters").json()["characters"]}
        assert rows["Char001"]["fact_backlog"] == 6
