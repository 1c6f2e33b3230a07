"""The reference memory server's process-control routes, called by its chat server.

- ``POST /internal/storage/startup/continue`` (optional ``{"reason": str}``): leave limited
  mode. Waits (up to ``startup_continue_wait_seconds``) for start-up recovery, clears a
  /block, and answers ``{"ok": true, "initialized": bool}``: ``initialized`` is true when
  this call saw recovery still running and waited for it (the reference: when this call
  ran the initialisation). While the storage cannot serve (recovery failed, or did not
  finish in time) it answers 409 ``{"ok": false, "error_code": "storage_startup_blocked",
  "blocking_reason": ...}``; the chat server then reports that the memory server is still
  blocked.
  A /block that arrives while a /continue waits wins: that /continue answers 409 (the
  newest reference counts block generations for the same reason).
- ``POST /internal/storage/startup/block`` (optional ``{"reason": str}``; the newest
  reference's ``recovery_mode`` is accepted and not used): the chat server could not
  finish its own start-up; every route but the allow-list answers 409 again
  (``blocking_reason`` ``storage_startup_blocked_after_init``) until /continue.
  ``{"ok": true, "limited_mode": true, "reason": str}``.
- ``POST /internal/storage/startup/activate`` (the newest reference's second step, sent
  after its own initialisation): ``{"ok": true}``, or the 409 above while blocked.
  nekomem has nothing to start there (its background work is not gated on the chat
  server), and /continue already left limited mode, as older chat servers, which never
  send /activate, need.
- ``POST /shutdown``: with ``shutdown_enabled`` (the reference's ``--enable-shutdown``) the
  server stops gracefully after answering ``{"status": "shutdown_signal_received"}``: the
  lifespan stops every character, whose actors flush their views and outbox first. Without
  it: ``{"status": "shutdown_disabled", "message": ...}``, as the reference run under its
  launcher (which stops the process itself).

All four stay reachable in limited mode, as in the reference.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.http.bodies import decode_json, read_body
from nekomem.http.errors import error_response
from nekomem.http.operations import Operation
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import StartupGateBody

log = logging.getLogger("nekomem.http.startup")


async def _reason(request: Request) -> str:
    """The optional body's ``reason``: an absent body, ``null`` or a null reason is ""."""
    raw = await read_body(request)
    if not raw.strip() or raw.strip() == b"null":
        return ""
    body = decode_json(raw, StartupGateBody, runtime_of(request).settings.server.body_max_depth)
    return (body.reason or "").strip()


def _blocked(reason: str) -> JSONResponse:
    message = "the memory storage cannot serve yet; limited mode stays on"
    return error_response(409, "storage_startup_blocked", message, ok=False, blocking_reason=reason, error=message)


async def continue_startup(request: Request) -> Response:
    rt = runtime_of(request)
    reason = await _reason(request)
    generation = rt.startup_generation
    waited = rt.limited_reason == "runtime_initializing"
    if waited:
        await asyncio.to_thread(rt.wait_ready, rt.settings.server.startup_continue_wait_seconds)
    if rt.limited_reason is not None:
        log.warning("startup continue refused: %s", rt.limited_reason)
        return _blocked(rt.limited_reason)
    if rt.startup_generation != generation:
        # A /block arrived while this call waited: a late continue never lifts a newer block.
        return _blocked("storage_startup_blocked_after_init")
    rt.startup_block = None
    log.info("startup continue (reason %s)", reason or "-")
    return JSONResponse({"ok": True, "initialized": waited})


async def activate_startup(request: Request) -> Response:
    rt = runtime_of(request)
    await _reason(request)
    blocking = rt.blocking_reason()
    if blocking is not None:
        return _blocked(blocking)
    return JSONResponse({"ok": True})


async def block_startup(request: Request) -> Response:
    rt = runtime_of(request)
    reason = await _reason(request)
    rt.startup_generation += 1
    rt.startup_block = reason
    log.warning("limited mode restored by the chat server (reason %s)", reason or "-")
    return JSONResponse({"ok": True, "limited_mode": True, "reason": reason})


async def shutdown(request: Request) -> Response:
    rt = runtime_of(request)
    if not rt.settings.server.shutdown_enabled:
        log.warning("shutdown requested but not enabled (shutdown_enabled)")
        return JSONResponse({"status": "shutdown_disabled", "message": "this server does not stop on request (shutdown_enabled is off)"})
    stop: Callable[[], None] | None = getattr(request.app.state, "request_shutdown", None)
    if stop is None:
        return JSONResponse({"status": "error", "message": "the process hosting this app registered no way to stop it"})
    log.info("shutdown requested over HTTP")
    stop()  # the server finishes this answer, then stops gracefully
    return JSONResponse({"status": "shutdown_signal_received"})


def operations() -> list[Operation]:
    gate = StartupGateBody
    return [
        Operation("/internal/storage/startup/continue", "POST", continue_startup, "Leave limited mode (body optional)", body=gate),
        Operation("/internal/storage/startup/block", "POST", block_startup, "Enter limited mode again (body optional)", body=gate),
        Operation(
            "/internal/storage/startup/activate",
            "POST",
            activate_startup,
            "Second start-up step of the newest reference",
            body=gate,
        ),
        Operation("/shutdown", "POST", shutdown, "Stop the server gracefully (when shutdown_enabled)"),
    ]
