"""Start-up recovery looks only at the characters whose files moved since a start found
nothing to finish (the character summary's recovery marks), and still finds the one left
with work by a crash."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import pytest

from nekomem.actors.host import CharacterActors
from nekomem.domain.post_turn import POST_TURN_CURSOR
from nekomem.domain.turns import Turn
from nekomem.stores.character_summary import recovery_stamp, summary_of
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.timeindex import TimeIndex
from tests.support.live import LiveServer, make_settings

NAMES = ("Aoi", "Ben", "Chiyo")
HOUR_NS = 3600 * 10**9


def _age(paths: CharacterPaths) -> None:
    """Make the files the recovery reads an hour older (as after a quiet hour): a mark is
    only taken for files older than the file system's timestamp granularity."""
    for path in (paths.time_index_db, Path(str(paths.time_index_db) + "-wal"), paths.outbox, paths.events, paths.events_applied):
        if path.exists():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns - HOUR_NS, st.st_mtime_ns - HOUR_NS))


@pytest.fixture
def looked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names start-up recovery looked at (the real look runs)."""
    seen: list[str] = []
    real = CharacterActors.has_unfinished

    def spy(self: CharacterActors, paths: CharacterPaths, *, mine_backlog: bool = False, hold: ExitStack | None = None) -> bool:
        seen.append(paths.name)
        return real(self, paths, mine_backlog=mine_backlog, hold=hold)

    monkeypatch.setattr(CharacterActors, "has_unfinished", spy)
    return seen


def test_a_start_looks_again_only_at_characters_whose_files_moved(tmp_path: Path, looked: list[str]) -> None:
    settings = make_settings(tmp_path, embedding_enabled=False)
    root = Path(settings.server.memory_root)
    with LiveServer(settings) as srv:
        for name in NAMES:
            assert srv.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": f"hi from {name}"}]}).status_code == 200
    for name in NAMES:
        _age(CharacterPaths(root, name))

    looked.clear()
    with LiveServer(settings):
        pass
    assert sorted(looked) == sorted(NAMES)  # no marks yet: every character is looked at
    marks = summary_of(root).recovery_marks()
    assert sorted(marks) == sorted(NAMES)

    looked.clear()
    with LiveServer(settings):
        pass
    assert looked == []  # nothing moved: no journal opened

    # A crash left a turn after Ben's post-turn cursor while no server ran.
    ben = CharacterPaths(root, "Ben")
    with TimeIndex(ben.time_index_db) as db:
        db.append("crash", [Turn(role="human", text="a turn the crash left", ts="2026-12-06T10:00:00+00:00")])
        top = db.max_row_id()
    assert TimeIndex.rows_after_cursor(ben.time_index_db, POST_TURN_CURSOR)
    assert recovery_stamp(ben) != marks["Ben"][:-1]

    looked.clear()
    with LiveServer(settings):
        pass
    assert looked == ["Ben"]  # only the character whose journal moved
    # ... and it was recovered: its post-turn cursor reached the crash's turn.
    with TimeIndex(ben.time_index_db) as db:
        assert (db.cursor(POST_TURN_CURSOR) or 0) >= top
    assert "Ben" not in summary_of(root).recovery_marks() or summary_of(root).recovery_marks()["Ben"][:-1] == recovery_stamp(ben)


def test_a_lost_summary_makes_the_start_look_at_everyone(tmp_path: Path, looked: list[str]) -> None:
    settings = make_settings(tmp_path, embedding_enabled=False)
    root = Path(settings.server.memory_root)
    with LiveServer(settings) as srv:
        for name in NAMES:
            assert srv.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "hello"}]}).status_code == 200
    for name in NAMES:
        _age(CharacterPaths(root, name))
    with LiveServer(settings):
        pass
    summary_of(root).path.unlink()
    looked.clear()
    with LiveServer(settings):
        pass
    assert sorted(looked) == sorted(NAMES)
