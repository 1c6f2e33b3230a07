"""A keyed ``scoped_history`` write (``idempotency_key``, as the reference's
memory/scoped_client.py sends it) is extracted once: a retry under the key is answered
from the character's idempotency_keys.json with ``duplicate: true`` (real server, the
loopback LLM counting model calls)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.live import LiveServer, make_settings

NAME = "Lan"
MEMBER = {"subject_kind": "group_participant", "subject_id": "qq:123456:777"}
OTHER = {"subject_kind": "group_participant", "subject_id": "qq:123456:888"}


def history(subject: dict, text: str, **extra: object) -> dict:
    return {"subject": subject, "input_history": json.dumps([{"role": "user", "content": text}]), "speaker_label": "777", **extra}


def test_a_keyed_retry_is_answered_not_extracted_again(tmp_path: Path, fake_llm) -> None:
    fake_llm.on("extract_facts", {"facts": [{"text": "Member 777 collects vinyl records", "importance": 7, "entity": "master"}]})
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    url = f"/internal/memory/{NAME}/scoped_history"
    keyed = history(MEMBER, "I collect vinyl", idempotency_key="qq:digest:42", client_requested_at=1765000000.5)
    with LiveServer(settings) as srv:
        first = srv.post(url, json=keyed)
        assert first.status_code == 200 and first.json()["created"] == 1, first.text
        calls = len(fake_llm.calls("extract_facts"))
        retry = srv.post(url, json={**keyed, "client_requested_at": 1765000009.0})
        assert retry.status_code == 200 and retry.json()["duplicate"] is True
        assert retry.json()["fact_ids"] == first.json()["fact_ids"] and retry.json()["status"] == "processed"
        assert len(fake_llm.calls("extract_facts")) == calls
        facts = [f for f in srv.get(f"/api/characters/{NAME}/facts").json()["items"] if f.get("subject_id") == MEMBER["subject_id"]]
        assert len(facts) == 1
        # The same key on another request is a caller bug, refused; nothing is extracted.
        reused = srv.post(url, json=history(MEMBER, "something else", idempotency_key="qq:digest:42"))
        assert reused.status_code == 422 and reused.json()["error_code"] == "idempotency_key_reused"
        assert len(fake_llm.calls("extract_facts")) == calls
        # A keyed batch is recorded as a whole.
        batch = {"segments": [history(MEMBER, "vinyl again"), history(OTHER, "I like jazz")], "idempotency_key": "qq:batch:1"}
        rows = srv.post(url, json=batch).json()["segments"]
        assert [r["status"] for r in rows] == ["ok", "ok"]
        calls = len(fake_llm.calls("extract_facts"))
        again = srv.post(url, json=batch).json()
        assert again["duplicate"] is True and [r["fact_ids"] for r in again["segments"]] == [r["fact_ids"] for r in rows]
        assert len(fake_llm.calls("extract_facts")) == calls
        bad = srv.post(url, json=history(MEMBER, "x", idempotency_key=""))
        assert bad.status_code == 422 and bad.json()["error_code"] == "bad_idempotency_key"
    record = json.loads((tmp_path / NAME / "idempotency_keys.json").read_text(encoding="utf-8"))["qq:digest:42"]
    assert record["state"] == "done" and record["client_requested_at"] == 1765000000.5
    assert "vinyl" not in json.dumps(record)  # ids and counts, never what was said
    # After a restart the key is still known.
    with LiveServer(settings) as srv:
        calls = len(fake_llm.calls("extract_facts"))
        assert srv.post(url, json=keyed).json()["duplicate"] is True
        assert len(fake_llm.calls("extract_facts")) == calls
