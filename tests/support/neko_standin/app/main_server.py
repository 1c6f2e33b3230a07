"""The stand-in's main server: what the reference's main server does to its memory server
at start (``/internal/storage/startup/continue``, then a conversation turn) and while it
shuts down (one more turn: the launcher stops main before memory). With
``STANDIN_STORAGE_RESTART`` set it asks, once, for a storage-location restart: it marks the
request and exits, as the reference's main server does after a storage change."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse

from app._http import log_event, make_server, post_json

SERVICE = "main"


def _turn(text: str) -> dict:
    return {"input_history": [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]}


def started(memory_port: int, request_exit: threading.Event) -> None:
    """After the server listens: the start-up calls to the memory server."""
    name = os.environ.get("STANDIN_CHARACTER", "Lan")
    deadline = time.monotonic() + 60  # the reference's chat server gives the call 60 s
    status, body = post_json(memory_port, "/internal/storage/startup/continue", {"reason": "main_server_ready"})
    while status == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = post_json(memory_port, "/internal/storage/startup/continue", {"reason": "main_server_ready"})
    log_event("continue", status=status, body=body)
    text = os.environ.get("STANDIN_TURN", "the kettle is on the left shelf")
    status, body = post_json(memory_port, f"/cache/{urllib.parse.quote(name, safe='')}", _turn(text))
    log_event("turn", status=status, body=body, memory_port=memory_port)
    marker = os.environ.get("STANDIN_STORAGE_RESTART")
    if marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as out:
            json.dump({"last_migration_result": "restart_pending:standin"}, out)
        log_event("storage_restart_requested")
        request_exit.set()


def stopping(memory_port: int) -> None:
    """The main server's shutdown: the memory server must still answer."""
    name = os.environ.get("STANDIN_CHARACTER", "Lan")
    status, body = post_json(memory_port, f"/cache/{urllib.parse.quote(name, safe='')}", _turn("said during shutdown"))
    log_event("shutdown_turn", status=status, body=body)


def build(port: int):
    return make_server(SERVICE, port)
