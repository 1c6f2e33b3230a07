"""Serving never opens a character's journal outside SQLite (see
:mod:`nekomem.stores.timeindex_check`): closing any descriptor of ``time_indexed.db`` or its
``-shm`` drops every POSIX lock this process holds on the file, SQLite's included, and
another process can then delete the WAL under the open writer. This watches every Python
open of those files while a server writes, activates, lists, browses, exports and
releases characters; SQLite's own opens are not Python's and are not seen."""

from __future__ import annotations

import builtins
import io
import os
import traceback
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import LiveServer, make_settings

WATCHED = ("time_indexed.db", "time_indexed.db-shm")


class _Opens:
    """Every open of a watched file through ``os.open`` or ``io.open`` (``open``,
    ``Path.open``, ``Path.read_bytes``), but the creation of a missing file (no lock can be
    held on a file that does not exist yet)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[str] = []
        real_os_open, real_io_open = os.open, io.open

        def noted(path: object, how: str) -> None:
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(WATCHED):
                where = "".join(traceback.format_stack(limit=6)[:-2])
                self.seen.append(f"{how} {os.fspath(path)}\n{where}")

        def os_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
            if not (flags & os.O_CREAT and flags & os.O_EXCL):
                noted(path, "os.open")
            return real_os_open(path, flags, mode, *args, **kwargs)

        def io_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            noted(file, "open")
            return real_io_open(file, *args, **kwargs)

        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(io, "open", io_open)
        monkeypatch.setattr(builtins, "open", io_open)


def test_serving_never_opens_a_journal_outside_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(tmp_path, embedding_enabled=False)
    with LiveServer(settings) as srv:
        for name in ("Lan", "Mio"):
            turns = [{"role": "user", "content": f"{name} turn {i}"} for i in range(5)]
            assert srv.post(f"/cache/{name}", json={"input_history": turns}).status_code == 200
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
        opens = _Opens(monkeypatch)
        # A passive character listed and browsed, then woken (its journal checked) while a
        # read of it may still be open; the other active one written, browsed and exported.
        assert srv.get("/api/browse/characters").status_code == 200
        assert srv.get("/api/browse/Lan/journal", params={"limit": 3}).json()["total"] == 5
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "Lan again"}]}).status_code == 200
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == 6
        assert srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "Mio again"}]}).status_code == 200
        assert srv.get("/api/browse/Mio/journal", params={"limit": 3}).status_code == 200
        assert srv.post("/api/characters/Mio/export", json={}).status_code == 200
        assert srv.get("/health").status_code == 200
        assert srv.post("/release_character/Mio?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
        assert srv.get("/api/browse/characters").status_code == 200
        monkeypatch.undo()
    assert not opens.seen, "\n".join(opens.seen[:3])
