"""Characters made by accident (issue 37, item 6), on real servers and the real CLI: a read
or an empty write creates no character; the first write that stores something records
when, through which route and from which kind of client the character was created; an
operator renames a character or merges two (over HTTP, through the CLI with the server
running, and offline under the root lock), keeping every layer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_llm import FakeLLM, Reply
from tests.support.live import ROOT, LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

UA = {"User-Agent": "python-httpx/0.28.1"}


def cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["NEKOMEM_EMBEDDING_ENABLED"] = "false"
    return subprocess.run(
        [sys.executable, "-m", "nekomem", *args, "--memory-root", str(root)], env=env, capture_output=True, text=True, timeout=120
    )


def names(srv: LiveServer) -> list[str]:
    return sorted(c["name"] for c in srv.get("/api/characters").json()["characters"])


def browse_row(srv: LiveServer, name: str) -> dict[str, Any]:
    return next(r for r in srv.get("/api/browse/characters").json()["characters"] if r["name"] == name)


def turn(text: str, role: str = "user", at: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": text}
    if at is not None:
        message["timestamp"] = at
    return message


# -- no character from a read or an empty write ----------------------------------------------
def test_reads_empty_writes_and_entry_changes_create_no_character(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        n = "Nobody"
        # The reference's answers for an unknown character / an empty list.
        assert srv.post(f"/cache/{n}", json={"input_history": []}).json() == {"status": "cached", "count": 0}
        assert srv.post(f"/process/{n}", json={"input_history": []}).json() == {"status": "processed"}
        assert srv.post(f"/renew/{n}", json={"input_history": []}).json() == {"status": "processed"}
        assert srv.post(f"/settle/{n}", json={"input_history": []}).json() == {"status": "settled"}
        assert srv.get(f"/new_dialog/{n}").text == ""
        assert srv.get(f"/get_recent_history/{n}").status_code == 200
        assert srv.get(f"/last_conversation_gap/{n}").json() == {"gap_seconds": -1}
        assert srv.post(f"/query_memory/{n}", json={"query": "cats"}).json()["results"] == []
        reflected = srv.post(f"/reflect/{n}").json()
        assert reflected["reflection"] is None and reflected["auto_transitions"] == 0
        assert srv.post(f"/api/characters/{n}/facts", json={"facts": []}).json() == {"added": [], "skipped_duplicates": 0}
        assert srv.post(f"/api/characters/{n}/card", json={"entries": []}).json() == {"added": [], "skipped_existing": 0}
        for method, path, body in (
            ("PATCH", f"/api/characters/{n}/facts/fact_x", {"text": "x"}),
            ("DELETE", f"/api/characters/{n}/facts/fact_x", None),
            ("POST", f"/api/characters/{n}/reflections/ref_x/feedback", {"feedback": "confirmed"}),
            ("POST", f"/api/browse/{n}/persona/p_x/suppress", {"suppress": True}),
            ("PATCH", f"/api/characters/{n}/recent/0", {"text": "x"}),
        ):
            r = srv.client.request(method, path, json=body)
            assert (r.status_code, r.json()["error_code"]) == (404, "unknown_character"), (path, r.text)
        assert not (tmp_path / n).exists()
        assert names(srv) == [] and srv.get("/api/browse/characters").json()["characters"] == []


# -- the origin of a character -----------------------------------------------------------------
def test_the_first_write_records_when_through_which_route_and_client(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [turn("I have a secret garden")]}, headers=UA).status_code == 200
        origin = json.loads((tmp_path / "Lan" / "origin.json").read_text())
        assert origin["route"] == "POST /cache/{name}" and origin["client"] == "python-httpx" and origin["created_at"]
        assert "garden" not in json.dumps(origin)  # metadata only, no memory text
        # A later write does not change it.
        srv.post("/cache/Lan", json={"input_history": [turn("more")]}, headers={"User-Agent": "curl/8.5.0"})
        assert json.loads((tmp_path / "Lan" / "origin.json").read_text()) == origin
        # Another route, another client kind; a browser is a "browser".
        assert (
            srv.post(
                "/api/characters/Mei/facts", json={"facts": [{"text": "Master likes tea"}]}, headers={"User-Agent": "curl/8.5.0"}
            ).status_code
            == 200
        )
        assert browse_row(srv, "Mei")["origin"]["route"] == "POST /api/characters/{name}/facts"
        assert browse_row(srv, "Mei")["origin"]["client"] == "curl"
        browser = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120 Safari/537.36"}
        srv.post("/api/characters/Kai/card", json={"entries": [{"entity": "neko", "text": "Kai is a fox"}]}, headers=browser)
        assert browse_row(srv, "Kai")["origin"]["client"] == "browser"
        assert browse_row(srv, "Lan")["origin"] == origin


# -- rename and merge --------------------------------------------------------------------------
def _layers(srv: LiveServer, name: str) -> dict[str, Any]:
    get = lambda layer: sorted(e["text"] for e in srv.get(f"/api/characters/{name}/{layer}", params={"limit": 100}).json()["items"])  # noqa: E731
    journal = srv.get(f"/api/browse/{name}/journal", params={"order": "asc", "limit": 100}).json()["items"]
    return {
        "facts": get("facts"),
        "reflections": get("reflections"),
        "persona": get("persona"),
        "recent": [i["text"] for i in srv.get(f"/api/characters/{name}/recent").json()["items"]],
        "journal": [r["text"] for r in journal],
    }


def _pending_outbox(folder: Path) -> set[str]:
    lines = [json.loads(x) for x in (folder / "outbox.ndjson").read_text().splitlines() if x.strip()]
    done = {x["op_id"] for x in lines if x["status"] == "done"}
    return {x["op_id"] for x in lines if x["status"] == "pending" and x["op_id"] not in done}


KITES = [{"text": f"Master flew a kite at the {p}", "importance": 7} for p in ("beach", "park", "hill", "field", "river")]


def _seed(srv: LiveServer, name: str) -> None:
    assert (
        srv.post(
            f"/cache/{name}", json={"input_history": [turn("The wind was strong at the beach"), turn("Kites!", "assistant")]}
        ).status_code
        == 200
    )
    assert srv.post(f"/api/characters/{name}/facts", json={"facts": KITES}).status_code == 200
    assert srv.post(f"/api/characters/{name}/card", json={"entries": [{"entity": "neko", "text": "Speaks softly"}]}).status_code == 200
    assert srv.post(f"/reflect/{name}").json()["reflection"] is not None


@pytest.fixture
def modelled(fake_llm: FakeLLM) -> FakeLLM:
    reflection = {
        "text": "Master enjoys windy days outdoors",
        "entity": "master",
        "time_scope": "pattern",
        "event_start_at": None,
        "event_end_at": None,
    }
    fake_llm.on("synthesize_reflection", {"reflection": reflection})
    fake_llm.on("extract_facts", Reply.status(500, "down"))  # post-turn work stays pending in the outbox
    return fake_llm


def test_rename_over_http_keeps_every_layer(tmp_path, modelled, embedding_service):
    settings = make_settings(tmp_path, llm_base_url=modelled.base_url, llm_model="fake", outbox_max_attempts=100)
    with LiveServer(settings, embeddings=embedding_service) as srv:
        _seed(srv, "Lna")  # the mistyped name
        quiesce(srv.runtime, "Lna")
        before = _layers(srv, "Lna")
        pending = _pending_outbox(tmp_path / "Lna")
        assert before["facts"] and before["reflections"] and before["persona"] and before["journal"] and pending
        found = srv.post("/query_memory/Lna", json={"query": "kite at the hill"}).json()["results"]
        assert found and found[0]["text"] == "Master flew a kite at the hill"

        r = srv.post("/api/characters/Lna/rename", json={"to": "Lan"})
        assert r.status_code == 200 and r.json() == {"name": "Lan", "renamed_from": "Lna"}
        assert names(srv) == ["Lan"] and not (tmp_path / "Lna").exists()
        assert _layers(srv, "Lan") == before
        assert _pending_outbox(tmp_path / "Lan") >= pending
        # The recall index is rebuilt under the new name, vectors included.
        again = srv.post("/query_memory/Lan", json={"query": "kite at the hill"}).json()
        assert again["results"][0]["text"] == "Master flew a kite at the hill"
        assert srv.get("/new_dialog/Lna").text == ""  # the old name is unknown now
        origin = browse_row(srv, "Lan")["origin"]
        assert origin["route"] == "POST /cache/{name}" and [x["name"] for x in origin["renamed_from"]] == ["Lna"]
        # Refusals: the new name exists; the old one does not; a bad name. Nothing changes.
        srv.post("/cache/Mei", json={"input_history": [turn("hello")]})
        assert (srv.post("/api/characters/Lan/rename", json={"to": "Mei"}).status_code, names(srv)) == (409, ["Lan", "Mei"])
        assert srv.post("/api/characters/Gone/rename", json={"to": "X"}).json()["error_code"] == "unknown_character"
        assert srv.post("/api/characters/Lan/rename", json={"to": "a/b"}).status_code == 400
        assert srv.post("/api/characters/Lan/rename", content=b'{"to": "X"}', headers={"Content-Type": "text/plain"}).status_code == 415
        assert _layers(srv, "Lan") == before


def test_merge_through_the_cli_with_the_server_running_orders_the_journal_by_time(tmp_path, modelled, embedding_service):
    settings = make_settings(tmp_path, llm_base_url=modelled.base_url, llm_model="fake", outbox_max_attempts=100)
    with LiveServer(settings, embeddings=embedding_service) as srv:
        _seed(srv, "Lan")
        at = ["2026-01-01T10:00:00+00:00", "2026-01-02T10:00:00+00:00", "2026-01-03T10:00:00+00:00", "2026-01-04T10:00:00+00:00"]
        srv.post("/cache/Lan", json={"input_history": [turn("first day", at=at[0]), turn("third day", at=at[2])]})
        srv.post("/cache/Lna", json={"input_history": [turn("second day", at=at[1]), turn("fourth day", at=at[3])]}, headers=UA)
        srv.post("/api/characters/Lna/facts", json={"facts": [{"text": "Master owns a red bicycle"}, {"text": KITES[0]["text"]}]})
        srv.post("/api/characters/Lna/card", json={"entries": [{"entity": "neko", "text": "Loves fish"}]})
        quiesce(srv.runtime, "Lan")
        quiesce(srv.runtime, "Lna")
        lan, lna = _layers(srv, "Lan"), _layers(srv, "Lna")
        pending = _pending_outbox(tmp_path / "Lan") | _pending_outbox(tmp_path / "Lna")

        done = cli("characters", "merge", "Lna", "Lan", "--url", srv.url, root=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "merged Lna into Lan" in done.stdout
        assert names(srv) == ["Lan"] and not (tmp_path / "Lna").exists()
        merged = _layers(srv, "Lan")
        journal = merged["journal"]
        assert sorted(journal) == sorted(lan["journal"] + lna["journal"])  # every row, once
        days = [t for t in journal if t.endswith(" day")]
        assert days == ["first day", "second day", "third day", "fourth day"]  # ordered by time
        assert merged["facts"] == sorted(set(lan["facts"]) | {"Master owns a red bicycle"})  # an equal fact is kept once
        assert merged["reflections"] == lan["reflections"]
        assert merged["persona"] == sorted(lan["persona"] + ["Loves fish"])
        assert set(merged["recent"]) == set(lan["recent"]) | set(lna["recent"])
        assert _pending_outbox(tmp_path / "Lan") >= pending
        assert srv.post("/query_memory/Lan", json={"query": "red bicycle"}).json()["results"][0]["text"] == "Master owns a red bicycle"
        origin = browse_row(srv, "Lan")["origin"]
        assert origin["merged_from"][0]["name"] == "Lna" and origin["merged_from"][0]["origin"]["client"] == "python-httpx"
        # New turns keep numbering after the merged rows.
        srv.post("/cache/Lan", json={"input_history": [turn("after the merge")]})
        assert _layers(srv, "Lan")["journal"][-1] == "after the merge"

        refused = cli("characters", "merge", "Lan", "Nobody", "--url", srv.url, root=tmp_path)
        assert refused.returncode == 2 and "unknown_character" in refused.stderr


def test_offline_rename_and_merge_under_the_root_lock(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        srv.post("/cache/Lna", json={"input_history": [turn("one", at="2026-01-01T10:00:00+00:00")]})
        srv.post("/cache/Mei", json={"input_history": [turn("two", at="2026-01-02T10:00:00+00:00")]})
        srv.post("/api/characters/Mei/facts", json={"facts": [{"text": "Master likes tea"}]})
        # A server runs on the root: --offline is refused (the lock), nothing changes.
        locked = cli("characters", "rename", "Lna", "Lan", "--offline", root=tmp_path)
        assert locked.returncode == 2 and "server is using it" in locked.stderr
    renamed = cli("characters", "rename", "Lna", "Lan", root=tmp_path)  # no server answers: offline
    assert renamed.returncode == 0 and "renamed Lna to Lan" in renamed.stdout, renamed.stderr
    merged = cli("characters", "merge", "Mei", "Lan", root=tmp_path)
    assert merged.returncode == 0, merged.stderr
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        assert names(srv) == ["Lan"]
        assert [r["text"] for r in srv.get("/api/browse/Lan/journal", params={"order": "asc"}).json()["items"]] == ["one", "two"]
        assert [f["text"] for f in srv.get("/api/characters/Lan/facts").json()["items"]] == ["Master likes tea"]
        wait_for(lambda: "two" in srv.get("/new_dialog/Lan").text, what="the merged window")
        origin = browse_row(srv, "Lan")["origin"]
        assert [x["name"] for x in origin["renamed_from"]] == ["Lna"] and [x["name"] for x in origin["merged_from"]] == ["Mei"]
    assert cli("characters", "merge", "Lan", "Lan", root=tmp_path).returncode == 2
    assert cli("characters", "rename", "Nobody", "X", root=tmp_path).returncode == 2
