"""Stand-in of the reference's ``utils/port_utils.py``: the signed ``/health`` answer of a
N.E.K.O. service and the probe that recognises one."""

from __future__ import annotations

import json
import os
import socket
import urllib.error
import urllib.request

HEALTH_APP_SIGNATURE = "N.E.K.O"


def build_health_response(service: str) -> dict:
    return {"app": HEALTH_APP_SIGNATURE, "service": service, "status": "ok", "instance_id": os.environ.get("NEKO_INSTANCE_ID", "")}


def probe_neko_health(port: int, timeout: float = 1.0) -> dict | None:
    """The ``/health`` JSON of a N.E.K.O. service on ``port`` (``app`` is the signature and
    ``status`` ok), else None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    if isinstance(body, dict) and body.get("app") == HEALTH_APP_SIGNATURE and body.get("status") == "ok":
        return body
    return None


def set_port_probe_reuse(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
