"""A small pooled HTTP/1.1 client for the forwarding hop (asyncio streams).

The forwarding node relays whole requests and answers between nekomem nodes. httpx's
general machinery (URL models, header objects, transports) cost most of the hop, and so
did h11's per-event state machine and header validation (measured: the forwarding node
spent about as much CPU per request as the owner serving it). The hop therefore frames
HTTP/1.1 itself, for the one peer it talks to, another nekomem node:

* the request's headers are the ones the forwarding node's own server (uvicorn's httptools protocol)
  already parsed and validated, so they are written out as they are, with the body's
  ``content-length``;
* the answer's head is read up to its blank line (at most the stream limit, 64 KiB) and its
  body is framed by ``content-length`` or ``transfer-encoding: chunked`` (RFC 9112 §6),
  none for HEAD / 1xx / 204 / 304, else by the end of the connection (not reused);
  interim 1xx answers are skipped.

One idle keep-alive connection list per owner. Errors: :class:`Unreachable` when no
connection could be opened (nothing was sent: safe to try another owner); :class:`Lost`
when the request was sent and no complete answer came back (it may have been stored: only
the client may retry, with its Idempotency-Key).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class Unreachable(OSError):
    """No connection to the owner could be opened; nothing was sent."""


class Lost(OSError):
    """The request was sent but no complete answer came back."""


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_NO_BODY = frozenset({204, 304})


class HopPool:
    def __init__(self, *, max_idle: int, timeout: float) -> None:
        self.max_idle = max_idle
        self.timeout = timeout
        self._idle: dict[str, list[_Conn]] = {}
        self._addresses: dict[str, tuple[str, int, bytes]] = {}  # base -> (host, port, Host header)

    def _address(self, base: str) -> tuple[str, int, bytes]:
        address = self._addresses.get(base)
        if address is None:
            parts = urlsplit(base)
            address = (parts.hostname or "127.0.0.1", parts.port or 80, parts.netloc.encode())
            self._addresses[base] = address
        return address

    async def _open(self, base: str) -> _Conn:
        host, port, _ = self._address(base)
        try:
            async with asyncio.timeout(min(self.timeout, 5.0)):
                return await asyncio.open_connection(host, port)
        except (TimeoutError, OSError) as exc:
            raise Unreachable(f"{base}: {type(exc).__name__}") from exc

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
                return await self._timed(base, conn, wire, head_only, reused=True)
            except _Stale:
                continue  # the owner closed an idle connection before reading: a fresh one
        conn = await self._open(base)
        return await self._timed(base, conn, wire, head_only, reused=False)

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

    async def _timed(self, base: str, conn: _Conn, wire: bytes, head_only: bool, *, reused: bool) -> Answer:
        try:
            async with asyncio.timeout(self.timeout):
                return await self._exchange(base, conn, wire, head_only, reused=reused)
        except TimeoutError as exc:
            conn[1].close()
            raise Lost("timed out") from exc

    async def _exchange(self, base: str, conn: _Conn, wire: bytes, head_only: bool, *, reused: bool) -> Answer:
        reader, writer = conn
        received = False
        try:
            writer.write(wire)
            await writer.drain()
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if not exc.partial and not received and reused:
                        raise _Stale from exc
                    raise Lost("the owner closed the connection") from exc
                received = True
                status, answer_headers, keep_alive, length, chunked = _parse_head(head)
                if status >= 200:
                    break
                # An interim answer (100 Continue, 103 Early Hints): the final one follows.
            if head_only or status in _NO_BODY:
                content = b""
            elif chunked:
                content = await _read_chunked(reader)
            elif length is not None:
                content = await reader.readexactly(length)
            else:
                content = await reader.read()  # framed by the end of the connection
                keep_alive = False
        except (_Stale, Lost):
            writer.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            writer.close()
            if reused and not received and isinstance(exc, OSError):
                raise _Stale from exc
            raise Lost(type(exc).__name__) from exc
        idle = self._idle[base]
        if keep_alive and len(idle) < self.max_idle and not reader.at_eof():
            idle.append(conn)
        else:
            writer.close()
        return status, answer_headers, content

    async def close(self) -> None:
        for conns in self._idle.values():
            for _reader, writer in conns:
                writer.close()
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
        elif key == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif key == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            keep_alive = (keep_alive or b"keep-alive" in tokens) and b"close" not in tokens
    return status, headers, keep_alive, None if chunked else length, chunked


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body (RFC 9112 §7.1): its chunks joined; extensions and trailers dropped."""
    chunks: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # a trailer field
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")


class _Stale(Exception):
    """A reused idle connection the owner had closed before our request reached it."""
