"""nekomem.client against a real server: typed answers, the server's errors as
NekomemError, the token, and 503 retries honouring Retry-After without storing twice."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import httpx
import pytest

from nekomem.client import AsyncNekomemClient, FactImport, NekomemClient, NekomemError, retry_after_seconds
from nekomem.http.schemas import HealthAnswer, RecallAnswer
from tests.support.live import ROOT, LiveServer, make_settings

TURNS = [{"role": "user", "content": "I bought a green umbrella"}, {"role": "assistant", "content": "A fine colour"}]


def test_sync_client_round_trip(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv, NekomemClient(srv.url, token="") as client:
        health = client.health()
        assert isinstance(health, HealthAnswer) and health.server == "nekomem" and not health.limited_mode
        assert client.last_conversation_gap("Lan Ying") == -1
        assert client.new_dialog("Lan Ying") == ""
        assert client.cache("Lan Ying", TURNS).count == 2
        assert "green umbrella" in client.recent_history("Lan Ying")
        assert client.last_conversation_gap("Lan Ying") >= 0

        added = client.add_facts("Lan Ying", ["Master plays the cello", FactImport(text="Master lives in Osaka", importance=7)])
        assert len(added.added) == 2 and added.skipped_duplicates == 0
        assert client.add_facts("Lan Ying", ["Master plays the cello"]).skipped_duplicates == 1
        found = client.recall("Lan Ying", "cello")
        assert isinstance(found, RecallAnswer) and [r.text for r in found.results] == ["Master plays the cello"]
        assert found.results[0].tier == "fact" and found.results[0].id in added.added
        assert "cello" in (client.recall("Lan Ying", "cello", markdown=True).markdown or "")
        assert client.recall("Lan Ying").results == []

        page = client.entries("Lan Ying", "facts", limit=1)
        assert page.total == 2 and len(page.items) == 1
        assert {c.name for c in client.characters().characters} == {"Lan Ying"}

        with pytest.raises(NekomemError) as bad:
            client.add_facts("Lan Ying", [FactImport(text="fine"), FactImport(text=" ")])
        assert bad.value.status == 422 and bad.value.error_code == "schema_violation" and "facts[1]" in bad.value.message
        with pytest.raises(NekomemError) as unknown:
            client.persona("Nobody")
        assert (unknown.value.status, unknown.value.error_code) == (404, "unknown_character")
        with pytest.raises(NekomemError) as no_reflection:
            client.deny("Lan Ying", "ref_unknown")
        assert no_reflection.value.status == 404
        # Nothing already stored was lost by the refused calls.
        assert client.entries("Lan Ying", "facts").total == 2


def test_async_client_sends_the_token_from_the_environment(tmp_path, monkeypatch):
    async def run(url: str) -> None:
        async with AsyncNekomemClient(url, token="wrong") as client:
            with pytest.raises(NekomemError) as refused:
                await client.cache("Lan", TURNS)
            assert (refused.value.status, refused.value.error_code) == (401, "unauthorized")
            assert refused.value.body["status"] == "error"
        monkeypatch.setenv("NEKOMEM_API_TOKEN", "s3cret-token")
        async with AsyncNekomemClient(url) as client:
            assert (await client.cache("Lan", TURNS)).status == "cached"
            assert "umbrella" in await client.new_dialog("Lan")

    with LiveServer(make_settings(tmp_path, api_token="s3cret-token")) as srv:
        asyncio.run(run(srv.url))
        assert srv.get("/api/characters/Lan/recent", headers={"Authorization": "Bearer s3cret-token"}).json()["total"] == 2


class LostAnswers(httpx.AsyncBaseTransport):
    """In front of the real server: the first ``lose`` requests reach it, but their answers
    are replaced by a 503 with ``Retry-After`` (an answer lost after the write was done)."""

    def __init__(self, lose: int, retry_after: str | None) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.lose = lose
        self.retry_after = retry_after
        self.sent: list[tuple[float, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append((time.monotonic(), request.headers.get("idempotency-key")))
        response = await self.real.handle_async_request(request)
        if len(self.sent) > self.lose:
            return response
        await response.aread()
        headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
        body = b'{"status":"error","error_code":"actor_timeout","message":"injected"}'
        return httpx.Response(503, headers={**headers, "Content-Type": "application/json"}, content=body)

    async def aclose(self) -> None:
        await self.real.aclose()


def test_a_503_is_retried_after_retry_after_and_the_write_is_stored_once(tmp_path):
    transport = LostAnswers(lose=2, retry_after="1")

    async def run(url: str) -> None:
        async with AsyncNekomemClient(url, transport=transport, retries=2) as client:
            assert (await client.cache("Lan", TURNS)).status == "cached"

    with LiveServer(make_settings(tmp_path)) as srv:
        asyncio.run(run(srv.url))
        assert srv.get("/api/characters/Lan/recent").json()["total"] == 2  # three deliveries, stored once
    (t0, k0), (t1, k1), (t2, k2) = transport.sent
    assert k0 is not None and k0 == k1 == k2
    assert t1 - t0 >= 1.0 and t2 - t1 >= 1.0  # the client waited what Retry-After asked


def test_retries_are_bounded_and_a_long_retry_after_is_not_waited(tmp_path):
    async def attempt(url: str, transport: LostAnswers, **kwargs: float) -> NekomemError:
        async with AsyncNekomemClient(url, transport=transport, **kwargs) as client:
            with pytest.raises(NekomemError) as failed:
                await client.health()
            return failed.value

    with LiveServer(make_settings(tmp_path)) as srv:
        exhausted = LostAnswers(lose=10, retry_after="0")
        error = asyncio.run(attempt(srv.url, exhausted, retries=3))
        assert (error.status, error.error_code, len(exhausted.sent)) == (503, "actor_timeout", 4)
        too_long = LostAnswers(lose=10, retry_after="3600")
        error = asyncio.run(attempt(srv.url, too_long, max_retry_wait=30))
        assert error.status == 503 and len(too_long.sent) == 1
        no_header = LostAnswers(lose=1, retry_after=None)  # a short backoff instead
        asyncio.run(attempt_ok(srv.url, no_header))
        assert len(no_header.sent) == 2


async def attempt_ok(url: str, transport: LostAnswers) -> None:
    async with AsyncNekomemClient(url, transport=transport) as client:
        assert (await client.health()).status


def test_retry_after_forms():
    now = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    assert retry_after_seconds("10") == 10.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_importing_the_client_loads_no_server_layer():
    code = (
        "import sys, nekomem.client\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn', 'pykka')"
        " or m.startswith(('nekomem.actors', 'nekomem.runtime', 'nekomem.stores', 'nekomem.domain')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
