"""The MCP server through the SDK's own client: over stdio (``python -m nekomem mcp``
spawned against a real server) and over streamable HTTP at ``/mcp`` on the real server,
with its guard (Host, Origin, token)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.live import ROOT, LiveServer, make_settings

TOKEN = "mcp-test-token"
CAT_FACT = "Master is allergic to cats"


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "text", None) is not None)


@asynccontextmanager
async def http_session(url: str, token: str = TOKEN) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
            yield client


async def remember_and_recall(client: Client, **character: str) -> None:
    """The session the issue asks for: remember a fact (dedup applies), recall it, see it
    in the context and the resources."""
    names = {tool.name for tool in (await client.list_tools()).tools}
    assert names == {"recall_memory", "remember", "get_context", "confirm_memory", "deny_memory"}
    first = await client.call_tool("remember", {**character, "text": CAT_FACT, "importance": 8})
    assert not first.is_error and "Remembered (fact id fact_" in text_of(first)
    again = await client.call_tool("remember", {**character, "text": CAT_FACT})
    assert not again.is_error and "Already known" in text_of(again)
    recalled = await client.call_tool("recall_memory", {**character, "query": "allergic cats"})
    assert not recalled.is_error and CAT_FACT in text_of(recalled)
    nothing = await client.call_tool("recall_memory", {**character, "query": "bicycle"})
    assert CAT_FACT not in text_of(nothing)
    empty = await client.call_tool("remember", {**character, "text": "   "})
    assert empty.is_error and "422" in text_of(empty)


def test_http_mount_remembers_recalls_and_takes_feedback(tmp_path, fake_llm):
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master avoids pets",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    settings = make_settings(tmp_path, api_token=TOKEN, llm_base_url=fake_llm.base_url, llm_model="fake")
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def session(url: str) -> None:
        async with http_session(url) as client:
            await remember_and_recall(client, character="Lan")
            facts = [{"text": f"Master sneezed near a cat at the {p}", "importance": 7} for p in ("park", "cafe", "station", "shop", "zoo")]
            httpx.post(f"{url}/api/characters/Lan/facts", json={"facts": facts}, headers=auth, timeout=60)
            reflection_id = httpx.post(f"{url}/reflect/Lan", headers=auth, timeout=60).json()["reflection"]["id"]
            recalled = text_of(await client.call_tool("recall_memory", {"character": "Lan", "query": "Master avoids pets"}))
            assert f"- {reflection_id}: Master avoids pets" in recalled
            confirmed = await client.call_tool("confirm_memory", {"character": "Lan", "reflection_id": reflection_id})
            assert not confirmed.is_error and f"Reflection {reflection_id} confirmed" in text_of(confirmed)
            unknown = await client.call_tool("deny_memory", {"character": "Lan", "reflection_id": "ref_unknown"})
            assert unknown.is_error and "404" in text_of(unknown)
            assert "Master avoids pets" in text_of(await client.call_tool("get_context", {"character": "Lan"}))

            httpx.post(f"{url}/cache/Lan", json={"input_history": [{"role": "user", "content": "the kettle whistles"}]}, headers=auth)
            httpx.post(f"{url}/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan loves tuna"}]}, headers=auth)
            persona = await client.read_resource("nekomem://characters/Lan/persona")
            assert "[neko] Lan loves tuna" in persona.contents[0].text
            recent = await client.read_resource("nekomem://characters/Lan/recent")
            assert "the kettle whistles" in recent.contents[0].text
            bad_name = await client.call_tool("get_context", {"character": "x" * 60})
            assert bad_name.is_error and "400" in text_of(bad_name)

    with LiveServer(settings) as srv:
        asyncio.run(session(srv.url))
        # The fact went through the import path: stored once, in the journal.
        facts = srv.get("/api/characters/Lan/facts", headers=auth, params={"limit": 100}).json()["items"]
        assert [f["text"] for f in facts].count(CAT_FACT) == 1
        feedback = srv.get("/api/characters/Lan/reflections", headers=auth).json()["items"][0]
        assert feedback["status"] == "confirmed"


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_http_mount_is_behind_the_guard(tmp_path):
    with LiveServer(make_settings(tmp_path, api_token=TOKEN)) as srv:
        good = {**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"}
        assert srv.post("/mcp", json=INITIALIZE, headers=good).status_code == 200
        refused = [
            (srv.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS), 401, "unauthorized"),
            (srv.post("/mcp", json=INITIALIZE, headers={**good, "Authorization": "Bearer nope"}), 401, "unauthorized"),
            (srv.post("/mcp", json=INITIALIZE, headers={**good, "Origin": "https://evil.example"}), 403, "origin_not_allowed"),
            (srv.post("/mcp", json=INITIALIZE, headers={**good, "Host": "evil.example"}), 403, "host_not_allowed"),
            (srv.get("/mcp", headers={"Accept": "text/event-stream"}), 401, "unauthorized"),
        ]
        for response, status, code in refused:
            assert (response.status_code, response.json()["error_code"]) == (status, code)

    async def wrong_token(url: str) -> None:
        with pytest.raises(Exception):  # noqa: B017 - the SDK wraps the 401 in its own error types
            async with http_session(url, token="wrong") as client:
                await client.list_tools()

    with LiveServer(make_settings(tmp_path, api_token=TOKEN)) as srv:
        asyncio.run(wrong_token(srv.url))


def test_http_mount_can_be_switched_off(tmp_path):
    with LiveServer(make_settings(tmp_path, mcp_enabled=False)) as srv:
        response = srv.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert (response.status_code, response.json()["error_code"]) == (404, "not_found")


def test_stdio_server_remembers_and_recalls(tmp_path):
    async def session(url: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
        env.update(NEKOMEM_API_TOKEN=TOKEN, PYTHONPATH=str(ROOT / "src"))
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "nekomem", "mcp", "--character", "Mei Ling", "--url", url], env=env, cwd=str(ROOT)
        )
        async with Client(params) as client:
            await remember_and_recall(client)
            resources = {str(r.uri) for r in (await client.list_resources()).resources}
            assert resources == {"nekomem://characters/Mei%20Ling/persona", "nekomem://characters/Mei%20Ling/recent"}
            recent = await client.read_resource("nekomem://characters/Mei%20Ling/recent")
            assert "the kettle whistles" in recent.contents[0].text
            assert "the kettle whistles" in text_of(await client.call_tool("get_context", {}))

    with LiveServer(make_settings(tmp_path, api_token=TOKEN)) as srv:
        turn = {"input_history": [{"role": "user", "content": "the kettle whistles"}]}
        assert srv.post("/cache/Mei Ling", json=turn, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        asyncio.run(session(srv.url))
        items = srv.get("/api/characters/Mei Ling/facts", headers={"Authorization": f"Bearer {TOKEN}"}).json()["items"]
        assert [f["text"] for f in items] == [CAT_FACT]


def test_without_the_extra_the_server_starts_without_mcp(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['mcp'] = None  # as if the optional package were not installed\n"
        "from nekomem.server.app import create_app\n"
        "from tests.support.live import make_settings\n"
        f"app = create_app(make_settings({str(tmp_path)!r}))\n"
        "print(sorted(r.path for r in app.routes if r.path.startswith('/mcp')), app.state.runtime is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True"


def test_the_sdk_is_not_imported_until_mcp_is_used(tmp_path):
    """Importing the SDK takes seconds: a server start without MCP traffic never pays it."""
    code = (
        "import sys\n"
        "from nekomem.server.app import create_app\n"
        "from tests.support.live import make_settings\n"
        f"app = create_app(make_settings({str(tmp_path)!r}))\n"
        "print([r.path for r in app.routes if r.path == '/mcp'], 'mcp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['/mcp'] False"
