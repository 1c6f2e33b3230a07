"""A stand-in for N.E.K.O.'s chat-server side of public knowledge
(``main_logic/public_knowledge.py`` at 2a06e27a3c1c67a67f9fdbbab44c513802c04c0f), written
from its behaviour: a cached ``tool_available`` flag refreshed from
``GET /internal/knowledge/availability`` (1 s timeout; every ``ttl`` seconds once the
server said ``ready``, every ``retry`` seconds otherwise: the reference's 60 s and 15 s),
also taken from every knowledge answer; a tool registry that holds
``query_public_knowledge`` only while the flag is true; and the tool call itself (the
cleaned arguments, ``budget_ms`` 2000, ``language``, a 3 s timeout; ``context`` on
``matched``, "no result" on anything else)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

TOOL_NAME = "query_public_knowledge"
QUERY_TIMEOUT_SECONDS = 3.0
QUERY_BUDGET_MS = 2_000
MAX_QUERY_CHARS = 500
MAX_TOOL_LIMIT = 3
AVAILABILITY_TIMEOUT_SECONDS = 1.0
NO_RESULT = "No relevant material in the local public knowledge base."


class MainServerStandIn:
    def __init__(self, base_url: str, *, ttl: float = 60.0, retry: float = 15.0) -> None:
        self.base_url = base_url
        self.ttl = ttl
        self.retry = retry
        self.tool_available = False
        self.tools: dict[str, dict[str, Any]] = {}
        self.changes: list[bool] = []  # every flip of the flag, in order
        self.polls = 0
        self._task: asyncio.Task[None] | None = None
        self._http = httpx.AsyncClient(base_url=base_url)

    # -- the flag and the registry ------------------------------------------------------

    def note_availability(self, payload: object) -> None:
        if not isinstance(payload, dict) or not isinstance(payload.get("tool_available"), bool):
            return
        value = payload["tool_available"]
        if value == self.tool_available:
            return
        self.tool_available = value
        self.changes.append(value)
        # What a session manager's listener does: re-register the builtin tools.
        if value:
            self.tools[TOOL_NAME] = {"name": TOOL_NAME, "parameters": ["query", "mode", "material_type"]}
        else:
            self.tools.pop(TOOL_NAME, None)

    async def _refresh(self) -> float:
        delay = self.retry
        try:
            response = await self._http.get("/internal/knowledge/availability", timeout=AVAILABILITY_TIMEOUT_SECONDS)
            if response.is_success:
                payload = response.json()
                self.note_availability(payload)
                if isinstance(payload, dict) and payload.get("ready") is True:
                    delay = self.ttl
        except httpx.HTTPError:
            pass
        self.polls += 1
        return delay

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(await self._refresh())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self._http.aclose()

    # -- the tool -----------------------------------------------------------------------

    async def call_tool(self, arguments: dict[str, Any], language: str | None) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return NO_RESULT
        mode = arguments.get("mode") if arguments.get("mode") in ("lookup", "sample") else "lookup"
        material_type = arguments.get("material_type")
        if material_type not in ("auto", "knowledge", "corpus"):
            material_type = "auto"
        limit = arguments.get("limit")
        if not isinstance(limit, int) or isinstance(limit, bool):
            limit = MAX_TOOL_LIMIT
        body = {
            "query": query.strip()[:MAX_QUERY_CHARS],
            "mode": mode,
            "material_type": material_type,
            "limit": min(max(limit, 1), MAX_TOOL_LIMIT),
            "budget_ms": QUERY_BUDGET_MS,
            "language": language,
        }
        payload: dict[str, Any] = {}
        try:
            response = await self._http.post("/internal/knowledge/query", json=body, timeout=QUERY_TIMEOUT_SECONDS)
            if response.is_success:
                decoded = response.json()
                payload = decoded if isinstance(decoded, dict) else {}
                self.note_availability(payload)
        except httpx.HTTPError:
            pass
        context = payload.get("context")
        if payload.get("result") == "matched" and isinstance(context, str) and context.strip():
            return context
        return NO_RESULT
