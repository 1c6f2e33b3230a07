"""The streamable-HTTP MCP server behind ``/mcp`` on the server itself.

``/mcp`` is a route of the main app (:class:`nekomem.mcp.LazyMcpEndpoint`), so the
request guard (Host, Origin, bearer token, Content-Type) and limited mode apply to it as
to every API route. The SDK's own DNS rebinding check is switched off: the guard already
applied the configured policy (``allowed_hosts``, ``allowed_origins``), which the SDK's
fixed loopback list would contradict. The tools reach the server's own routes through an
in-process ASGI transport (the same client as ``nekomem mcp``, so one implementation of
each tool, and every call goes through the routes' validation and errors). Each tool
call names its character.
"""

from __future__ import annotations

import anyio
import httpx
from anyio.abc import TaskStatus
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette

from nekomem.client import AsyncNekomemClient
from nekomem.mcp.tools import build_server

# The in-process requests are addressed to a loopback name, which the guard accepts.
LOOPBACK_URL = "http://127.0.0.1"


class McpMount:
    """The MCP server of ``app`` (any character), its session manager and its client."""

    def __init__(self, app: Starlette, api_token: str) -> None:
        # A failing route answers its 500 JSON (a tool error for the model), not an exception.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=("127.0.0.1", 0))
        self.client = AsyncNekomemClient(LOOPBACK_URL, token=api_token, transport=transport)
        self.server = build_server(self.client)
        # Builds the session manager; the SDK's own Starlette app is not used.
        self.server.streamable_http_app(transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        self.handle = StreamableHTTPASGIApp(self.server.session_manager)

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the session manager until cancelled (the app's shutdown); close the client after."""
        try:
            async with self.server.session_manager.run():
                task_status.started()
                await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await self.client.aclose()
