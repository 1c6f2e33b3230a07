"""nekomem as an MCP server (optional extra ``nekomem[mcp]``, the official ``mcp`` SDK).

:mod:`nekomem.mcp.tools` holds the one implementation of each tool and resource, written
against :class:`nekomem.client.AsyncNekomemClient`; :mod:`nekomem.mcp.stdio` serves them
over stdio for one character (``nekomem mcp --character NAME``), talking to a running
server over HTTP; :mod:`nekomem.mcp.mount` serves them at ``/mcp`` on the server itself
(streamable HTTP), where each call names its character and the client reaches the
server's own routes through an in-process ASGI transport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from nekomem.mcp.mount import McpMount


def mount_if_available(app: Starlette, api_token: str) -> McpMount | None:
    """Mount ``/mcp`` on ``app`` (see :mod:`nekomem.mcp.mount`), or return None when the
    optional ``mcp`` package is not installed."""
    try:
        from nekomem.mcp.mount import mount_mcp
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "pydantic"):
            raise
        return None
    return mount_mcp(app, api_token)
