"""A small pooled HTTP/1.1 client for the forwarding hop (an asyncio protocol).

The forwarding node relays whole requests and answers between nekomem nodes. httpx's
general machinery (URL models, header objects, transports) cost most of the hop, and so
did h11's per-event state machine and header validation (measured: the forwarding node
spent about as much CPU per request as the owner serving it). Asyncio's streams and an
``asyncio.timeout`` per request were then a fifth of what was left. The hop therefore frames
HTTP/1.1 itself, for the one peer it talks to, another nekomem node, on a plain
:class:`asyncio.Protocol`: the request goes out in one write, the answer is framed as its
bytes arrive, and one future per request is resolved once the answer is whole.

* the request's headers are the ones the forwarding node's own server (uvicorn's httptools protocol)
  already parsed and validated, so they are written out as they are, with the body's
  ``content-length``;
* the answer's head is read up to its blank line (at most 64 KiB) and its body is framed by
  ``content-length`` or ``transfer-encoding: chunked`` (RFC 9112 §6), none for HEAD / 1xx /
  204 / 304, else by the end of the connection (not reused); interim 1xx answers are
  skipped.

One idle keep-alive connection list per owner. Errors: :class:`Unreachable` when no
connection could be opened (nothing was sent: safe to try another owner); :class:`Lost`
when the request was sent and no complete answer came back (it may have been stored: only
the client may retry, with its Idempotency-Key).
"""

from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit


class Unreachable(OSError):
    """No connection to the owner could be opened; nothing was sent."""


class Lost(OSError):
    """The request was sent but no complete answer came back."""


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
_NO_BODY = frozenset({204, 304})
_HEAD_LIMIT = 64 * 1024  # the longest answer head accepted (as asyncio's stream limit was)


class _Stale(Exception):
    """A reused idle connection the owner had closed before our request reached it."""


class _Incomplete(Exception):
    """The bytes so far hold no whole chunked body yet."""


class HopConnection(asyncio.Protocol):
    """One keep-alive connection to an owner, carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Answer] | None = None
        self._head_only = False
        self._received = False  # any byte of the current answer
        self._reused = False  # the current request went out on a connection used before
        self._head: tuple[int, list[tuple[bytes, bytes]], bool, int | None, bool] | None = None
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.closed = True  # bytes nobody asked for: this connection is not reused
            if self.transport is not None:
                self.transport.close()
            return
        self._received = True
        self._buffer += data
        try:
            self._advance(eof=False)
        except (ValueError, _Incomplete) as exc:
            self._fail(Lost(f"{type(exc).__name__}: {exc}"))

    def eof_received(self) -> bool:
        self._end(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)

    # the request
    async def exchange(self, wire: bytes, head_only: bool, timeout: float, *, reused: bool) -> Answer:
        """Send ``wire`` (a whole request) and wait for its whole answer. Raises Lost, or
        _Stale when a reused connection was found closed before any answer byte."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise _Stale() if reused else Lost("the connection closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer] = loop.create_future()
        self._waiter, self._head_only, self._received, self._head = waiter, head_only, False, None
        self._reused = reused
        self._buffer.clear()
        timer = loop.call_later(timeout, self._fail, Lost("timed out"))
        self.transport.write(wire)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _advance(self, *, eof: bool) -> None:
        """Frame the answer from the bytes so far; resolve the waiter once it is whole."""
        buffer = self._buffer
        while self._head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _HEAD_LIMIT:
                    raise ValueError("an answer head longer than 64 KiB")
                return
            head = _parse_head(bytes(buffer[: end + 4]))
            del buffer[: end + 4]
            if head[0] >= 200:
                self._head = head
            # else an interim answer (100 Continue, 103 Early Hints): the final one follows.
        status, headers, keep_alive, length, chunked = self._head
        if self._head_only or status in _NO_BODY:
            content = b""
        elif chunked:
            try:
                content, used = _chunked(buffer)
            except _Incomplete:
                if eof:
                    raise
                return
            del buffer[:used]
        elif length is not None:
            if len(buffer) < length:
                if eof:
                    raise ValueError("the answer ended before its content-length")
                return
            content = bytes(buffer[:length])
            del buffer[:length]
        else:  # framed by the end of the connection
            if not eof:
                return
            content, keep_alive = bytes(buffer), False
            buffer.clear()
        self.keep_alive = keep_alive and not buffer
        if not self.keep_alive:
            self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((status, headers, content))

    def _end(self, exc: Exception | None) -> None:
        """The owner closed the connection (or it broke): frame what came, or fail."""
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if not self._received and self._reused:
            waiter.set_exception(_Stale())
            return
        try:
            if self._received:
                self._advance(eof=True)
        except (ValueError, _Incomplete) as error:
            self._fail(Lost(f"{type(error).__name__}: {error}"))
            return
        if not waiter.done():
            why = f"{type(exc).__name__}" if exc is not None else "the owner closed the connection"
            waiter.set_exception(Lost(why))

    def _fail(self, error: BaseException) -> None:
        waiter = self._waiter
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class HopPool:
    def __init__(self, *, max_idle: int, timeout: float) -> None:
        self.max_idle = max_idle
        self.timeout = timeout
        self._idle: dict[str, list[HopConnection]] = {}
        self._addresses: dict[str, tuple[str, int, bytes]] = {}  # base -> (host, port, Host header)

    def _address(self, base: str) -> tuple[str, int, bytes]:
        address = self._addresses.get(base)
        if address is None:
            parts = urlsplit(base)
            address = (parts.hostname or "127.0.0.1", parts.port or 80, parts.netloc.encode())
            self._addresses[base] = address
        return address

    async def _open(self, base: str) -> HopConnection:
        host, port, _ = self._address(base)
        try:
            async with asyncio.timeout(min(self.timeout, 5.0)):
                _, conn = await asyncio.get_running_loop().create_connection(HopConnection, host, port)
        except (TimeoutError, OSError) as exc:
            raise Unreachable(f"{base}: {type(exc).__name__}") from exc
        return conn

    async def request(self, base: str, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        """Send one request to ``base`` (scheme://host:port) and return (status, headers,
        body). ``headers`` must not carry content-length or transfer-encoding (the body's
        length is sent). Raises Unreachable or Lost."""
        idle = self._idle.setdefault(base, [])
        wire = self._encode(base, method, target, headers, body)
        head_only = method == "HEAD"
        while idle:
            conn = idle.pop()
            try:
                return self._done(base, conn, await conn.exchange(wire, head_only, self.timeout, reused=True))
            except _Stale:
                conn.close()
                continue  # the owner closed an idle connection before reading: a fresh one
        conn = await self._open(base)  # a fresh connection fails with Lost, never _Stale
        return self._done(base, conn, await conn.exchange(wire, head_only, self.timeout, reused=False))

    def _done(self, base: str, conn: HopConnection, answer: Answer) -> Answer:
        idle = self._idle[base]
        if conn.keep_alive and not conn.closed and len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()
        return answer

    def _encode(self, base: str, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
        lines = [method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        has_host = False
        for key, value in headers:
            has_host = has_host or key.lower() == b"host"
            lines.append(key + b": " + value)
        if not has_host:  # an HTTP/1.0 client sent none
            lines.append(b"host: " + self._address(base)[2])
        lines.append(b"content-length: " + str(len(body)).encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _parse_head(head: bytes) -> tuple[int, list[tuple[bytes, bytes]], bool, int | None, bool]:
    """(status, headers with lower-case names, keep-alive, content-length, chunked) of an
    answer's head (its status line and header lines, ending in a blank line). Raises
    ValueError for a head that is not HTTP/1.x."""
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(rest) < 3:
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: list[tuple[bytes, bytes]] = []
    keep_alive = version == b"HTTP/1.1"
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        key, colon, value = line.partition(b":")
        if not colon:
            raise ValueError("a header line without a colon")
        key, value = key.strip().lower(), value.strip()
        headers.append((key, value))
        if key == b"content-length":
            length = int(value)
            if length < 0:
                raise ValueError("a negative content-length")
        elif key == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif key == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            keep_alive = (keep_alive or b"keep-alive" in tokens) and b"close" not in tokens
    return status, headers, keep_alive, None if chunked else length, chunked


def _chunked(buffer: bytearray) -> tuple[bytes, int]:
    """A whole chunked body (RFC 9112 §7.1) at the start of ``buffer``: (its chunks joined,
    the bytes it took); extensions and trailers dropped. Raises _Incomplete when the body is
    not all there yet, ValueError when it is malformed."""
    chunks: list[bytes] = []
    at = 0
    while True:
        eol = buffer.find(b"\r\n", at)
        if eol < 0:
            raise _Incomplete("a chunk size line")
        size = int(bytes(buffer[at:eol]).split(b";", 1)[0].strip(), 16)
        at = eol + 2
        if size == 0:
            while True:  # trailer fields, then the blank line
                eol = buffer.find(b"\r\n", at)
                if eol < 0:
                    raise _Incomplete("the trailer")
                blank, at = eol == at, eol + 2
                if blank:
                    return b"".join(chunks), at
        if len(buffer) < at + size + 2:
            raise _Incomplete("a chunk")
        chunks.append(bytes(buffer[at : at + size]))
        if buffer[at + size : at + size + 2] != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")
        at += size + 2
