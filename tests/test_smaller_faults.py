"""Issue 28, item 7, on real servers: a facts import on a full disk tells the truth, a
failed character answers at once, a non-ASCII token matches, /api/import/neko stays inside
its import root, and an edit of a recent item is bounded like a message."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import time
from pathlib import Path

import httpx
import pytest

from nekomem.client.aio import AsyncNekomemClient
from nekomem.stores.jsonl import NdjsonLog
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_storage_faults import small_fs  # noqa: F401  (a fixture)

_RNG = random.Random(28)
_SYLLABLES = ["ka", "mo", "ri", "zu", "te", "no", "sa", "pi", "lu", "ve", "do", "xa", "qui", "bre", "stor", "fen"]


def _word() -> str:
    return "".join(_RNG.choice(_SYLLABLES) for _ in range(4))


# 200 facts that share no words (the import's duplicate check keeps them all).
FACTS = [{"text": "Master " + " ".join(_word() for _ in range(6))} for _ in range(200)]


def fill(point: Path) -> None:
    """Fill the file system with an unbuffered filler file (no buffer left to flush at close)."""
    fd = os.open(point / "filler.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 65536
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                if len(block) == 1:
                    return
                block = block[: len(block) // 2]
    finally:
        os.close(fd)


def _free(point: Path, keep_bytes: int) -> None:
    """Free about ``keep_bytes`` of a full file system by cutting its filler file."""
    filler = point / "filler.bin"
    os.truncate(filler, max(0, filler.stat().st_size - keep_bytes))


def test_a_facts_import_on_a_full_disk_says_what_was_stored(small_fs: Path) -> None:  # noqa: F811
    root = small_fs / "memory"
    # Every journaled change is flushed to the views at once: the view write comes right
    # after the journal write, inside the import request.
    settings = make_settings(root, view_flush_changes=1, view_flush_seconds=3600)
    with LiveServer(settings) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master has a cat"}]}).status_code == 200
        events = root / "Lan" / "events.ndjson"
        fill(small_fs)
        # Room for the journal lines of the import but not for the rewritten facts.json.
        _free(small_fs, 160 * 1024)
        answer = srv.post("/api/characters/Lan/facts", json={"facts": FACTS})
        journal_size = events.stat().st_size
        for p in small_fs.glob("filler*.bin"):
            p.unlink()
        if answer.status_code == 200:
            # Journaled: stored, whatever happened to the view afterwards.
            assert len(answer.json()["added"]) == 200
        else:
            # Refused: then truly nothing of it is stored (the journal was cut back).
            assert answer.status_code == 507, answer.text
            assert answer.json()["error_code"] == "storage_full"
        wait_for(lambda: srv.get("/health").json()["storage"]["faults"] == [], what="the view rewritten after the disk was freed")
        total = srv.get("/api/characters/Lan/facts").json()["total"]
    with LiveServer(make_settings(root)) as srv:
        assert srv.get("/api/characters/Lan/facts").json()["total"] == total
    assert total == (201 if answer.status_code == 200 else 1), (answer.status_code, total, journal_size)


def test_a_failed_journal_append_is_cut_back(small_fs: Path) -> None:  # noqa: F811
    log = NdjsonLog(small_fs / "log.ndjson")
    log.append([b'{"n": 0}'])
    before = (small_fs / "log.ndjson").stat().st_size
    fill(small_fs)
    _free(small_fs, 4096)  # one page: the start of the lines fits, the rest does not
    try:
        log.append([b'{"n": %d, "pad": "%s"}' % (i, b"x" * 200) for i in range(100)])
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        raise AssertionError("the append should not fit")
    assert (small_fs / "log.ndjson").stat().st_size == before
    assert [n for n, _raw in log.read_lines()] == [1]


def test_a_failed_character_answers_at_once_with_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root, ask_timeout_seconds=60)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0")
        wait_for(lambda: "Lan" not in srv.runtime.registry.active_names(), what="Lan passivated")
        facts = root / "Lan" / "facts.json"
        if facts.exists():
            facts.unlink()
        facts.mkdir()  # a folder in place of facts.json
        started = time.monotonic()
        answer = srv.get("/api/characters/Lan/facts")
        # Answered well before the ask timeout, not by it.
        assert time.monotonic() - started < 60
        assert answer.status_code == 503, answer.text
        assert answer.json()["error_code"] == "character_failed"
        assert "facts" in answer.json()["message"]
        again = srv.get("/api/characters/Lan/facts")
        assert again.json()["error_code"] == "character_failed" and "IsADirectoryError" in again.json()["message"]
        assert srv.get("/health").json()["supervision"]["failed_children"] == 1
        # The other layers keep serving.
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "still here"}]}).status_code == 200


def test_a_token_with_non_ascii_characters_matches(tmp_path: Path) -> None:
    token = "ねこ-トークン-é"
    with LiveServer(make_settings(tmp_path / "memory", api_token=token)) as srv:
        good = httpx.get(srv.url + "/api/characters", headers={"Authorization": f"Bearer {token}".encode()})
        assert good.status_code == 200, good.text
        bad = httpx.get(srv.url + "/api/characters", headers={"Authorization": "Bearer ねこ".encode()})
        assert bad.status_code == 401

        async def through_the_client() -> object:
            client = AsyncNekomemClient(srv.url, token=token)
            try:
                return await client.characters()
            finally:
                await client.aclose()

        assert asyncio.run(through_the_client()) is not None  # an unauthorized answer raises


def test_import_neko_stays_inside_the_default_import_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_DATA_HOME", "XDG_DOCUMENTS_DIR", "NEKO_STORAGE_SELECTED_ROOT"):
        monkeypatch.delenv(name, raising=False)
    with LiveServer(make_settings(tmp_path / "memory")) as srv:
        for path in ("/etc", "/root", "/nonexistent-folder", str(tmp_path), str(home / ".local" / "N.E.K.O")):
            answer = srv.post("/api/import/neko", json={"source_dir": path})
            assert answer.status_code == 403, (path, answer.text)
            body = answer.json()
            assert body["error_code"] == "outside_import_root"
            assert body["import_roots"] == [str(home / ".local" / "share" / "N.E.K.O"), str(home / "Documents" / "N.E.K.O")]


def test_an_edit_of_a_recent_item_is_bounded_like_a_message(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "memory", message_max_chars=1000)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "short"}]}).status_code == 200
        huge = srv.patch("/api/characters/Lan/recent/0", json={"text": "x" * 1001})
        assert huge.status_code == 422 and huge.json()["error_code"] == "text_too_long"
        assert [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]] == ["short"]
        fact = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master likes tea"}]}).json()["added"][0]
        too_long = srv.patch(f"/api/characters/Lan/facts/{fact}", json={"text": "y" * 1001})
        assert too_long.status_code == 422 and too_long.json()["error_code"] == "text_too_long"
        assert srv.patch("/api/characters/Lan/recent/0", json={"text": "x" * 1000}).status_code == 200


def test_the_default_import_root_is_resolved(tmp_path: Path) -> None:
    from nekomem.http.importing import import_roots

    assert import_roots(str(tmp_path / "a" / ".." / "b")) == [(tmp_path / "b").resolve()]
    assert (Path(os.path.expanduser("~")) / "Documents" / "N.E.K.O").resolve() in import_roots("")
