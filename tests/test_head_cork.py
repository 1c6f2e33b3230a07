"""HeadCork, the transport a request cycle writes through, without a server: an answer's
head goes out with its body's first bytes, or alone at the end of the loop's turn."""

from __future__ import annotations

import asyncio

from nekomem.http.connections import HeadCork


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def test_a_head_leaves_with_the_first_body_bytes_then_writes_pass_through() -> None:
    async def scenario() -> None:
        inner = RecordingTransport()
        cork = HeadCork(inner, asyncio.get_running_loop())
        cork.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        assert inner.writes == []
        cork.write(b"ne")
        cork.write(b"ko")
        assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nne", b"ko"]
        await asyncio.sleep(0)  # the end-of-turn flush finds nothing held
        assert len(inner.writes) == 2

    asyncio.run(scenario())


def test_a_head_alone_is_sent_at_the_end_of_the_turn_and_before_a_close() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inner = RecordingTransport()
        cork = HeadCork(inner, loop)
        cork.write(b"HTTP/1.1 204 No Content\r\n\r\n")  # nothing follows (as for HEAD)
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
        closing = RecordingTransport()
        cork = HeadCork(closing, loop)
        cork.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
        cork.close()
        assert closing.writes == [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"] and closing.closed

    asyncio.run(scenario())


def test_an_interim_100_continue_is_not_held() -> None:
    async def scenario() -> None:
        inner = RecordingTransport()
        cork = HeadCork(inner, asyncio.get_running_loop())
        cork.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # the client waits for it
        cork.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        cork.write(b"{}")
        assert inner.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]

    asyncio.run(scenario())
