"""``nekomem backup`` / ``export`` against a real server that takes writes meanwhile, then
``restore`` / ``import`` into empty roots: the restored server gives the same answers to
/new_dialog and /query_memory, and the character being written comes back as a prefix of
what was acknowledged (a consistent state, nothing torn)."""

from __future__ import annotations

import io
import json
import threading
from datetime import datetime, timezone

import pytest

from nekomem.cli import main as cli
from nekomem.runtime.clock import ManualClock
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

QUERIES = ["kites", "what does Master like to drink", "bicycle"]


def run_cli(*argv: str) -> tuple[int, str]:
    """(exit status, stdout + stderr) of ``nekomem argv`` run in this process."""
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = cli.main(list(argv))
    return status, out.getvalue()


def recall(srv: LiveServer, name: str, query: str) -> dict[str, object]:
    body = srv.post(f"/query_memory/{name}", json={"query": query}).json()
    body.pop("elapsed_ms", None)  # how long it took, not what it found
    return body


def answers(srv: LiveServer, name: str) -> dict[str, object]:
    return {"new_dialog": srv.get(f"/new_dialog/{name}").text, **{q: recall(srv, name, q) for q in QUERIES}}


def journal_texts(srv: LiveServer, name: str) -> list[str]:
    items = srv.get(f"/api/browse/{name}/journal", params={"order": "asc", "limit": 1000}).json()["items"]
    return [i["text"] for i in items]


class Writer(threading.Thread):
    """Writes one turn after another to ``name`` until stopped; keeps what was acknowledged."""

    def __init__(self, srv: LiveServer, name: str) -> None:
        super().__init__(daemon=True)
        self.srv, self.name = srv, name
        self.acked: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.srv.url, timeout=60) as client:
            i = 0
            while not self.stop.is_set():
                text = f"turn number {i}"
                r = client.post(f"/cache/{self.name}", json={"input_history": [{"role": "user", "content": text}]})
                if r.status_code == 200:
                    self.acked.append(text)
                i += 1


def seed(srv: LiveServer) -> None:
    facts = [
        {"text": "Master likes flying kites on windy days", "importance": 6, "entity": "master"},
        {"text": "Master drinks jasmine tea after dinner", "importance": 7, "entity": "master"},
        {"text": "Master owns a red bicycle", "importance": 5, "entity": "master"},
    ]
    assert srv.post("/api/characters/Lan/facts", json={"facts": facts}).status_code == 200
    assert (
        srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan is a cheerful cat girl"}]}).status_code
        == 200
    )
    history = [{"role": "user", "content": "I went to the park with my kite"}, {"role": "assistant", "content": "Sounds fun!"}]
    assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200


def test_backup_and_export_while_writes_go_on_restore_the_same_answers(tmp_path):
    clock = ManualClock(datetime(2026, 5, 1, 12, tzinfo=timezone.utc))
    source = tmp_path / "memory"
    with LiveServer(make_settings(source), clock=clock) as srv:
        seed(srv)
        expected = answers(srv, "Lan")
        writer = Writer(srv, "Mika")
        writer.start()
        try:
            wait_for(lambda: len(writer.acked) >= 20, what="writes before the backup")
            before = len(writer.acked)
            status, said = run_cli("backup", str(tmp_path / "backup"), "--url", srv.url)
            assert status == 0, said
            status, said = run_cli("export", str(tmp_path / "all.json"), "--url", srv.url)
            assert status == 0, said
            wait_for(lambda: len(writer.acked) >= before + 20, what="writes after the backup")
        finally:
            writer.stop.set()
            writer.join(timeout=60)
        # The copy could not be taken offline: the server holds the root.
        status, said = run_cli("backup", str(tmp_path / "other"), "--memory-root", str(source), "--offline")
        assert status == 2 and "server" in said

        for how, src in (("restore", tmp_path / "backup"), ("import", tmp_path / "all.json")):
            target = tmp_path / f"restored-{how}"
            status, said = run_cli(how, str(src), "--memory-root", str(target))
            assert status == 0, said
            with LiveServer(make_settings(target), clock=clock) as copy:
                assert answers(copy, "Lan") == expected, how
                got = journal_texts(copy, "Mika")
                # A consistent state: exactly the first n acknowledged turns, n covering at
                # least what was acknowledged before the copy began.
                assert got == writer.acked[: len(got)] and len(got) >= before, (how, len(got), before)
                window = [i["text"] for i in copy.get("/api/characters/Mika/recent").json()["items"]]
                assert window and window == got[-len(window) :], how
            # Restoring again over the same characters is refused without --replace.
            status, said = run_cli(how, str(src), "--memory-root", str(target))
            assert status == 2 and "--replace" in said

        # Writes over: a backup now restores Mika's answers too.
        expected_mika = answers(srv, "Mika")
        status, said = run_cli("backup", str(tmp_path / "backup2"), "--url", srv.url, "--character", "Mika")
        assert status == 0, said
    status, said = run_cli("restore", str(tmp_path / "backup2"), "--memory-root", str(tmp_path / "restored2"))
    assert status == 0, said
    with LiveServer(make_settings(tmp_path / "restored2"), clock=clock) as copy:
        assert answers(copy, "Mika") == expected_mika
    # With no server, backup works on the folder itself.
    status, said = run_cli("backup", str(tmp_path / "offline"), "--memory-root", str(source), "--url", "http://127.0.0.1:9")
    assert status == 0, said
    assert sorted(p.name for p in (tmp_path / "offline").iterdir() if p.is_dir()) == ["Lan", "Mika"]
    document = json.loads((tmp_path / "all.json").read_text(encoding="utf-8"))
    assert document["format"] == "nekomem-export" and {c["name"] for c in document["characters"]} == {"Lan", "Mika"}


def test_delete_command(tmp_path):
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        seed(srv)
        fid = srv.get("/api/characters/Lan/facts").json()["items"][0]["id"]
        status, said = run_cli("delete", "Lan", "--fact", fid, "--url", srv.url)
        assert status == 2 and "--yes" in said  # not a terminal: no silent deletion
        status, said = run_cli("delete", "Lan", "--fact", fid, "--url", srv.url, "--yes")
        assert status == 0, said
        assert fid not in [f["id"] for f in srv.get("/api/characters/Lan/facts").json()["items"]]
        row = srv.get("/api/browse/Lan/journal", params={"q": "kite"}).json()["items"][0]["id"]
        status, said = run_cli("delete", "Lan", "--turn", str(row), "--url", srv.url, "--yes")
        assert status == 0 and "forgot 1" in said, said
        status, said = run_cli("delete", "Nobody", "--url", srv.url, "--yes")
        assert status == 2 and "unknown_character" in said
        status, said = run_cli("delete", "Lan", "--url", srv.url, "--yes")
        assert status == 0, said
        assert not (root / "Lan").exists()
        srv.post("/cache/Mika", json={"input_history": [{"role": "user", "content": "hello"}]})
        # One memory needs the server; with it stopped, a whole character can still go.
        status, said = run_cli("delete", "Mika", "--memory-root", str(root), "--offline", "--yes")
        assert status == 2 and "server" in said and (root / "Mika").exists()
    status, said = run_cli("delete", "Mika", "--fact", "fact_x", "--memory-root", str(root), "--url", "http://127.0.0.1:9", "--yes")
    assert status == 2 and "running server" in said
    status, said = run_cli("delete", "Mika", "--memory-root", str(root), "--url", "http://127.0.0.1:9", "--yes")
    assert status == 0, said
    assert not (root / "Mika").exists()


def test_backup_through_a_server_with_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("NEKOMEM_API_TOKEN", raising=False)
    with LiveServer(make_settings(tmp_path / "memory", api_token="s3cret-token")) as srv:
        headers = {"Authorization": "Bearer s3cret-token"}
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]}, headers=headers)
        status, said = run_cli("backup", str(tmp_path / "no-token"), "--url", srv.url)
        assert status == 2 and "401" in said, said
        assert not (tmp_path / "no-token").exists()  # refused before anything was written
        status, said = run_cli("backup", str(tmp_path / "with-token"), "--url", srv.url, "--token", "s3cret-token")
        assert status == 0, said
        monkeypatch.setenv("NEKOMEM_API_TOKEN", "s3cret-token")
        status, said = run_cli("export", str(tmp_path / "all.json"), "--url", srv.url)
        assert status == 0, said
    assert (tmp_path / "with-token" / "Lan" / "time_indexed.db").is_file()


@pytest.mark.parametrize(
    "character",
    [
        {"name": "..", "files": {}, "logs": {}, "journal": {"rows": []}},
        {"name": "Lan", "files": {"../evil.json": {}}, "logs": {}, "journal": {"rows": []}},
        {"name": "Lan", "files": {"sub/evil.json": {}}, "logs": {}, "journal": {"rows": []}},
        {"name": "Lan", "files": {}, "logs": {"evil.sh": []}, "journal": {"rows": []}},
        {"name": "Lan", "files": {}, "logs": {}, "journal": {"rows": [{"id": "one"}]}},
    ],
)
def test_import_refuses_a_document_that_writes_outside_its_folder(tmp_path, character):
    character = {"format": "nekomem-character", "version": 1, **character}
    source = tmp_path / "crafted.json"
    source.write_text(json.dumps({"format": "nekomem-export", "version": 1, "characters": [character]}), encoding="utf-8")
    status, said = run_cli("import", str(source), "--memory-root", str(tmp_path / "memory"))
    assert status == 2, said
    assert not (tmp_path / "evil.json").exists() and not (tmp_path / "memory" / "sub").exists()
    assert not (tmp_path / "memory" / "Lan").exists()  # checked whole before anything is written
