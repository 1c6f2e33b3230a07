"""A small pooled HTTP/1.1 client for the forwarding hop (h11 over asyncio streams).

The forwarding node relays whole requests and answers; httpx's general machinery (URL
models, header objects, transports, event hooks) cost most of the hop, so the hop speaks
HTTP/1.1 itself: one idle keep-alive connection list per owner, h11 for the framing.

Errors: :class:`Unreachable` when no connection could be opened (nothing was sent: safe to
try another owner); :class:`Lost` when the request was sent and no complete answer came
back (it may have been stored: only the client may retry, with its Idempotency-Key).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import h11


class Unreachable(OSError):
    """No connection to the owner could be opened; nothing was sent."""


class Lost(OSError):
    """The request was sent but no complete answer came back."""


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]


class HopPool:
    def __init__(self, *, max_idle: int, timeout: float) -> None:
        self.max_idle = max_idle
        self.timeout = timeout
        self._idle: dict[str, list[_Conn]] = {}

    async def _open(self, base: str) -> _Conn:
        parts = urlsplit(base)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port or 80), min(self.timeout, 5.0))
        except (TimeoutError, OSError) as exc:
            raise Unreachable(f"{base}: {type(exc).__name__}") from exc
        return reader, writer, h11.Connection(h11.CLIENT)

    async def request(self, base: str, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        """Send one request to ``base`` (scheme://host:port) and return (status, headers,
        body). Raises Unreachable or Lost."""
        idle = self._idle.setdefault(base, [])
        while idle:
            conn = idle.pop()
            try:
                return await asyncio.wait_for(self._exchange(base, conn, method, target, headers, body, reused=True), self.timeout)
            except _Stale:
                continue  # the owner closed an idle connection before reading: a fresh one
            except TimeoutError as exc:
                conn[1].close()
                raise Lost("timed out") from exc
        conn = await self._open(base)
        try:
            return await asyncio.wait_for(self._exchange(base, conn, method, target, headers, body, reused=False), self.timeout)
        except TimeoutError as exc:
            conn[1].close()
            raise Lost("timed out") from exc

    async def _exchange(
        self, base: str, conn: _Conn, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes, *, reused: bool
    ) -> Answer:
        reader, writer, h = conn
        out = [*headers, (b"content-length", str(len(body)).encode())]
        if not any(k.lower() == b"host" for k, _ in headers):  # an HTTP/1.0 client sent none
            out.append((b"host", urlsplit(base).netloc.encode()))
        received = False
        try:
            writer.write(
                h.send(h11.Request(method=method, target=target, headers=out)) + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage())
            )
            await writer.drain()
            status, answer_headers, chunks = 0, [], []
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    if not data and not received and reused:
                        raise _Stale
                    received = received or bool(data)
                    h.receive_data(data)
                    continue
                if isinstance(event, h11.Response):
                    status, answer_headers = event.status_code, list(event.headers)
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise Lost("the owner closed the connection")
        except (OSError, h11.ProtocolError) as exc:
            writer.close()
            if reused and not received:
                raise _Stale from exc
            raise Lost(type(exc).__name__) from exc
        except (_Stale, Lost):
            writer.close()
            raise
        if h.our_state is h11.DONE and h.their_state is h11.DONE and len(self._idle[base]) < self.max_idle:
            h.start_next_cycle()
            self._idle[base].append(conn)
        else:
            writer.close()
        return status, answer_headers, b"".join(chunks)

    async def close(self) -> None:
        for conns in self._idle.values():
            for _reader, writer, _h in conns:
                writer.close()
        self._idle.clear()


class _Stale(Exception):
    """A reused idle connection the owner had closed before our request reached it."""
