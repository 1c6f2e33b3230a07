"""/health, limited mode and the powerful-memory switch over real HTTP."""

from __future__ import annotations

import json

from tests.support.live import LiveServer, make_settings


def test_health_reports_llm_and_embeddings(tmp_path, fake_llm):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        body = srv.get("/health").json()
        assert body["status"] == "ok" and body["limited_mode"] is False
        assert body["llm"]["available"] is False
        assert set(body["llm"]["skipped_tiers"]) == {"summary", "correction", "emotion"}
        assert body["embeddings"]["state"] == "disabled"
        assert body["active_characters"] == 0
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="m", llm_emotion_base_url="", embedding_enabled=False)
    with LiveServer(settings) as srv:
        body = srv.get("/health").json()
        assert body["llm"]["available"] is True
        assert body["llm"]["tiers"]["summary"]["model"] == "m"
        assert "api_key" not in json.dumps(body).lower()


def test_limited_mode_answers_409_except_health(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.runtime.limited_reason = "storage_recovery_pending"
        try:
            r = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]})
            assert r.status_code == 409
            body = r.json()
            assert body["error_code"] == "storage_startup_blocked" and body["limited_mode"] is True and body["ok"] is False
            assert body["blocking_reason"] == "storage_recovery_pending"
            assert srv.get("/new_dialog/Lan").status_code == 409
            health = srv.get("/health")
            assert health.status_code == 200 and health.json()["limited_mode"] is True
        finally:
            srv.runtime.limited_reason = None
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]}).status_code == 200
        assert not (tmp_path / "Lan" / "recent.json").read_text().count('"x"') > 1


def test_powerful_memory_switch_is_persisted_and_validated(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": True}
        bad = srv.post("/api/memory/powerful_memory_config", json={"enabled": "no"})
        assert bad.status_code == 400 and bad.json()["status"] == "error"
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).json() == {"success": True, "enabled": False}
    stored = json.loads((tmp_path / "core_config.json").read_text())
    assert stored["powerful_memory_enabled"] is False
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": False}
        (tmp_path / "core_config.json").write_text(json.dumps({"powerful_memory_enabled": "maybe"}))
        r = srv.get("/api/memory/powerful_memory_config")
        assert r.status_code == 503 and r.json()["error_code"] == "invalid_memory_setting"
        assert srv.post("/internal/memory/reset_confirmed_at").json() == {"ok": True, "count": 0}
