"""The parts of cluster mode that need no cluster: the shard hash, rendezvous hashing, the
fence over the real store write helpers, the folder locks, the etcd client against a real
etcd (Debian's etcd-server), and single-node mode left as it was."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path

import pytest

from nekomem.cluster.etcd import EtcdClient, LeaseLost, compare_revision, delete_op, put_op
from nekomem.cluster.fencing import WRITERS_FILE, Fence
from nekomem.cluster.hop_pool import HopPool, Lost, Unreachable
from nekomem.cluster.locks import ShardLocks
from nekomem.cluster.ring import assignment, owner_of
from nekomem.cluster.watch import ChunkedLines, KeyWatch, WatchBroken
from nekomem.domain.turns import Turn
from nekomem.stores import fence as store_fence
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.faults import classify
from nekomem.stores.fence import FencedWrite
from nekomem.stores.jsonl import NdjsonLog
from nekomem.stores.shard_layout import character_root, shard_folder, shard_of, shard_of_path
from nekomem.stores.timeindex import TimeIndex
from tests.support.cluster import Etcd, require_tools
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


def test_shard_of_is_stable_across_processes_and_canonical():
    names = ["Lan", "ねこ", "Café", "小天", "c042"]
    here = [shard_of(n, 256) for n in names]
    code = "import sys; from nekomem.stores.shard_layout import shard_of; print([shard_of(n, 256) for n in sys.argv[1:]])"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a salted built-in hash would differ
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == str(here)
    assert shard_of(unicodedata.normalize("NFD", "Café"), 256) == shard_of("Café", 256)
    counts = Counter(shard_of(f"user-{i}", 64) for i in range(6400))
    assert len(counts) == 64 and max(counts.values()) < 2 * min(counts.values())


def test_rendezvous_moves_only_the_joining_or_leaving_nodes_shards():
    three = assignment(256, ["a", "b", "c"])
    four = assignment(256, ["a", "b", "c", "d"])
    moved = [s for s in range(256) if three[s] != four[s]]
    assert all(four[s] == "d" for s in moved)
    assert 0.15 * 256 < len(moved) < 0.35 * 256
    two = assignment(256, ["a", "c"])
    assert all(two[s] == three[s] for s in range(256) if three[s] != "b")
    assert owner_of(3, []) is None


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fenced(tmp_path):
    clock = ManualClock()
    fence = Fence(tmp_path, ttl=10, fraction=0.5, node_id="me", clock=clock)
    store_fence.install(fence.guard)
    yield fence, clock, tmp_path
    store_fence.install(None)


def test_the_fence_refuses_every_store_write_past_the_deadline_and_outside_owned_shards(fenced):
    fence, clock, root = fenced
    name = "Lan"
    folder = character_root(root, name, 16) / name
    folder.mkdir(parents=True)
    shard = shard_of(name, 16)
    assert shard_of_path(root, folder / "x.json") == shard and shard_of_path(root, root / "core_config.json") is None
    view, log = folder / "view.json", NdjsonLog(folder / "events.ndjson")
    with pytest.raises(FencedWrite):  # not owned yet
        atomic_write_json(view, {"v": 0})
    fence.grant(shard, token=41)
    with pytest.raises(FencedWrite):  # owned, but no keepalive acknowledged yet
        atomic_write_json(view, {"v": 0})
    fence.renewed(sent_at=clock.now)
    atomic_write_json(view, {"v": 1})
    log.append([b'{"n":1}'])
    index = TimeIndex(folder / "time_indexed.db")
    index.append("s", [Turn(role="human", text="kept", ts="2024-01-01T00:00:00Z")])
    # The deadline passes (a paused process waking up): nothing more reaches the files.
    clock.now += 5.0
    with pytest.raises(FencedWrite) as refused:
        atomic_write_json(view, {"v": 2})
    assert classify(refused.value).code == "shard_fenced" and classify(refused.value).status == 503
    with pytest.raises(FencedWrite):
        log.append([b'{"n":2}'])
    with pytest.raises(FencedWrite):
        index.append("s", [Turn(role="human", text="lost", ts="2024-01-01T00:00:01Z")])
    assert view.read_text().strip() == '{"v":1}' and (folder / "events.ndjson").read_bytes() == b'{"n":1}\n'
    assert index.count() == 1
    index.close()  # a fenced connection is left open, never checkpointed into the file
    fence.renewed(sent_at=clock.now)
    fence.revoke(shard)  # handed over: refused again although the deadline is fine
    with pytest.raises(FencedWrite):
        atomic_write_json(view, {"v": 3})
    assert fence.refusals == 7  # six writes and the unclosed connection's look
    writers = (folder / WRITERS_FILE).read_text().splitlines()
    assert len(writers) == 1 and '"node": "me"' in writers[0] and '"token": 41' in writers[0]


def test_a_shard_lock_held_elsewhere_is_waited_for_then_overridden(tmp_path):
    first, second = ShardLocks(), ShardLocks()
    folder = shard_folder(tmp_path, 7)
    assert first.acquire(7, folder, wait=0)
    assert not second.acquire(7, folder, wait=0.2) and second.overrides == 1
    first.release(7)
    assert second.acquire(7, folder, wait=0.2) and second.held() == [7]
    second.release_all()


def test_etcd_claims_compare_revisions_and_leases_take_their_keys(tmp_path):
    require_tools()
    etcd = Etcd(tmp_path)
    etcd.start()
    client = EtcdClient(etcd.url, timeout=2)
    try:
        lease = client.grant(60)
        assert client.keepalive(lease) == 60
        key = "/t/shards/0001"
        claim = client.txn([compare_revision(key, "CREATE", 0)], [put_op(key, b"a", lease)])
        assert claim.succeeded
        assert not client.txn([compare_revision(key, "CREATE", 0)], [put_op(key, b"b", lease)]).succeeded
        (kv,), _ = client.range("/t/shards/", prefix=True)
        assert kv.value == b"a" and kv.mod_revision == claim.revision and kv.lease == lease
        assert not client.txn([compare_revision(key, "MOD", claim.revision - 1)], [delete_op(key)]).succeeded
        other = client.grant(1)
        client.put("/t/nodes/x", b"{}", other)
        # A lease nobody renews expires, and its keys go with it.
        wait_for(lambda: not client.range("/t/nodes/", prefix=True)[0], timeout=30, what="the lease to expire")
        with pytest.raises(LeaseLost):
            client.keepalive(other)
        assert client.txn([compare_revision(key, "MOD", claim.revision)], [delete_op(key)]).succeeded
        assert client.range(key)[0] == []
    finally:
        client.close()
        etcd.stop()


def test_chunked_watch_lines_survive_any_split():
    body = b'{"result":{"created":true}}\n{"result":{"events":[{"kv":{}}]}}\n'
    stream = b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\n\r\n" % (10, body[:10], len(body) - 10, body[10:])
    for step in range(1, len(stream) + 1):
        lines = ChunkedLines()
        got = [line for i in range(0, len(stream), step) for line in lines.feed(stream[i : i + step])]
        assert got == body.split(b"\n")[:2] and lines.ended, step
    with pytest.raises(WatchBroken):
        ChunkedLines().feed(b"zz\r\n")
    with pytest.raises(WatchBroken):
        ChunkedLines().feed(b"2\r\nabXX")


def test_the_key_watch_reports_changes_and_lease_expiries_and_comes_back_after_etcd_restarts(tmp_path):
    require_tools()
    etcd = Etcd(tmp_path)
    etcd.start()
    client = EtcdClient(etcd.url, timeout=2)
    changes: list[float] = []
    watch = KeyWatch(etcd.url, "/w/", lambda: changes.append(1), connect_timeout=2, backoff_max=0.5)
    watch.start()
    try:
        wait_for(lambda: watch.healthy, timeout=30, what="the watch to stream")
        client.put("/w/nodes/a", b"{}")
        client.put("/other/key", b"{}")  # outside the prefix: not reported
        wait_for(lambda: watch.events == 1, timeout=30, what="the put to be reported")
        lease = client.grant(1)
        client.put("/w/shards/0001", b"{}", lease)
        # Nobody renews the lease: etcd deletes its key when it expires, and the watch says so.
        wait_for(lambda: watch.events == 3, timeout=30, what="the lease's key deletion to be reported")
        assert client.range("/w/shards/", prefix=True)[0] == []
        etcd.stop()
        wait_for(lambda: not watch.healthy and watch.breaks >= 1, timeout=30, what="the watch to notice etcd is gone")
        etcd.start()
        wait_for(lambda: watch.healthy, timeout=60, what="the watch to stream again")
        before = len(changes)
        client.put("/w/nodes/b", b"{}")
        wait_for(lambda: len(changes) > before, timeout=30, what="a change after the restart")
    finally:
        watch.stop()
        client.close()
        etcd.stop()


def test_single_node_mode_keeps_the_flat_layout_and_needs_no_etcd(tmp_path):
    from nekomem.actors.host import ACTORS
    from nekomem.runtime.runtime import Runtime
    from nekomem.server.app import create_app
    from nekomem.server.openapi import build_document

    settings = make_settings(tmp_path)
    assert settings.cluster.cluster_etcd_url == "" and settings.cluster.cluster_shards == 256
    runtime = Runtime(settings, actors=ACTORS)
    assert runtime.services.character_root is None
    assert runtime.character_paths("Lan").folder == tmp_path.resolve() / "Lan"
    app = create_app(settings, runtime=runtime)
    assert not any(getattr(r, "path", "").startswith("/cluster") for r in app.router.routes)
    assert getattr(app.state, "cluster", None) is None
    assert not [p for p in build_document(app.state.operations)["paths"] if p.startswith("/cluster")]  # the same documented routes
    clustered = Runtime(make_settings(tmp_path, cluster_etcd_url="http://127.0.0.1:9", cluster_shards=16), actors=ACTORS)
    assert clustered.character_paths("Lan").folder == shard_folder(tmp_path.resolve(), shard_of("Lan", 16)) / "Lan"


class _RawOwner:
    """A stand-in owner on loopback that answers each request on a connection with the next
    raw answer of its script (bytes, or None: close the connection without answering), and
    records the requests it read."""

    def __init__(self, answers: list[bytes | None], *, piece: int = 0) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.piece = piece  # > 0: each answer is written this many bytes at a time

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(v for k, v in (line.split(b": ", 1) for line in head[:-4].split(b"\r\n")[1:]) if k == b"content-length"))
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    break
                for at in range(0, len(answer), self.piece or len(answer)):
                    writer.write(answer[at : at + (self.piece or len(answer))])
                    await writer.drain()
                    await asyncio.sleep(0)
        except asyncio.IncompleteReadError:
            pass
        writer.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_run(request: pytest.FixtureRequest) -> Callable[[Coroutine[object, object, None]], None]:
    """Runs a coroutine on asyncio's own loop, or on uvloop (what a node serves on, whose
    transports are not asyncio's classes)."""
    if request.param == "asyncio":
        return asyncio.run
    uvloop = pytest.importorskip("uvloop")
    return uvloop.run


def test_the_hop_client_frames_answers_and_reuses_connections_it_may(loop_run):
    async def scenario() -> None:
        owner = _RawOwner(
            [
                b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{"a": 1}\n',
                # An interim answer first, then a chunked one with an extension and a trailer.
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4;x=y\r\nneko\r\n3\r\nmem\r\n0\r\nx-trailer: 1\r\n\r\n",
                b"HTTP/1.1 204 No Content\r\nx-k: v\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",  # HEAD: a length, no body
                b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 2\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
                b"HTTP/1.1 200 OK\r\n\r\nuntil the end",  # framed by the connection's end
            ]
        )
        server = await asyncio.start_server(owner.serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = HopPool(max_idle=4, timeout=10)
        headers = [(b"host", b"front"), (b"idempotency-key", b"k1")]
        try:
            assert await pool.request(base, "POST", b"/cache/Lan?x=1", headers, b'{"b": 2}') == (
                200,
                [(b"content-type", b"application/json"), (b"content-length", b"9")],
                b'{"a": 1}\n',
            )
            status, answer_headers, body = await pool.request(base, "POST", b"/cache/Lan", headers, b"")
            assert (status, body, answer_headers) == (201, b"nekomem", [(b"transfer-encoding", b"chunked")])
            assert (await pool.request(base, "DELETE", b"/x", headers, b""))[::2] == (204, b"")
            assert (await pool.request(base, "HEAD", b"/x", headers, b""))[::2] == (200, b"")
            assert owner.connections == 1  # every answer so far kept the connection
            assert (await pool.request(base, "GET", b"/x", headers, b""))[::2] == (503, b"{}")
            # "connection: close": the next request opens a new connection.
            assert (await pool.request(base, "GET", b"/y", [], b""))[::2] == (200, b"until the end")
            assert owner.connections == 2
            assert pool._idle[base] == []  # an answer framed by the connection's end closes it
        finally:
            await pool.close()
            server.close()
        first = owner.requests[0]
        assert first.startswith(b"POST /cache/Lan?x=1 HTTP/1.1\r\n")
        assert b"\r\nidempotency-key: k1\r\n" in first and b"\r\nhost: front\r\n" in first
        assert first.endswith(b'content-length: 8\r\n\r\n{"b": 2}')
        assert b"\r\nhost: 127.0.0.1:" in owner.requests[-1]  # none given: the owner's address

    loop_run(scenario())


def test_the_hop_client_frames_answers_that_arrive_in_pieces(loop_run):
    async def scenario() -> None:
        answers = [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 11\r\nx-a: b\r\n\r\nhello world",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        ]
        owner = _RawOwner(answers, piece=3)
        server = await asyncio.start_server(owner.serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = HopPool(max_idle=4, timeout=10)
        try:
            first = await pool.request(base, "GET", b"/a", [], b"")
            assert first == (200, [(b"content-length", b"11"), (b"x-a", b"b")], b"hello world")
            assert (await pool.request(base, "GET", b"/b", [], b""))[2] == b"hello world"
            assert owner.connections == 1
        finally:
            await pool.close()
            server.close()

    loop_run(scenario())


def test_the_hop_client_retries_a_stale_idle_connection_and_reports_lost_answers(loop_run):
    async def scenario() -> None:
        ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        # Connection 1 answers once, then closes before answering the next request (as an
        # owner closing an idle connection does); connection 2 answers; connection 3 closes
        # mid-answer.
        owner = _RawOwner([ok, None, ok, b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"])
        server = await asyncio.start_server(owner.serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pool = HopPool(max_idle=4, timeout=10)
        try:
            assert (await pool.request(base, "GET", b"/a", [], b""))[2] == b"ok"
            assert (await pool.request(base, "GET", b"/b", [], b""))[2] == b"ok"  # stale, retried fresh
            assert owner.connections == 2
            with pytest.raises(Lost):
                await pool.request(base, "GET", b"/c", [], b"")  # reused: it had begun answering
        finally:
            await pool.close()
            server.close()
            await server.wait_closed()
        with pytest.raises(Unreachable):
            await pool.request(base, "GET", b"/d", [], b"")

    loop_run(scenario())


def test_a_turn_committed_before_the_fence_closes_is_not_answered_refused(tmp_path):
    # The fencing deadline passes between the two writes of one /cache turn: its rows'
    # COMMIT (allowed) and its recent.json swap (refused). The client must not be told
    # "nothing was stored" about a stored turn.
    root = tmp_path / "memory"
    with LiveServer(make_settings(root, embedding_enabled=False)) as server:
        assert server.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "one"}]}).status_code == 200

        def closes_after_the_commit(path: Path) -> None:
            if Path(path).name == "recent.json":
                raise FencedWrite(path, "fencing deadline passed")

        store_fence.install(closes_after_the_commit)
        try:
            r = server.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "two"}]})
        finally:
            store_fence.install(None)
        stored = _stored_texts(root / "Lan" / "time_indexed.db")
        assert (r.status_code == 200) == ("two" in stored), (r.status_code, r.text, stored)


def _stored_texts(db_path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original")]
    finally:
        db.close()
