"""Scoped forgetting by generation, as the reference's memory/scoped_client.py uses it:
``forget_epoch`` on scoped_forget, ``subject_epochs`` on scoped_history and
``GET forget_epochs`` (real server, real files, the loopback LLM)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.live import LiveServer, make_settings

NAME = "Lan"
MEMBER = {"subject_kind": "group_participant", "subject_id": "qq:123456:777"}
OTHER = {"subject_kind": "group_participant", "subject_id": "qq:123456:888"}
KEY, OTHER_KEY = "group_participant:qq:123456:777", "group_participant:qq:123456:888"


def history(subject: dict, text: str, **extra: object) -> dict:
    return {"subject": subject, "input_history": json.dumps([{"role": "user", "content": text}]), "speaker_label": "777", **extra}


def facts_of(srv: LiveServer, subject_id: str) -> list[str]:
    items = srv.get(f"/api/characters/{NAME}/facts", params={"limit": 1000}).json()["items"]
    return [f["text"] for f in items if f.get("subject_id") == subject_id]


def test_forget_epochs_fence_stale_history_and_survive_a_restart(tmp_path: Path, fake_llm) -> None:
    fake_llm.on("extract_facts", {"facts": [{"text": "Member 777 collects vinyl records", "importance": 7, "entity": "master"}]})
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    url = f"/internal/memory/{NAME}"
    with LiveServer(settings) as srv:
        assert srv.get(f"{url}/forget_epochs", params={"subject": KEY}).json() == {"epochs": {}}
        r = srv.post(f"{url}/scoped_history", json=history(MEMBER, "I collect vinyl", subject_epochs={KEY: 0}))
        assert r.status_code == 200 and r.json()["created"] == 1, r.text
        assert r.json()["trust"]["persisted"] is None  # the reference client reads null as settled

        r = srv.post(f"{url}/scoped_forget", json={"subject": MEMBER, "forget_epoch": 1}).json()
        assert r["status"] == "forgotten" and r["forget_epoch"] == 1 and r["removed"]["facts"] == 1
        assert facts_of(srv, "qq:123456:777") == []
        # A lower generation never lowers the tombstone.
        assert srv.post(f"{url}/scoped_forget", json={"subject": MEMBER, "forget_epoch": 0}).json()["forget_epoch"] == 1
        got = srv.get(f"{url}/forget_epochs", params=[("subject", KEY), ("subject", OTHER_KEY)]).json()
        assert got == {"epochs": {KEY: 1}}

        # A write produced before the erase (stamped with generation 0) is dropped, unextracted.
        calls = len(fake_llm.calls("extract_facts"))
        r = srv.post(f"{url}/scoped_history", json=history(MEMBER, "I collect vinyl", subject_epochs={KEY: 0})).json()
        assert r["status"] == "processed" and r["created"] == 0 and r["fenced"] is True and r["dropped"] == 1
        assert len(fake_llm.calls("extract_facts")) == calls and facts_of(srv, "qq:123456:777") == []
        # In a batch only the stale subject's segment is dropped.
        batch = {
            "segments": [history(MEMBER, "still vinyl"), history(OTHER, "I like jazz")],
            "subject_epochs": {KEY: 0, OTHER_KEY: 0},
        }
        rows = srv.post(f"{url}/scoped_history", json=batch).json()["segments"]
        assert [(r["status"], r.get("fenced", False), r["created"]) for r in rows] == [("ok", True, 0), ("ok", False, 1)]
        assert facts_of(srv, "qq:123456:777") == [] and len(facts_of(srv, "qq:123456:888")) == 1
        # A write that knows the erase (generation 1), and an unstamped one (an older client), are stored.
        r = srv.post(f"{url}/scoped_history", json=history(MEMBER, "new vinyl", subject_epochs={KEY: 1})).json()
        assert r["created"] == 1 and "fenced" not in r

        # Bad input is refused with the field named.
        keys = [("subject", f"group_chat:qq:{i}") for i in range(65)]
        r = srv.get(f"{url}/forget_epochs", params=keys)
        assert r.status_code == 422 and r.json()["error_code"] == "too_many_subjects"
        r = srv.post(f"{url}/scoped_history", json=history(MEMBER, "x", subject_epochs={KEY: "one"}))
        assert r.status_code == 422 and r.json()["error_code"] == "bad_subject_epochs"
        r = srv.post(f"{url}/scoped_forget", json={"subject": MEMBER, "forget_epoch": -1})
        assert r.status_code == 422 and r.json()["error_code"] == "bad_forget_epoch"
    with LiveServer(settings) as srv:
        assert srv.get(f"{url}/forget_epochs", params={"subject": KEY}).json() == {"epochs": {KEY: 1}}
        r = srv.post(f"{url}/scoped_history", json=history(MEMBER, "old vinyl", subject_epochs={}))
        assert r.json()["fenced"] is True  # a stamp without this subject counts as generation 0
        # A forget of a character with no memory yet still leaves its tombstone.
        assert srv.post("/internal/memory/Mochi/scoped_forget", json={"subject": MEMBER, "forget_epoch": 4}).json()["forget_epoch"] == 4
        assert srv.get("/internal/memory/Mochi/forget_epochs", params={"subject": KEY}).json() == {"epochs": {KEY: 4}}
