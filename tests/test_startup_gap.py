"""The start-up gap on a real server: while the routes answer 409 storage_startup_blocked,
/health says ``starting`` (and ``nekomem status`` exits 3), and a client call made then
waits the gap out and succeeds once the gate opens."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest

from nekomem.client import AsyncNekomemClient, NekomemClient, NekomemError
from tests.support.live import ROOT, LiveServer, make_settings

TURNS = [{"role": "user", "content": "I planted tulips"}, {"role": "assistant", "content": "Lovely"}]


def _status(url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "nekomem", "status", "--url", url], env=env, capture_output=True, text=True, timeout=60)


def test_health_says_starting_while_routes_refuse(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        # The state start-up recovery holds until it ends (runtime_initializing).
        srv.runtime.limited_reason = "runtime_initializing"
        try:
            refused = srv.get("/new_dialog/Lan")
            assert refused.status_code == 409 and refused.json()["error_code"] == "storage_startup_blocked"
            assert refused.headers["retry-after"] == "1"  # limited_retry_after_seconds, not the disk's 10
            health = srv.get("/health")
            assert health.status_code == 200
            body = health.json()
            assert (body["status"], body["overall"], body["blocking_reason"]) == ("starting", "starting", "runtime_initializing")
            assert body["app"] == "N.E.K.O" and body["service"] == "memory"  # the launcher's fingerprint is kept
            status = _status(srv.url)
            assert status.returncode == 3 and "starting (runtime_initializing)" in status.stdout
        finally:
            srv.runtime.limited_reason = None
        assert srv.get("/health").json()["status"] == "ok"
        assert srv.get("/new_dialog/Lan").status_code == 200
        assert _status(srv.url).returncode == 0


class _Watching(httpx.AsyncHTTPTransport):
    """The real network transport; sets ``refused`` once a 409 has come back."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = threading.Event()
        self.statuses: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.statuses.append(response.status_code)
        if response.status_code == 409:
            self.refused.set()
        return response


def test_a_client_call_made_while_blocked_succeeds_once_the_gate_opens(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        assert srv.post("/internal/storage/startup/block", json={"reason": "main_server_init"}).json()["limited_mode"] is True
        assert srv.get("/health").json()["status"] == "starting"
        transport = _Watching()
        outcome: dict[str, Any] = {}

        async def call() -> None:
            async with AsyncNekomemClient(srv.url, token="", transport=transport) as client:
                outcome["written"] = await client.cache("Lan", TURNS)
                outcome["dialog"] = await client.new_dialog("Lan")

        worker = threading.Thread(target=lambda: asyncio.run(call()), daemon=True)
        worker.start()
        assert transport.refused.wait(30), "the client's first call never reached the blocked server"
        assert "written" not in outcome  # refused, not stored: the call is still waiting
        assert srv.post("/internal/storage/startup/continue").json()["ok"] is True
        worker.join(60)
        assert not worker.is_alive()
        assert outcome["written"].count == 2 and "tulips" in outcome["dialog"]
        assert transport.statuses[0] == 409 and transport.statuses[-2:] == [200, 200]
        # Stored once, whatever the number of attempts.
        assert srv.get("/get_recent_history/Lan").text.count("I planted tulips") == 1


def test_the_client_gives_up_when_waiting_cannot_help(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        srv.runtime.limited_reason = "storage_recovery_failed"  # an operator has to act: no wait
        try:
            with NekomemClient(srv.url, token="") as client, pytest.raises(NekomemError) as failed:
                client.new_dialog("Lan")
            assert failed.value.status == 409 and failed.value.body["blocking_reason"] == "storage_recovery_failed"
        finally:
            srv.runtime.limited_reason = None
        srv.post("/internal/storage/startup/block")
        with NekomemClient(srv.url, token="", max_startup_wait=0) as client, pytest.raises(NekomemError) as spent:
            client.new_dialog("Lan")  # no budget: the first 409 is raised
        assert spent.value.error_code == "storage_startup_blocked"
