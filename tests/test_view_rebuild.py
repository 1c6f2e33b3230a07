"""Issue 10, finding 8 over real HTTP: a corrupt (truncated) view is rebuilt from the
journal and the archive; what the journal no longer holds is reported in /health."""

from __future__ import annotations

import json
import secrets

from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


def _texts(n: int) -> list[str]:
    return [" ".join(secrets.token_hex(4) for _ in range(5)) for _ in range(n)]


def _fact_texts(srv) -> set[str]:
    body = srv.get("/api/characters/Lan/facts", params={"status": "all", "limit": 1000}).json()
    return {i["text"] for i in body["items"]}


def test_a_truncated_facts_view_is_rebuilt_from_the_journal(tmp_path):
    texts = _texts(12)
    with LiveServer(make_settings(tmp_path)) as srv:
        assert len(srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in texts]}).json()["added"]) == 12
    view = tmp_path / "Lan" / "facts.json"
    data = view.read_bytes()
    assert json.loads(data) and len(json.loads(data)) == 12
    view.write_bytes(data[: len(data) // 2])  # torn: not valid JSON
    with LiveServer(make_settings(tmp_path)) as srv:
        assert _fact_texts(srv) == set(texts)
        health = srv.get("/health").json()
        assert health["storage"]["unrebuilt_views"] == []
    assert list((tmp_path / "Lan").glob("facts.json.corrupt-*"))  # the damaged file is kept
    assert len(json.loads(view.read_bytes())) == 12  # and the view is whole again


def test_what_a_compacted_journal_cannot_rebuild_is_reported_in_health(tmp_path):
    old, new = _texts(12), _texts(3)
    settings = make_settings(tmp_path, events_compact_lines=10, view_flush_seconds=0)
    with LiveServer(settings) as srv:
        srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in old]})
        applied = tmp_path / "Lan" / "events_applied.json"
        wait_for(lambda: applied.exists() and json.loads(applied.read_text()).get("compacted_at"), what="journal compaction")
        for text in new:  # after the compaction: still in the journal
            srv.post("/api/characters/Lan/facts", json={"facts": [{"text": text}]})
    view = tmp_path / "Lan" / "facts.json"
    view.write_bytes(view.read_bytes()[:40])
    with LiveServer(make_settings(tmp_path)) as srv:
        assert _fact_texts(srv) == set(new)
        unrebuilt = srv.get("/health").json()["storage"]["unrebuilt_views"]
        assert [(u["character"], u["view"]) for u in unrebuilt] == [("Lan", "facts.json")]
        assert "compaction" in unrebuilt[0]["detail"]
