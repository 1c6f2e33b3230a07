"""``nekomem mcp --character NAME [--url URL]``: the MCP tools over stdio for one character,
talking to a running nekomem over HTTP (token from ``NEKOMEM_API_TOKEN``)."""

from __future__ import annotations

import anyio

from nekomem.client import AsyncNekomemClient
from nekomem.mcp.tools import build_server


async def serve_stdio(character: str, url: str, token: str | None = None) -> None:
    """Serve the MCP session on stdin/stdout until the host closes it."""
    async with AsyncNekomemClient(url, token=token) as client:
        await build_server(client, character).run_stdio_async()


def run(character: str, url: str, token: str | None = None) -> int:
    """Blocking entry point of the ``mcp`` command; returns the exit status."""
    anyio.run(serve_stdio, character, url, token)
    return 0
