"""A watch on the cluster's etcd key space, so a node learns of a change when etcd makes it.

etcd's JSON gateway streams a watch as one long HTTP/1.1 answer (``POST /v3/watch``,
chunked, one JSON message a line). It is read here on a plain socket with a short read
timeout, so the thread notices a stop within a second without closing the stream on an
idle cluster (an httpx read timeout would end the answer). Every change under the prefix
(a member joining, a lease expiring and etcd deleting its keys, a claim, a hand-over) calls
``on_change``; so does every (re)connection, since changes may have been missed while the
stream was down. The node coalesces those calls into one read of the whole key space.

When the stream breaks (etcd restarts, the connection drops, an answer that is not a
watch) the watcher says so (``healthy`` False: the node then reads the key space every
tick, as before the watch) and reconnects after a backoff that doubles from
``backoff_min`` up to ``backoff_max``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from nekomem.cluster.etcd import b64, prefix_end

log = logging.getLogger("nekomem.cluster")

_POLL_STOP_SECONDS = 1.0  # how often a blocked read looks at the stop flag


class WatchBroken(Exception):
    """The watch stream ended or answered something that is not a watch."""


class ChunkedLines:
    """Lines of a chunked HTTP body fed in pieces as they arrive (the chunk framing removed)."""

    def __init__(self) -> None:
        self._raw = b""  # chunked bytes not yet decoded
        self._body = b""  # decoded body not yet split into lines
        self._left = 0  # data bytes left in the current chunk
        self._crlf = False  # the CRLF that ends a chunk's data is due
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        """The complete lines ``data`` finishes. Raises WatchBroken on a framing error."""
        self._raw += data
        while self._raw and not self.ended:
            if self._crlf:
                if len(self._raw) < 2:
                    break
                if self._raw[:2] != b"\r\n":
                    raise WatchBroken("a chunk that does not end with CRLF")
                self._raw, self._crlf = self._raw[2:], False
                continue
            if self._left == 0:
                end = self._raw.find(b"\r\n")
                if end < 0:
                    break
                try:
                    size = int(self._raw[:end].split(b";")[0], 16)
                except ValueError as exc:
                    raise WatchBroken("bad chunk size") from exc
                self._raw = self._raw[end + 2 :]
                if size == 0:
                    self.ended = True
                    break
                self._left = size
                continue
            take = self._raw[: self._left]
            self._raw = self._raw[len(take) :]
            self._left -= len(take)
            self._body += take
            self._crlf = self._left == 0
        lines = self._body.split(b"\n")
        self._body = lines.pop()
        return [line for line in lines if line.strip()]


class KeyWatch:
    """A thread watching every key under ``prefix`` at etcd ``url``."""

    def __init__(
        self,
        url: str,
        prefix: str,
        on_change: Callable[[], None],
        *,
        connect_timeout: float,
        backoff_min: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.netloc = parts.netloc
        self.prefix = prefix
        self.on_change = on_change
        self.connect_timeout = connect_timeout
        self.backoff_min, self.backoff_max = backoff_min, backoff_max
        self.healthy = False
        self.events = 0  # changes reported so far
        self.breaks = 0  # times the stream broke
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nekomem-cluster-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = self.backoff_min
        while not self._stop.is_set():
            try:
                self._watch_once()
            except (OSError, WatchBroken, ValueError) as exc:
                if self._stop.is_set():
                    break
                if self.healthy:
                    log.warning("the etcd watch broke (%s); reading the cluster every tick until it is back", type(exc).__name__)
                self.breaks += 1
            was_healthy, self.healthy = self.healthy, False
            if was_healthy:
                backoff = self.backoff_min  # a stream that worked: retry soon
            self.on_change()  # the node reads the key space by polling meanwhile
            self._stop.wait(backoff)
            backoff = min(self.backoff_max, backoff * 2)

    def _request(self) -> bytes:
        body = json.dumps(
            {"create_request": {"key": b64(self.prefix), "range_end": prefix_end(self.prefix)}},
        ).encode()
        head = (
            f"POST /v3/watch HTTP/1.1\r\nHost: {self.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    def _watch_once(self) -> None:
        """One stream, until it breaks or the watcher stops. Raises OSError / WatchBroken."""
        with socket.create_connection((self.host, self.port), timeout=self.connect_timeout) as sock:
            sock.sendall(self._request())
            sock.settimeout(_POLL_STOP_SECONDS)
            buffer = b""
            lines: ChunkedLines | None = None
            while not self._stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue  # an idle cluster: look at the stop flag, keep the stream
                if not data:
                    raise WatchBroken("etcd closed the watch stream")
                if lines is None:
                    buffer += data
                    end = buffer.find(b"\r\n\r\n")
                    if end < 0:
                        if len(buffer) > 65536:
                            raise WatchBroken("an answer head that does not end")
                        continue
                    head, data = buffer[:end].lower(), buffer[end + 4 :]
                    if not head.startswith(b"http/1.1 200") or b"transfer-encoding: chunked" not in head:
                        raise WatchBroken(f"etcd answered the watch with {head[:40]!r}")
                    lines = ChunkedLines()
                for line in lines.feed(data):
                    self._message(line)
                if lines.ended:
                    raise WatchBroken("etcd ended the watch stream")

    def _message(self, line: bytes) -> None:
        message = json.loads(line)
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):
            raise WatchBroken(f"not a watch message: {line[:120]!r}")
        if result.get("canceled"):
            raise WatchBroken(f"etcd canceled the watch: {str(result.get('cancel_reason', ''))[:120]}")
        if result.get("created"):
            self.healthy = True
            log.info("watching the cluster's keys in etcd")
            self.on_change()  # what changed before the watch began
            return
        events = result.get("events")
        if isinstance(events, list) and events:
            self.events += len(events)
            self.on_change()
