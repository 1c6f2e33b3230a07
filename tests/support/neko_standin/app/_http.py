"""A tiny JSON HTTP server for the stand-in's three apps (the reference runs FastAPI apps
on uvicorn; the launcher only sees ports, ``/health`` and its events)."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from utils.port_utils import build_health_response


def log_event(event: str, **fields: object) -> None:
    """One JSON line in the file the test reads (``STANDIN_LOG``)."""
    path = os.environ.get("STANDIN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def post_json(port: int, path: str, body: object, timeout: float = 30.0) -> tuple[int, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def make_server(service: str, port: int, post: Callable[[str, object], object] | None = None) -> ThreadingHTTPServer:
    """A server answering ``GET /health`` as ``service`` and ``POST`` with ``post``."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, body: object, status: int = 200) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(build_health_response(service))
            else:
                self._send({"detail": "not found"}, 404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            self._send(post(self.path, body) if post is not None else {"ok": True})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def run_until(server: ThreadingHTTPServer, stop: threading.Event) -> None:
    """Serve until ``stop`` is set."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    stop.wait()
    server.shutdown()
    server.server_close()
