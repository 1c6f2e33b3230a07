"""Plays the reference N.E.K.O. launcher and main server against the memory server already
on the memory port, in the order their code runs (``launcher.py``, ``utils/port_utils.py``,
``app/main_server.py``); started by ``nekomem neko -- python <this file> NAME TEXT``.

1. The launcher takes ``NEKO_INSTANCE_ID`` from its parent (``os.environ.get(...) or
   uuid4().hex``) and the memory port from ``NEKO_MEMORY_SERVER_PORT``.
2. Port strategy: the memory port cannot be bound (``SO_REUSEADDR`` as the reference sets
   it), so it is probed with a raw-socket ``GET /health`` (``Connection: close``, read to
   EOF, body after the blank line); ``app == "N.E.K.O"`` classifies it as an existing
   N.E.K.O. service and the launcher does not start its own memory server.
3. The main server's start-up posts ``/internal/storage/startup/continue`` with
   ``{"reason": ...}`` and requires HTTP 200 and ``ok is True``; the newest one then posts
   ``/internal/storage/startup/activate`` after its own initialisation.
4. Traffic: ``/cache`` with the double-encoded ``input_history`` string the reference's
   cross_server sends, then ``/new_dialog``.
5. The main server's shutdown posts ``/shutdown``; the launcher's monitor loop then sees
   the reused memory server unreachable and exits.

Exits 0 when every step behaved as the reference's code requires, else 1 with the reason
on stderr.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def fail(message: str) -> None:
    print(f"replay: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def bindable(port: int) -> bool:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def probe_health(port: int) -> dict | None:
    """The reference's probe_neko_health: the payload when it carries the N.E.K.O signature."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
        raw = b"".join(chunks).decode("utf-8", errors="replace")
        if "\r\n\r\n" not in raw:
            return None
        body = raw.split("\r\n\r\n", 1)[1].strip()
        payload = json.loads(body)
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) and payload.get("app") == "N.E.K.O" else None


def post(port: int, path: str, body: dict | None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if path.startswith("/internal/storage/"):
        # The newest main server authenticates its control calls to its own servers.
        request.add_header("X-Neko-Internal-Control-Token", "t" * 43)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def main() -> None:
    name, text = sys.argv[1], sys.argv[2]
    instance_id = os.environ.get("NEKO_INSTANCE_ID") or fail("no NEKO_INSTANCE_ID from the parent")
    port = int(os.environ.get("NEKO_MEMORY_SERVER_PORT") or fail("no NEKO_MEMORY_SERVER_PORT"))
    if os.environ.get("NEKO_MERGED") != "0":
        fail("NEKO_MERGED is not 0: a packaged launcher would start its own memory app in process")
    if bindable(port):
        fail("the memory port is free: the launcher would start its own memory server")
    health = probe_health(port)
    if health is None:
        fail("the probe did not recognise a N.E.K.O. service: the launcher would move every port")
    if health.get("service") != "memory" or health.get("instance_id") != instance_id:
        fail(f"health names another service or instance: {health}")
    status, payload = post(port, "/internal/storage/startup/continue", {"reason": "storage_selection_continue_current_session"})
    if status != 200 or payload.get("ok") is not True:
        fail(f"continue-startup answered {status} {payload}: main_server cannot leave limited mode")
    # The newest main server activates the memory server after its own initialisation.
    status, payload = post(port, "/internal/storage/startup/activate", {"reason": "storage_selection_continue_current_session"})
    if status != 200 or payload.get("ok") is not True:
        fail(f"activate-startup answered {status} {payload}")
    quoted = urllib.parse.quote(name, safe="")
    history = json.dumps([{"role": "user", "content": text}, {"role": "assistant", "content": "noted"}], ensure_ascii=False)
    status, payload = post(port, f"/cache/{quoted}", {"input_history": history})
    if status != 200 or payload != {"status": "cached", "count": 2}:
        fail(f"/cache answered {status} {payload}")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/new_dialog/{quoted}", timeout=30) as response:
        if text not in response.read().decode("utf-8"):
            fail("/new_dialog does not hold the cached turn")
    status, payload = post(port, "/shutdown", None)
    if status != 200 or payload.get("status") != "shutdown_signal_received":
        fail(f"/shutdown answered {status} {payload}")
    # The launcher's monitor loop: a reused server that stops answering ends the launch.
    deadline = time.monotonic() + 60
    while probe_health(port) is not None:
        if time.monotonic() > deadline:
            fail("the memory server still answers a minute after /shutdown")
        time.sleep(0.1)
    print("replay: ok", flush=True)


if __name__ == "__main__":
    main()
