"""Slow and hostile connections: header and body deadlines and a cap on open connections.

uvicorn's HTTP protocol closes an *idle* keep-alive connection (``timeout_keep_alive``) but
has no deadline for a request that is being sent: a client that trickles its headers a
byte at a time, or sends a body shorter than its Content-Length, keeps its connection (and
its file descriptor) for as long as it likes. :class:`GuardedHttpProtocol` is uvicorn's
httptools protocol (the C parser, llhttp: the per-request cost of h11's pure-Python state
machine was a fifth of a node's CPU per warm turn) with two deadlines, kept from the
parser's callbacks:

- while the server waits for a request head (after the connection opens, and after each
  answer on a keep-alive connection), it must be complete within ``header_timeout_seconds``;
- once the head is in and a body is due, the whole body must be in within
  ``body_timeout_seconds``.

A connection that misses a deadline is answered 408 (the project's JSON error shape) when
no response has begun, and closed. A connection beyond ``max_connections`` is answered 503
``server_busy`` with ``Retry-After`` at its first bytes (its request unread) and closed.

An answer's head and its body leave in one write (:class:`HeadCork`): uvicorn writes the
status line and headers, then the body, each straight to the socket, so every answer was
two TCP segments and its reader woke twice. That is paid on every hop of a request (a
forwarded one crosses two), so the head is held until the body's first bytes, or until the
end of the event loop's turn for an answer whose body comes later (or never, as for HEAD).

:func:`uvicorn_options` gives the keyword arguments every server of the project
(``nekomem serve`` and the tests' live servers) passes to uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar, TypedDict

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from nekomem.config.server import ServerSettings

log = logging.getLogger("nekomem.http.connections")

_HEAD, _BODY = "head", "body"


def _raw_answer(status_line: str, error_code: str, message: str, extra_headers: str = "") -> bytes:
    """A whole answer in the project's JSON error shape, written straight to the transport
    (past the protocol, which cannot answer a request it has not read) before closing."""
    body = json.dumps({"status": "error", "error_code": error_code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"{extra_headers}content-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def _timeout_answer(phase: str) -> bytes:
    """The raw 408 for a head or body not received in time."""
    what = "request head (line and headers)" if phase == _HEAD else "request body"
    return _raw_answer("408 Request Timeout", "request_timeout", f"the {what} was not received in time; the connection is closed")


# The raw 400 for bytes the parser refused (a malformed request line or header, a method
# llhttp does not know): uvicorn's own is plain text, not the project's shape.
_UNPARSABLE = _raw_answer(
    "400 Bad Request",
    "bad_http_request",
    "the request is not valid HTTP/1.1 (its request line, a header, or an unknown method); the connection is closed",
)


def _busy_answer(retry_after: int) -> bytes:
    """The raw 503 for a connection beyond ``max_connections`` (its request is not read)."""
    return _raw_answer(
        "503 Service Unavailable",
        "server_busy",
        f"too many open connections; retry after {retry_after} s",
        extra_headers=f"retry-after: {retry_after}\r\n",
    )


class HeadCork(asyncio.Transport):
    """One request cycle's view of its connection's transport: the answer's head (the first
    write that is not an interim ``100 Continue``) is held and sent together with the next
    write, the body's first bytes. A head still held at the end of the loop's turn is sent
    alone (a HEAD answer, a body that is slow to come). Closing sends what is held first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._head_seen = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data = self._held + bytes(data)
            self._held = None
        elif not self._head_seen and bytes(data[:12]) != b"HTTP/1.1 100":
            self._head_seen = True
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send the held head, if any."""
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._transport.get_extra_info(name, default)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the deadlines of the module docstring. The limits
    are class attributes: :func:`guarded_protocol` makes a subclass per settings."""

    header_timeout: ClassVar[float] = 10.0
    body_timeout: ClassVar[float] = 30.0
    max_connections: ClassVar[int] = 512
    retry_after: ClassVar[int] = 1
    # Class-wide: how many over-cap connections were answered 503 (for the log's pace).
    _refused: ClassVar[int] = 0

    _refusing = False
    # What the client is sending: a request head, a body, or nothing (a whole request is
    # in and its answer is due). Set by the parser's callbacks, read by _watch after each
    # chunk of bytes and each answer.
    _reading: str | None = _HEAD
    _phase: str | None = None
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Beyond the cap the connection is answered 503 at its first bytes and closed:
        # the client learns to retry (Retry-After), and the descriptor is freed at once.
        self._refusing = len(self.connections) > self.max_connections
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            if not self.transport.is_closing():
                cls = type(self)
                cls._refused += 1
                if cls._refused == 1 or cls._refused % 1000 == 0:
                    log.warning("%d connections beyond max_connections (%d) answered 503", cls._refused, self.max_connections)
                self.transport.write(_busy_answer(self.retry_after))
                self.transport.close()
            return
        super().data_received(data)
        self._watch()

    def send_400_response(self, msg: str) -> None:
        self._flush_cycle()  # a pipelined request's answer goes out before the refusal
        self.transport.write(_UNPARSABLE)
        self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._reading = _BODY  # until on_message_complete, often in the same chunk
        # The cycle was just made (its task not yet run): it writes through a cork.
        self.cycle.transport = HeadCork(self.transport, self.loop)

    def _flush_cycle(self) -> None:
        """Send a head the current cycle still holds (before the protocol writes or closes
        past the cycle)."""
        transport = self.cycle.transport if self.cycle is not None else None
        if isinstance(transport, HeadCork):
            transport.flush()

    def shutdown(self) -> None:
        self._flush_cycle()
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self._flush_cycle()
        super().timeout_keep_alive_handler()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A request read ahead (pipelined) is still owed its answer: no head is due yet.
        if self._reading is None and (self.cycle is None or self.cycle.response_complete):
            self._reading = _HEAD
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline of the phase the client's side is in (a phase keeps the deadline
        it started with: more bytes do not extend it)."""
        phase = self._reading
        if phase == self._phase or self.transport.is_closing():
            return
        self._cancel()
        self._phase = phase
        if phase is not None:
            seconds = self.header_timeout if phase == _HEAD else self.body_timeout
            self._deadline = self.loop.call_later(seconds, self._expire, phase)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = None

    def _expire(self, phase: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closed a connection whose %s was not received in time", phase)
        self._flush_cycle()
        # Waiting for a head, ``self.cycle`` is the previous request's (long answered).
        if phase == _HEAD or self.cycle is None or not self.cycle.response_started:
            self.transport.write(_timeout_answer(phase))
        if phase == _BODY and self.cycle is not None and not self.cycle.response_complete:
            # The route waiting for the body sees a disconnect; what it sends is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def guarded_protocol(settings: ServerSettings) -> type[GuardedHttpProtocol]:
    """A :class:`GuardedHttpProtocol` subclass with the limits of ``settings``."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "header_timeout": settings.header_timeout_seconds,
            "body_timeout": settings.body_timeout_seconds,
            "max_connections": settings.max_connections,
            "retry_after": settings.busy_retry_after_seconds,
        },
    )


class UvicornOptions(TypedDict):
    """The keyword arguments :func:`uvicorn_options` gives ``uvicorn.Config``."""

    http: type[GuardedHttpProtocol]
    timeout_keep_alive: int


def uvicorn_options(settings: ServerSettings) -> UvicornOptions:
    """The uvicorn keyword arguments for ``settings``: the guarded protocol and the
    keep-alive timeout (the concurrency bound is :mod:`nekomem.http.backpressure`'s)."""
    return {"http": guarded_protocol(settings), "timeout_keep_alive": settings.keep_alive_seconds}
