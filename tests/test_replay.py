"""Journal and outbox replay: unapplied events are applied once, pending work runs once,
and replaying everything twice changes nothing."""

from __future__ import annotations

import json

import httpx

from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer, ServerProcess, make_settings
from tests.support.waiting import wait_for


def facts_view(root, name="Lan"):
    path = root / name / "facts.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else []


def import_facts(url, texts, name="Lan"):
    r = httpx.post(f"{url}/api/characters/{name}/facts", json={"facts": [{"text": t, "importance": 6} for t in texts]}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["added"]


def test_events_journaled_before_a_crash_are_applied_once_at_restart(tmp_path):
    server = ServerProcess(tmp_path, env={"NEKOMEM_VIEW_FLUSH_SECONDS": "3600", "NEKOMEM_VIEW_FLUSH_CHANGES": "100000"})
    server.start()
    try:
        added = import_facts(server.url, ["Master plays the violin", "Master's cat is named Mochi", "Master hates mornings"])
        assert len(added) == 3
    finally:
        server.kill()  # the views were not flushed yet: only the journal has the facts
    assert facts_view(tmp_path) == []
    events = [json.loads(line) for line in (tmp_path / "Lan" / "events.ndjson").read_text().splitlines()]
    assert [e["type"] for e in events] == ["fact.added"] * 3
    server.start()
    try:
        assert sorted(f["id"] for f in wait_for(lambda: facts_view(tmp_path), what="facts.json")) == sorted(added)
    finally:
        server.stop()
    # Replay everything twice: a lost sentinel and duplicated journal lines.
    journal = tmp_path / "Lan" / "events.ndjson"
    body = journal.read_text()
    journal.write_text(body + body if body else "".join(json.dumps(e) + "\n" for e in events) * 2)
    (tmp_path / "Lan" / "events_applied.json").unlink(missing_ok=True)
    server.start()
    try:
        listing = httpx.get(f"{server.url}/api/characters/Lan/facts", timeout=30).json()
        assert sorted(f["id"] for f in listing["items"]) == sorted(added)
    finally:
        server.stop()
    assert sorted(f["id"] for f in facts_view(tmp_path)) == sorted(added)


def test_outbox_work_pending_at_a_crash_runs_once_after_restart(tmp_path):
    with FakeLLM() as llm:
        llm.on(
            "extract_facts", lambda req: {"facts": [{"text": "Master grows tomatoes on the balcony", "importance": 6, "entity": "master"}]}
        )
        env = {"NEKOMEM_LLM_BASE_URL": llm.base_url, "NEKOMEM_LLM_MODEL": "fake", "NEKOMEM_POWERFUL_MEMORY_DEFAULT": "false"}
        folder = tmp_path / "Lan"
        folder.mkdir()
        record = {
            "op_id": "op-crashed-1",
            "type": "extract_facts",
            "payload": {"messages": [{"type": "human", "data": {"content": "my tomatoes are finally red!"}}]},
            "status": "pending",
            "ts": "2026-05-01T10:00:00+00:00",
        }
        (folder / "outbox.ndjson").write_text(json.dumps(record) + "\n")
        server = ServerProcess(tmp_path, env=env)
        server.start()
        try:
            wait_for(
                lambda: any("tomatoes" in f["text"] for f in httpx.get(f"{server.url}/api/characters/Lan/facts").json()["items"]),
                what="the replayed extraction",
            )
            lines = [json.loads(x) for x in (folder / "outbox.ndjson").read_text().splitlines()]
            assert any(x.get("op_id") == "op-crashed-1" and x["status"] == "done" for x in lines)
        finally:
            server.stop()
        assert len(llm.calls("extract_facts")) == 1
        # A restart does not run finished work again.
        server.start()
        try:
            # Start-up recovery activates only characters with unfinished work; once it is
            # over nothing else can start an extraction.
            wait_for(lambda: httpx.get(f"{server.url}/health").json()["status"] == "ok", what="recovery")
            assert not httpx.get(f"{server.url}/health").json()["limited_mode"]
        finally:
            server.stop()
        assert len(llm.calls("extract_facts")) == 1
        # Replaying the record a second time (done line lost) changes nothing stored.
        (folder / "outbox.ndjson").write_text(json.dumps(record) + "\n")
        server.start()
        try:
            wait_for(lambda: len(llm.calls("extract_facts")) == 2, what="the second replay")
            # The record is marked done only after its facts are journaled.
            wait_for(lambda: '"done"' in (folder / "outbox.ndjson").read_text(), what="the replayed record to finish")
            texts = [f["text"] for f in httpx.get(f"{server.url}/api/characters/Lan/facts").json()["items"]]
            assert texts.count("Master grows tomatoes on the balcony") == 1
        finally:
            server.stop()


def test_synthesis_retried_after_a_crash_yields_one_reflection(tmp_path, fake_llm):
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master is a keen gardener",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    facts = [f"Master waters the {plant} every morning" for plant in ("roses", "basil", "mint", "tomatoes", "ferns")]
    with LiveServer(settings) as srv:
        import_facts(srv.url, facts)
        first = srv.post("/reflect/Lan").json()["reflection"]["id"]
    # Simulate the crash between the reflection's write and the absorb of its facts:
    # drop the absorb events and the absorbed flags.
    folder = tmp_path / "Lan"
    journal = folder / "events.ndjson"
    kept = [line for line in journal.read_text().splitlines() if json.loads(line)["type"] != "fact.absorbed"]
    journal.write_text("\n".join(kept) + "\n")
    view = facts_view(tmp_path)
    for fact in view:
        fact["absorbed"] = False
    (folder / "facts.json").write_text(json.dumps(view))
    (folder / "events_applied.json").unlink()
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/facts", params={"status": "unabsorbed"}).json()["total"] == 5
        body = srv.post("/reflect/Lan").json()
        assert body["synthesis"] == {"status": "exists", "reflection_id": first}
        refs = srv.get("/api/characters/Lan/reflections").json()
        assert [r["id"] for r in refs["items"]] == [first]
        wait_for(lambda: srv.get("/api/characters/Lan/facts", params={"status": "absorbed"}).json()["total"] == 5, what="absorb")
    assert len(fake_llm.calls("synthesize_reflection")) == 1


def test_one_unrecoverable_character_does_not_block_start_up(tmp_path):
    good = tmp_path / "Good"
    good.mkdir()
    record = {"op_id": "op-1", "type": "extract_facts", "payload": {"messages": []}, "status": "pending", "ts": "2026-05-01T10:00:00+00:00"}
    (good / "outbox.ndjson").write_text(json.dumps(record) + "\n")
    bad = tmp_path / "Bad"
    bad.mkdir()
    (bad / "events.ndjson").mkdir()  # unreadable journal: this character cannot recover
    with LiveServer(make_settings(tmp_path, ask_timeout_seconds=5)) as srv:
        assert srv.get("/health").json()["limited_mode"] is False
        assert srv.runtime.recovery_error is not None
        assert srv.post("/cache/Good", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        lines = [json.loads(x) for x in (good / "outbox.ndjson").read_text().splitlines()]
        assert any(x["status"] == "done" for x in lines)
