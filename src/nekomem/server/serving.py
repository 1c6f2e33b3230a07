"""Serving an app with uvicorn, with a way for the app to stop its own server.

``POST /shutdown`` (see :mod:`nekomem.http.startup_gate`) calls
``app.state.request_shutdown``; this module registers it: it sets the server's
``should_exit``, so uvicorn stops accepting, finishes the requests in flight and runs the
lifespan's shutdown, which stops every character (their actors flush first).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from nekomem.config import Settings
from nekomem.config.server import url_of
from nekomem.http.connections import uvicorn_options
from nekomem.http.guard import bind_refusal
from nekomem.http.runtime_access import app_runtime
from nekomem.stores import rootlock
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


class StartupRefused(Exception):
    """The server cannot start: its memory root is held, or its port cannot be bound. The
    message names the holder and what to do."""


def claim(app: Starlette, settings: Settings) -> socket.socket:
    """Before anything is promised: take the memory root's lock for ``app``'s runtime
    (kept until the runtime stops), then bind the port. Returns the bound socket, which
    :func:`serve` then listens on.

    Raises StartupRefused (the root's lock released again) when another server or tool
    holds the root, or the port is in use or cannot be bound.
    """
    runtime = app_runtime(app)
    try:
        lock = runtime.lock_root()
    except rootlock.RootLocked as exc:
        raise StartupRefused(str(exc)) from None
    except OSError as exc:
        raise StartupRefused(f"the memory root {settings.server.memory_root} cannot be locked: {exc}") from None
    host, port = settings.server.host, settings.server.port
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        runtime.release_root()
        raise StartupRefused(port_refusal(host, port, exc, settings.server.health_probe_seconds)) from None
    bound = int(sock.getsockname()[1])
    if bound != port:  # port 0: the system chose one
        lock.describe(bound, url_of(host, bound))
    return sock


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening); raises OSError.

    As uvicorn does, SO_REUSEADDR on POSIX (a restart may bind while the old connections
    sit in TIME_WAIT); on Windows that option would let a second server bind a port in
    use, so the port is taken with SO_EXCLUSIVEADDRUSE instead.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    try:
        if sys.platform == "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    return sock


def port_refusal(host: str, port: int, exc: OSError, probe_seconds: float) -> str:
    """What to tell the user when ``host:port`` cannot be bound: who holds it (a nekomem
    server's pid and memory root from its /health, when it shows them) and what to do."""
    in_use = exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", errno.EADDRINUSE))
    if not in_use and isinstance(exc, PermissionError):
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need privileges); choose another with --port"
    if not in_use:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another address with --host or --port"
    url = url_of(host, port)
    holder = describe_port_holder(url, probe_seconds)
    return f"port {port} on {host} is already in use by {holder}; start this server on another port (--port N, setting port), or check the running one: nekomem status --url {url}"


def describe_port_holder(url: str, timeout: float) -> str:
    """Who answers ``GET url/health`` within ``timeout`` seconds, in a few words."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as answer:
            body = json.loads(answer.read(1 << 20))
    except urllib.error.HTTPError as exc:
        return f"another program (its /health answered {exc.code})"
    except ValueError:
        return "another program (its /health is not nekomem's)"
    except OSError:
        return f"a program that did not answer GET /health within {timeout:g} s (a nekomem server still starting, or another program)"
    if not isinstance(body, dict):
        return "another program"
    if body.get("server") == "nekomem":
        details = [f"version {body.get('version', '?')}"]
        if body.get("pid") is not None:
            details.append(f"pid {body['pid']}")
        if body.get("memory_root"):
            details.append(f"memory root {body['memory_root']}")
        else:
            details.append("memory root withheld without its api_token")
        return f"a nekomem server ({', '.join(details)})"
    if body.get("app") == "N.E.K.O":
        return "a N.E.K.O. memory server"
    return "another program"


def serve(
    app: Starlette, settings: Settings, sock: socket.socket | None = None, prepare: Callable[[uvicorn.Server], None] | None = None
) -> None:
    """Run ``app`` until it is stopped (a signal, or /shutdown when enabled), listening on
    ``sock`` when given (from :func:`claim`), else on the configured host and port.

    ``prepare`` sees the server before it starts (to replace its signal handlers, say).
    """
    server = build_server(app, settings)
    if prepare is not None:
        prepare(server)
    server.run(sockets=[sock] if sock is not None else None)


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
