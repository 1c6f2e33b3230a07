"""nekomem as an MCP server (optional extra ``nekomem[mcp]``, the official ``mcp`` SDK).

:mod:`nekomem.mcp.tools` holds the one implementation of each tool and resource, written
against :class:`nekomem.client.AsyncNekomemClient`; :mod:`nekomem.mcp.stdio` serves them
over stdio for one character (``nekomem mcp --character NAME``), talking to a running
server over HTTP; :mod:`nekomem.mcp.mount` serves them at ``/mcp`` on the server itself
(streamable HTTP), where each call names its character and the client reaches the
server's own routes through an in-process ASGI transport.

This module imports nothing of the SDK: importing it costs seconds (its protocol types
are built at import), so the server mounts a lazy endpoint that loads it on the first
``/mcp`` request, and a server nobody asks for MCP starts as fast as without the extra.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from nekomem.mcp.mount import McpMount

MCP_PATH = "/mcp"


class LazyMcpEndpoint:
    """The ``/mcp`` ASGI endpoint: builds the MCP server (:class:`McpMount`) on its first
    request and starts its session manager in the task group :meth:`running` holds for
    the app's lifespan."""

    def __init__(self, app: Starlette, api_token: str) -> None:
        self.app = app
        self.api_token = api_token
        self._mount: McpMount | None = None
        self._lock = anyio.Lock()
        self._tasks: TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Hold the task group the session manager runs in (enter it in the app's lifespan)."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                tasks.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        mount = await self._started()
        await mount.handle(scope, receive, send)

    async def _started(self) -> McpMount:
        """The started mount. Raises RuntimeError outside the app's lifespan."""
        async with self._lock:
            if self._mount is None:
                if self._tasks is None:
                    raise RuntimeError("the MCP endpoint is served only inside the app's lifespan")
                from nekomem.mcp import mount as mount_module  # off the event loop below

                mount = await anyio.to_thread.run_sync(mount_module.McpMount, self.app, self.api_token)
                await self._tasks.start(mount.serve)
                self._mount = mount
            return self._mount


def mount_if_available(app: Starlette, api_token: str) -> LazyMcpEndpoint | None:
    """Add the ``/mcp`` route to ``app`` and return its endpoint (run
    :meth:`LazyMcpEndpoint.running` in the app's lifespan); None, and no route, when the
    optional ``mcp`` package is not installed."""
    if importlib.util.find_spec("mcp") is None:
        return None
    endpoint = LazyMcpEndpoint(app, api_token)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return endpoint
