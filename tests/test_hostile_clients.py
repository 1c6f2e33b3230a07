"""Slow and hostile clients against a real server (uvicorn with the project's guarded
httptools protocol, over raw sockets): header and body deadlines, the cap on open connections, the
back-pressure bound, and the bounds on a /query_memory ``time`` expression."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from nekomem.recall.timewindow import parse_time_window, relation_count
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

# Generous bounds on a hang, never the thing measured: the deadlines under test are short.
HANG = 30.0


def _connect(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (b'' for a reset)."""
    chunks: list[bytes] = []
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = make_settings(
        tmp_path / "memory",
        header_timeout_seconds=0.5,
        body_timeout_seconds=0.5,
        max_connections=20,
        max_concurrent_requests=2,
        busy_retry_after_seconds=3,
    )
    with LiveServer(settings) as live:
        yield live


def test_a_trickled_request_head_is_answered_408_and_closed(server: LiveServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sock.sendall(b"a")  # more bytes do not extend the deadline of the head
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"request_timeout"' in answer


def test_a_connection_that_sends_nothing_is_closed(server: LiveServer) -> None:
    with _connect(server) as sock:
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 408")


def test_a_body_shorter_than_its_content_length_is_answered_408_and_closed(server: LiveServer) -> None:
    with _connect(server) as sock:
        sock.sendall(
            b"POST /query_memory/Lan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"query": "te'
        )
        answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"request body" in answer
    # The server carries on.
    assert server.get("/health").status_code == 200


def test_a_keep_alive_connection_gets_a_new_head_deadline(server: LiveServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the second head never ends
        rest = _read_until_closed(sock)
    # The rest of the first answer (its body may come in a second segment), then the 408.
    assert b"HTTP/1.1 408" in rest and b"HTTP/1.1 200" not in rest


def test_pipelined_requests_are_each_answered_then_a_head_deadline_applies(server: LiveServer) -> None:
    # Two whole requests in one write (the second read ahead while the first is answered),
    # then a head that never ends: both are answered 200, and only then does the head's
    # deadline close the connection.
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 2 + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer = _read_until_closed(sock)
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:400]
    assert answer.index(b"HTTP/1.1 408") > answer.rindex(b"HTTP/1.1 200")


def test_connections_beyond_the_cap_are_answered_503_at_once(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "memory", header_timeout_seconds=5, max_connections=20, busy_retry_after_seconds=3)
    with LiveServer(settings) as server:
        _beyond_the_cap(server)


def _beyond_the_cap(server: LiveServer) -> None:
    idle = [_connect(server) for _ in range(20)]  # the cap: 20 connections that send nothing
    try:
        # Accepted in order: once the server counts the 20, each further one is refused.
        def refused() -> bytes:
            with _connect(server) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = _read_until_closed(sock)
            return answer if answer.startswith(b"HTTP/1.1 503") else b""

        answer = wait_for(refused, timeout=HANG, what="a connection beyond the cap")
        assert b"retry-after: 3" in answer.lower() and b'"server_busy"' in answer
        # The admitted idle ones meet their head deadline, and the server serves again.
        assert all(_read_until_closed(sock).startswith(b"HTTP/1.1 408") for sock in idle)
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: server.get("/health").status_code == 200, timeout=HANG, what="/health after the burst")


def test_back_pressure_answers_503_with_retry_after_and_spares_health(server: LiveServer) -> None:
    # Two requests held in flight by their unfinished bodies (within the body deadline,
    # re-sent until the bound is seen): the bound is 2.
    held: list[socket.socket] = []

    def hold_two() -> httpx.Response | None:
        while len(held) < 2:
            sock = _connect(server)
            sock.sendall(
                b"POST /query_memory/Lan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"
            )
            held.append(sock)
        response = server.post("/query_memory/Lan", json={"query": "tea"})
        if response.status_code == 503:
            return response
        for sock in held:  # a held one timed out before the third came: hold again
            sock.close()
        held.clear()
        return None

    try:
        busy = wait_for(hold_two, timeout=HANG, what="the concurrency bound")
        assert busy.json()["error_code"] == "server_busy"
        assert busy.headers["Retry-After"] == "3"
        assert server.get("/health").status_code == 200
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: server.post("/query_memory/Lan", json={"query": "tea"}).status_code == 200, timeout=HANG, what="admission again")


def test_a_time_expression_too_long_or_too_deep_is_422(server: LiveServer) -> None:
    long = server.post("/query_memory/Lan", json={"time": "の前日" * 70_000})
    assert long.status_code == 422 and long.json()["error_code"] == "time_too_long"
    deep = server.post("/query_memory/Lan", json={"time": "2026年5月7日" + "の前日" * 20})
    assert deep.status_code == 422 and deep.json()["error_code"] == "time_too_deep"
    fine = server.post("/query_memory/Lan", json={"time": "2026年5月7日の前日"})
    assert fine.status_code == 200 and "error_code" not in fine.json()


def test_the_parser_stops_at_its_depth_and_length_ceilings() -> None:
    now = datetime(2026, 12, 3, 12, tzinfo=timezone.utc)
    # 2,000 levels used to raise RecursionError out of the parser.
    assert parse_time_window("the day before " * 2000 + "today", now) is None
    assert parse_time_window("2026年5月7日" + "の前日" * 70_000, now) is None
    window = parse_time_window("2026年5月7日" + "の前日" * 3, now)
    assert window is not None and window.start.day == 4
    assert relation_count("the day before the week after 9 June") == 2


def _data_segments_in(sock: socket.socket) -> int | None:
    """``tcpi_data_segs_in`` of the socket's TCP_INFO (Linux 4.6+): segments received that
    carried data; None where the platform does not tell."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < 160:
        return None
    return int.from_bytes(info[152:156], sys.byteorder)


def _answer_length(answer: bytes) -> int:
    """The bytes of one whole answer at the start of ``answer``: its head and its
    Content-Length of body (ValueError when the head is not all there)."""
    head_end = answer.index(b"\r\n\r\n") + 4
    for line in answer[:head_end].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return head_end + int(value)
    raise ValueError("no content-length")


def test_an_answer_leaves_in_one_write_and_a_head_only_answer_is_not_held(server: LiveServer) -> None:
    with _connect(server) as sock:
        # The first bytes the client can read are the whole answer, head and body: they
        # left in one write (a separate head would make a reader wake once for the head
        # and again for the body, on every hop of a request).
        before = _data_segments_in(sock)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = sock.recv(65536)
        while len(first) < _answer_length(first):
            first += sock.recv(65536)
        if before is not None:  # Linux: the segments that carried data, counted by the kernel
            assert _data_segments_in(sock) == before + 1
        # A HEAD answer has no body to join: its head is sent alone, and in order with the
        # answer to a request pipelined behind it.
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        rest = _read_until_closed(sock)  # closed by the head deadline once both are answered
    head_end = rest.index(b"\r\n\r\n") + 4
    assert rest.startswith(b"HTTP/1.1 200") and rest[head_end:].startswith(b"HTTP/1.1 200"), rest[:300]
    second = rest[head_end:]
    assert len(second) >= _answer_length(second) and b'"status":"ok"' in second
