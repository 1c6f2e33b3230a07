"""The stand-in's own memory server: what nekomem replaces. Starting it is logged, so a
test sees at once that nekomem was bypassed."""

from __future__ import annotations

from app._http import log_event, make_server

SERVICE = "memory"


def build(port: int):
    log_event("own_memory_server_started", port=port)
    return make_server(SERVICE, port, lambda path, body: {"ok": True, "path": path})
