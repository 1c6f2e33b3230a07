"""The streamable-HTTP MCP endpoint at ``/mcp`` on the server itself.

It is a route of the main app, so the request guard (Host, Origin, bearer token,
Content-Type) and limited mode apply to it as to every API route. The SDK's own DNS
rebinding check is switched off: the guard already applied the configured policy
(``allowed_hosts``, ``allowed_origins``), which the SDK's fixed loopback list would
contradict. The tools reach the server's own routes through an in-process ASGI transport
(the same client as ``nekomem mcp``, so one implementation of each tool, and every call
goes through the routes' validation and errors). Each tool call names its character.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route

from nekomem.client import AsyncNekomemClient
from nekomem.mcp.tools import build_server

MCP_PATH = "/mcp"
# The in-process requests are addressed to a loopback name, which the guard accepts.
LOOPBACK_URL = "http://127.0.0.1"


class McpMount:
    """The ``/mcp`` route of ``app`` and the lifespan its session manager needs."""

    def __init__(self, app: Starlette, api_token: str) -> None:
        # A failing route answers its 500 JSON (a tool error for the model), not an exception.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, client=("127.0.0.1", 0))
        self.client = AsyncNekomemClient(LOOPBACK_URL, token=api_token, transport=transport)
        self.server = build_server(self.client)
        # Builds the session manager; the SDK's own Starlette app is not used.
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.route = Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(self.server.session_manager), methods=["GET", "POST", "DELETE"])

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the session manager (inside the app's lifespan); close the client after."""
        try:
            async with self.server.session_manager.run():
                yield
        finally:
            await self.client.aclose()


def mount_mcp(app: Starlette, api_token: str) -> McpMount:
    """Add the ``/mcp`` route to ``app``; the caller runs :meth:`McpMount.running` in the
    app's lifespan."""
    mount = McpMount(app, api_token)
    app.router.routes.append(mount.route)
    return mount
