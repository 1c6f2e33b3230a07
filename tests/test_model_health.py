"""/health tells model trouble: a tier that times out is ``failing`` (with since when and
the error) and the server ``degraded``; after a valid answer the tier is ``ok`` again and
the error is no longer current. The typed client reads all of it, and a server that cannot
be reached raises the client's NekomemError."""

from __future__ import annotations

import pytest

from nekomem.client import NekomemClient, NekomemError
from tests.support.live import LiveServer, free_port, make_settings
from tests.support.waiting import wait_for


def tier(srv: LiveServer, name: str = "summary") -> dict:
    return srv.get("/health").json()["llm"]["tiers"][name]


def test_a_hanging_model_shows_as_failing_then_recovers(tmp_path, fake_llm):
    fake_llm.set_delay(None, 600.0)  # hangs until released below (or the fake closes)
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        llm_timeout_seconds=1.0,
        longterm_extract_timeout_seconds=1.0,
        llm_max_retries=0,
        powerful_memory_default=False,  # one extraction per /cache
        review_enabled=False,
        outbox_retry_delay_seconds=0.0,
    )
    with LiveServer(settings) as srv:
        health = srv.get("/health").json()
        assert health["overall"] == "ok" and tier(srv)["state"] == "untried"
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "I adopted a cat"}]}).status_code == 200
        failing = wait_for(lambda: (lambda t: t if t["state"] == "failing" else None)(tier(srv)), what="the failing tier")
        assert "timed out" in failing["last_error"] and failing["failing_since"] and failing["last_success_at"] is None
        health = srv.get("/health").json()
        # The launcher's probe keeps seeing a live server; the trouble is in "overall".
        assert health["status"] == "ok" and health["overall"] == "degraded"
        assert health["llm"]["state"] == "failing" and "summary" in health["llm"]["failing_tiers"]

        with NekomemClient(srv.url) as client:
            typed = client.health()
        assert typed.overall == "degraded" and typed.llm is not None and typed.llm.tiers["summary"].state == "failing"
        assert typed.embeddings is not None and typed.active_characters == 1

        fake_llm.set_delay(None, 0.0)
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "her name is Pixel"}]}).status_code == 200
        ok = wait_for(lambda: (lambda t: t if t["state"] == "ok" else None)(tier(srv)), what="the recovered tier")
        assert ok["last_error"] is None and ok["failing_since"] is None and ok["last_success_at"]
        assert "timed out" in ok["recovered_error"]
        assert srv.get("/health").json()["overall"] == "ok"


@pytest.mark.parametrize(
    ("base_url", "model", "expected"),
    [("localhost:8080", "qwen", "no http:// or https:// scheme"), ("http://127.0.0.1:9/v1", "", "no LLM model name")],
)
def test_suspicious_model_settings_are_reported(tmp_path, base_url, model, expected):
    with LiveServer(make_settings(tmp_path, llm_base_url=base_url, llm_model=model)) as srv:
        warnings = srv.get("/health").json()["llm"]["config_warnings"]
        assert len(warnings) == 1 and expected in warnings[0] and "summary, correction, emotion" in warnings[0], warnings


def test_an_unreachable_server_raises_the_clients_error():
    with NekomemClient(f"http://127.0.0.1:{free_port()}", retries=0) as client, pytest.raises(NekomemError) as caught:
        client.health()
    assert caught.value.status == 0 and caught.value.error_code == "unreachable"
