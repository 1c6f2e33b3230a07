"""An imported reference folder served by a real server, and ``POST /api/import/neko`` on a
running one (its characters' live state is neither overwritten nor lost)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from nekomem.cli import main as cli
from nekomem.domain.records import Fact, PersonaEntry
from nekomem.importer.neko import plan, run_import
from nekomem.runtime.reply import ActorFailure
from tests.support import neko_fixture
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_import_neko import scopable, tree_hashes


@pytest.fixture
def fixture(tmp_path: Path) -> neko_fixture.NekoFixture:
    return neko_fixture.build(tmp_path / "neko-memory")


def strip_stamp(text: str) -> str:
    """An assistant line without the chat server's ``[YYYYMMDD Ddd HH:MM]`` prefix."""
    return text.split("]", 1)[1] if text.startswith("[") and "]" in text else text


def ids_for(server: LiveServer, name: str, query: str, **extra: Any) -> list[str]:
    response = server.post(f"/query_memory/{name}", json={"query": query, **extra})
    assert response.status_code == 200, response.text
    return [row["id"] for row in response.json()["results"]]


def test_an_imported_folder_is_served(fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "nekomem-root"
    assert cli.main(["import-neko", str(fixture.root), "--memory-root", str(root)]) == 0
    capsys.readouterr()
    data = fixture.characters[neko_fixture.MAIN]
    with LiveServer(make_settings(root)) as server:
        dialog = server.get(f"/new_dialog/{neko_fixture.MAIN}")
        assert dialog.status_code == 200
        # persona (card entries, promoted and manual), the certain/uncertain reflections,
        # the memo and every item of the recent window
        for entity, entries in data.persona.items():
            for entry in entries:
                if not neko_fixture.is_scoped(entry, entity):
                    assert entry["text"] in dialog.text, entry["text"]
                else:  # never in the owner's context (refused, or kept for its subject)
                    assert entry["text"] not in dialog.text, entry["text"]
        confirmed = next(r for r in data.reflections if r["status"] == "confirmed")
        pending = next(r for r in data.reflections if r["status"] == "pending")
        denied = next(r for r in data.reflections if r["status"] == "denied")
        assert confirmed["text"] in dialog.text and pending["text"] in dialog.text
        assert denied["text"] not in dialog.text
        for item in data.recent:
            content = item["data"]["content"]
            text = content if isinstance(content, str) else "".join(p["text"] for p in content)
            assert strip_stamp(text) in dialog.text
        # recall finds active and archived facts and the active reflections
        group = [{"subject_kind": "group_chat", "subject_id": "qq:123456"}]
        for record in data.facts + data.facts_archive:
            found = record["id"] in ids_for(server, neko_fixture.MAIN, record["text"])
            # owner recall: unscoped rows only; a scoped row is served to its subject alone
            assert found is not neko_fixture.is_scoped(record), record["text"]
            in_group = record["id"] in ids_for(server, neko_fixture.MAIN, record["text"], subjects=group)
            assert in_group is (neko_fixture.is_scoped(record) and scopable(Fact)), record["text"]
        assert confirmed["id"] in ids_for(server, neko_fixture.MAIN, confirmed["text"])
        assert denied["id"] not in ids_for(server, neko_fixture.MAIN, denied["text"])
        topics = server.get(f"/followup_topics/{neko_fixture.MAIN}").json()["topics"]
        assert pending["id"] in [t["id"] for t in topics]
        gap = server.get(f"/last_conversation_gap/{neko_fixture.MAIN}").json()["gap_seconds"]
        assert 0 < gap < 2 * 3600  # the newest journal row is half an hour old
        if scopable(PersonaEntry):
            scoped = server.post(f"/internal/memory/{neko_fixture.MAIN}/scoped_context", json={"subjects": group})
            assert scoped.status_code == 200
            assert data.persona[neko_fixture.SCOPED_SECTION][0]["text"] in scoped.text
        # The first request to a character is a query: it must wait for the owners to
        # index what was imported instead of answering from an empty index.
        second = fixture.characters[neko_fixture.SECOND]
        assert second.facts_archive[0]["id"] in ids_for(server, neko_fixture.SECOND, "salmon")


def post_import(server: LiveServer, body: Any) -> httpx.Response:
    return server.post("/api/import/neko", json=body)


def test_the_route_imports_into_a_running_server(fixture: neko_fixture.NekoFixture, tmp_path: Path) -> None:
    root = tmp_path / "nekomem-root"
    source_before = tree_hashes(fixture.root)
    with LiveServer(make_settings(root, import_root=str(tmp_path))) as server:
        # Mochi is live, with a conversation of its own, before the import
        cached = server.post(f"/cache/{neko_fixture.SECOND}", json={"input_history": [{"role": "user", "content": "hello from nekomem"}]})
        assert cached.status_code == 200
        assert neko_fixture.SECOND in server.runtime.registry.active_names()
        response = post_import(server, {"source_dir": str(fixture.root)})
        assert response.status_code == 200, response.text
        report = response.json()
        assert report["added_total"] > 0
        mochi = next(c for c in report["characters"] if c["name"] == neko_fixture.SECOND)
        assert mochi["layers"]["recent"]["skipped"] == 2  # its live window is kept
        assert mochi["layers"]["journal"]["added"] == 2
        # the live window survived; the imported layers are served after re-activation
        history = server.get(f"/get_recent_history/{neko_fixture.SECOND}").text
        assert "hello from nekomem" in history
        archived = fixture.characters[neko_fixture.SECOND].facts_archive[0]
        assert archived["id"] in ids_for(server, neko_fixture.SECOND, "salmon")
        card = fixture.characters[neko_fixture.SECOND].persona["neko"][0]
        assert card["text"] in server.get(f"/new_dialog/{neko_fixture.SECOND}").text
        main = fixture.characters[neko_fixture.MAIN]
        assert main.facts[0]["id"] in ids_for(server, neko_fixture.MAIN, main.facts[0]["text"])
        # a second import adds nothing
        again = post_import(server, {"source_dir": str(fixture.root)})
        assert again.status_code == 200 and again.json()["added_total"] == 0
        # only the named characters
        only = post_import(server, {"source_dir": str(fixture.root), "characters": [neko_fixture.V1]})
        assert [c["name"] for c in only.json()["characters"]] == [neko_fixture.V1]
    assert tree_hashes(fixture.root) == source_before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (None, 400, "empty_body"),
        ({}, 422, "schema_violation"),
        ({"source_dir": 5}, 422, "schema_violation"),
        ({"source_dir": "/x", "extra": 1}, 422, "schema_violation"),
        ({"source_dir": "relative/folder"}, 400, "source_dir_not_absolute"),
        ({"source_dir": "{tmp}/nonexistent/neko-memory"}, 400, "bad_source_dir"),
        # Outside the import root: refused before it is looked at, existing or not.
        ({"source_dir": "/etc"}, 403, "outside_import_root"),
        ({"source_dir": "/nonexistent/neko-memory"}, 403, "outside_import_root"),
        ({"source_dir": "{tmp}/../../etc"}, 403, "outside_import_root"),
    ],
)
def test_the_route_refuses_bad_bodies(tmp_path: Path, body: Any, status: int, code: str) -> None:
    if isinstance(body, dict) and isinstance(body.get("source_dir"), str):
        body = {**body, "source_dir": body["source_dir"].replace("{tmp}", str(tmp_path))}
    with LiveServer(make_settings(tmp_path / "root", import_root=str(tmp_path))) as server:
        response = server.post("/api/import/neko", json=body) if body is not None else server.post("/api/import/neko")
        assert response.status_code == status, response.text
        assert response.json()["error_code"] == code
        malformed = server.post("/api/import/neko", content=b"{not json", headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and malformed.json()["error_code"] == "malformed_json"


def test_the_route_refuses_an_overlap_and_an_unknown_character(fixture: neko_fixture.NekoFixture, tmp_path: Path) -> None:
    root = tmp_path / "root"
    with LiveServer(make_settings(root, import_root=str(tmp_path))) as server:
        inside = post_import(server, {"source_dir": str(root / "somewhere")})
        assert inside.status_code == 400 and inside.json()["error_code"] == "bad_source_dir"
        unknown = post_import(server, {"source_dir": str(fixture.root), "characters": ["nobody"]})
        assert unknown.status_code == 404 and unknown.json()["error_code"] == "unknown_character"
        assert not any(p.is_dir() for p in root.iterdir())


def test_requests_wait_for_a_held_character(fixture: neko_fixture.NekoFixture, tmp_path: Path) -> None:
    """While a character is held (its files being imported) its actors are stopped, a
    request for it waits, and it is answered from the imported state afterwards."""
    root = tmp_path / "root"
    name = neko_fixture.SECOND
    with LiveServer(make_settings(root)) as server:
        registry = server.runtime.registry
        assert server.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "before"}]}).status_code == 200
        answers: list[httpx.Response] = []
        with registry.hold(name, timeout=10):
            assert name not in registry.active_names()
            with pytest.raises(ActorFailure) as failure:  # a caller that cannot wait
                registry.ask_sync(name, "recent", lambda reply: None, timeout=1)
            assert failure.value.code == "character_importing"
            in_flight = server.server.server_state.tasks  # uvicorn's running request tasks
            waiter = threading.Thread(target=lambda: answers.append(server.get(f"/new_dialog/{name}")))
            waiter.start()
            wait_for(lambda: len(in_flight) > 0, what="the request to reach the server")
            assert not answers  # still waiting on the hold
            # the files are merged while the hold is ours (what ImportService does per character)
            report, sources = plan(fixture.root, root, server.settings, [name])
            assert run_import(report, sources, server.settings).added > 0
        waiter.join(30)
        assert answers and answers[0].status_code == 200
        card = fixture.characters[name].persona["neko"][0]
        assert card["text"] in answers[0].text and "before" in answers[0].text


def test_a_character_that_cannot_be_held_is_reported_and_left_alone(fixture: neko_fixture.NekoFixture, tmp_path: Path) -> None:
    root = tmp_path / "root"
    name = neko_fixture.SECOND
    # A second hold waits for the first up to the import's timeout: a short one here.
    with LiveServer(make_settings(root, import_root=str(tmp_path), import_character_timeout_seconds=2)) as server:
        with server.runtime.registry.hold(name, timeout=10):  # e.g. another import of it
            response = post_import(server, {"source_dir": str(fixture.root), "characters": [name, neko_fixture.V1]})
        assert response.status_code == 200, response.text
        report = response.json()
        assert [c["name"] for c in report["characters"]] == [neko_fixture.V1]
        assert any(p["character"] == name and p["layer"] == "character" and "not imported" in p["reason"] for p in report["problems"])
        assert not (root / name).exists()
