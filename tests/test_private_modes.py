"""Every file a server writes under the memory root is 0600 and every folder 0700: the
journal ``time_indexed.db`` and its ``-wal``/``-shm`` hold every turn's text."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support.live import LiveServer, make_settings

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_journal_its_side_files_and_the_folders_are_private(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    old = os.umask(0o022)  # the usual umask, under which SQLite made the journal 0644
    try:
        with LiveServer(make_settings(root)) as srv:
            assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "a secret"}]}).status_code == 200
            folder = root / "Lan"
            db = folder / "time_indexed.db"
            # While the server runs the journal is open in WAL mode: its side files exist.
            assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()
            modes = {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}
    finally:
        os.umask(old)
    folders = {name: mode for name, mode in modes.items() if (root / name).is_dir() or name == "."}
    files = {name: mode for name, mode in modes.items() if name not in folders}
    assert files["Lan/time_indexed.db"] == 0o600 and files["Lan/time_indexed.db-wal"] == 0o600
    assert files["Lan/time_indexed.db-shm"] == 0o600
    assert {n: m for n, m in files.items() if m != 0o600} == {}, "files readable by others"
    assert {n: m for n, m in folders.items() if m != 0o700} == {}, "folders open to others"


def test_a_journal_left_0644_by_an_older_version_is_made_private(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with LiveServer(settings) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hello"}]}).status_code == 200
    db = tmp_path / "Lan" / "time_indexed.db"
    os.chmod(db, 0o644)
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").status_code == 200
        assert _mode(db) == 0o600
