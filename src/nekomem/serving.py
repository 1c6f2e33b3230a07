"""Serving an app with uvicorn, with a way for the app to stop its own server.

``POST /shutdown`` (see :mod:`nekomem.http.startup_gate`) calls
``app.state.request_shutdown``; this module registers it: it sets the server's
``should_exit``, so uvicorn stops accepting, finishes the requests in flight and runs the
lifespan's shutdown, which stops every character (their actors flush first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from nekomem.config import Settings
from nekomem.http.connections import uvicorn_options
from nekomem.http.guard import bind_refusal
from nekomem.stores.layout import list_characters


def build_server(app: Starlette, settings: Settings) -> uvicorn.Server:
    """A uvicorn server for ``app`` on the configured host and port, stoppable from the app."""
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level.lower(),
        access_log=False,
        **uvicorn_options(settings.server),
    )
    server = uvicorn.Server(config)

    def request_shutdown() -> None:
        server.should_exit = True

    app.state.request_shutdown = request_shutdown
    return server


def serve(app: Starlette, settings: Settings, prepare: Callable[[uvicorn.Server], None] | None = None) -> None:
    """Run ``app`` until it is stopped (a signal, or /shutdown when enabled).

    ``prepare`` sees the server before it starts (to replace its signal handlers, say).
    """
    server = build_server(app, settings)
    if prepare is not None:
        prepare(server)
    server.run()


def unsharded_refusal(settings: Settings) -> str | None:
    """Cluster mode reads characters only from ``shards/<NNNN>/``: started on a root whose
    characters are still in the single-node layout it would serve none of them (and start
    new, empty ones under the same names). The server refuses to start instead."""
    if not settings.cluster.cluster_etcd_url:
        return None
    root = Path(settings.server.memory_root)
    try:
        left = list_characters(root, max_length=settings.server.name_max_length)
    except OSError:
        return None  # an unreadable root is reported by the start-up that follows
    if not left:
        return None
    return (
        f"cluster mode is on, but the memory root {root} holds {len(left)} character(s) in the single-node layout, "
        "which cluster mode does not read: stop every server on it and run `nekomem cluster shard-root` first"
    )


def startup_refusal(settings: Settings) -> str | None:
    """Why the server must not start with ``settings`` (a bind address off loopback without
    a token; cluster mode on a root that still holds single-node characters), or None; in
    that case the process's logging is configured at the set level."""
    refusal = bind_refusal(settings.server) or unsharded_refusal(settings)
    if refusal is None:
        logging.basicConfig(
            level=getattr(logging, settings.server.log_level.upper(), logging.INFO),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    return refusal
