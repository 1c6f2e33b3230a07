"""One server per memory root, and a start-up that fails before it promises.

A single-node server holds ``<root>/.nekomem.lock`` exclusively: a second ``nekomem serve``,
``nekomem neko`` or an offline tool on the same root is refused with a message naming the
holder (pid, role, port) and what to do, before any banner. A port in use is reported
with its holder (a nekomem server's pid and root from its /health). Cluster nodes share a
root (shared lock), which still keeps single-node servers and offline tools out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from nekomem.actors.host import ACTORS
from nekomem.runtime.runtime import Runtime
from nekomem.stores import rootlock
from nekomem.stores.rootlock import RootLocked
from tests.support.live import ROOT, TEST_EMBEDDING_MODEL, LiveServer, ServerProcess, free_port, make_settings
from tests.support.waiting import wait_for


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["NEKOMEM_EMBEDDING_MODEL"] = TEST_EMBEDDING_MODEL
    env.update(extra)
    return env


def _nekomem(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nekomem", *args], cwd=ROOT, env=env or _env(), capture_output=True, text=True, timeout=120
    )


def _tree(root: Path) -> dict[str, bytes]:
    # Without SQLite's -shm (the WAL index, which the running first server's own readers
    # rewrite: it holds no data).
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != rootlock.LOCK_FILE and not p.name.endswith("-shm")
    }


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "memory"
    server = ServerProcess(root)
    server.start()
    try:
        r = httpx.post(server.url + "/cache/Lan", json={"input_history": [{"role": "user", "content": "the first server's fact"}]})
        assert r.status_code == 200, r.text
        yield server
    finally:
        server.stop()


def test_a_second_serve_on_a_held_root_is_refused_naming_the_holder(served: ServerProcess) -> None:
    assert served.proc is not None
    holder = json.loads((served.memory_root / rootlock.LOCK_FILE).read_text(encoding="utf-8"))
    assert holder["pid"] == served.proc.pid and holder["role"] == "serve" and holder["port"] == served.port
    assert holder["url"] == served.url and holder["started"] and holder["mode"] == "exclusive"
    before = _tree(served.memory_root)
    second = _nekomem("serve", "--port", str(free_port()), "--memory-root", str(served.memory_root))
    assert second.returncode != 0
    err = second.stderr
    assert f"pid {served.proc.pid}" in err and f"port {served.port}" in err and "serve" in err, err
    assert f"nekomem status --url {served.url}" in err and "stop it" in err, err
    assert "listening on" not in err, "the banner was printed before the refusal"
    assert "Traceback" not in err
    # Nothing of the root changed, and the first server still serves (asked last: /health
    # reads a passive character's journal, which touches its -shm).
    assert _tree(served.memory_root) == before
    assert httpx.get(served.url + "/health").status_code == 200


def test_neko_and_offline_tools_on_a_held_root_are_refused(served: ServerProcess, tmp_path: Path) -> None:
    assert served.proc is not None
    # The memory server `nekomem neko` starts inside N.E.K.O.'s launcher (neko-serve) is the
    # one that takes the root.
    neko = _nekomem(
        "neko-serve",
        "--port",
        str(free_port()),
        "--instance-id",
        "held-root-test",
        "--memory-root",
        str(served.memory_root),
        "--neko-data-dir",
        str(tmp_path / "nd"),
    )
    assert neko.returncode != 0 and f"pid {served.proc.pid}" in neko.stderr and f"port {served.port}" in neko.stderr, neko.stderr
    for args in (
        ("export-neko", str(tmp_path / "out"), "--memory-root", str(served.memory_root)),
        ("cluster", "shard-root", "--memory-root", str(served.memory_root)),
    ):
        done = _nekomem(*args)
        assert done.returncode != 0, args
        assert f"pid {served.proc.pid}" in done.stderr and f"port {served.port}" in done.stderr, done.stderr
        assert "in use by a running nekomem server" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    assert not (served.memory_root / "shards").exists()


def test_the_offline_tools_still_run_once_the_server_stopped(served: ServerProcess, tmp_path: Path) -> None:
    served.stop()
    done = _nekomem("export-neko", str(tmp_path / "out"), "--memory-root", str(served.memory_root))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "Lan").is_dir()


def test_two_runtimes_in_one_process_conflict_and_the_lock_is_released_at_stop(tmp_path: Path) -> None:
    first = Runtime(make_settings(tmp_path / "root"), actors=ACTORS)
    first.start(background=False)
    try:
        second = Runtime(make_settings(tmp_path / "root"), actors=ACTORS)
        with pytest.raises(RootLocked, match=f"serve pid {os.getpid()}"):
            second.start(background=False)
    finally:
        first.stop()
    third = Runtime(make_settings(tmp_path / "root"), actors=ACTORS)
    third.start(background=False)
    third.stop()


def test_cluster_nodes_share_a_root_that_keeps_single_node_servers_and_tools_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with rootlock.acquire(root, "shared", "cluster node n1", port=1), rootlock.acquire(root, "shared", "cluster node n2", port=2):
        with pytest.raises(RootLocked, match="in use by a running nekomem server"):
            rootlock.acquire(root, "exclusive", "serve")
        with pytest.raises(RootLocked, match="cluster node n"):
            rootlock.acquire(root, "exclusive", "cluster shard-root")
    with rootlock.acquire(root, "exclusive", "serve"):
        with pytest.raises(RootLocked, match="only one server"):
            rootlock.acquire(root, "shared", "cluster node n3")


# The Windows locker (msvcrt byte ranges) run on this platform with the same semantics:
# exclusive POSIX record locks, which conflict between processes as msvcrt's do.
_RANGE_CHILD = textwrap.dedent(
    """
    import fcntl, sys, time
    from pathlib import Path
    from nekomem.stores import rootlock

    def try_lock(fd, offset, length):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, offset)
        except OSError:
            return False
        return True

    def unlock(fd, offset, length):
        fcntl.lockf(fd, fcntl.LOCK_UN, length, offset)

    locker = rootlock.RangeLocker(try_lock, unlock)
    try:
        lock = rootlock.acquire(Path(sys.argv[1]), sys.argv[2], sys.argv[3], locker=locker)
    except rootlock.RootLocked as exc:
        print("refused:", exc, flush=True)
        sys.exit(3)
    print("held", flush=True)
    sys.stdin.readline()
    lock.release()
    """
)


class _Holder:
    def __init__(self, root: Path, mode: str, role: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _RANGE_CHILD, str(root), mode, role],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.first = self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
        self.proc.wait(timeout=30)


def test_the_windows_byte_range_locker_gives_shared_and_exclusive(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = _Holder(root, "shared", "cluster node a")
    b = _Holder(root, "shared", "cluster node b")
    try:
        assert a.first == "held" and b.first == "held"
        refused = _Holder(root, "exclusive", "serve")
        assert refused.first.startswith("refused:") and "cluster node" in refused.first
        refused.close()
    finally:
        a.close()
        b.close()
    sole = _Holder(root, "exclusive", "serve")
    try:
        assert sole.first == "held"
        for mode in ("shared", "exclusive"):
            other = _Holder(root, mode, "export-neko")
            assert other.first.startswith("refused:") and f"pid {sole.proc.pid}" in other.first
            other.close()
    finally:
        sole.close()


def test_a_port_in_use_is_refused_before_the_banner_naming_the_nekomem_server_on_it(served: ServerProcess, tmp_path: Path) -> None:
    assert served.proc is not None
    # A server loading its embedding model can be slow to answer on a busy machine: probe
    # it once it has loaded (the message for a silent port is tested below).
    wait_for(lambda: httpx.get(served.url + "/health").json()["embeddings"]["state"] != "loading", timeout=180, what="the embeddings")
    other = tmp_path / "other-root"
    done = _nekomem("serve", "--port", str(served.port), "--memory-root", str(other))
    assert done.returncode != 0
    err = done.stderr
    assert "listening on" not in err and "Errno" not in err and "Traceback" not in err, err
    assert f"port {served.port}" in err and "already in use by a nekomem server" in err, err
    assert f"pid {served.proc.pid}" in err and f"memory root {served.memory_root.resolve()}" in err, err
    assert "--port" in err and "nekomem status" in err
    # The refused server let go of its root: another server may take it now.
    holder = ServerProcess(other)
    holder.start()
    holder.stop()


def test_a_port_in_use_by_a_tokened_server_withholds_its_root(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "tokened", env={"NEKOMEM_API_TOKEN": "s3cret"})
    server.start()
    try:
        done = _nekomem("serve", "--port", str(server.port), "--memory-root", str(tmp_path / "mine"))
        assert done.returncode != 0 and "already in use by a nekomem server" in done.stderr, done.stderr
        assert str(tmp_path / "tokened") not in done.stderr and "withheld" in done.stderr
    finally:
        server.stop()


def test_a_port_in_use_by_another_program(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        done = _nekomem("serve", "--port", str(port), "--memory-root", str(tmp_path / "m"))
    assert done.returncode != 0 and f"port {port}" in done.stderr and "did not answer GET /health" in done.stderr, done.stderr
    assert "listening on" not in done.stderr


def test_health_with_a_token_names_no_character_unless_the_token_is_given(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with LiveServer(settings) as srv:
        assert srv.post("/cache/Lanzhou", json={"input_history": [{"role": "user", "content": "hello"}]}).status_code == 200
        claim = {"derived_task_claim_token": "t", "derived_task_claim_generation": "0"}
        assert srv.post("/release_character/Lanzhou", params=claim).status_code == 200
    db = tmp_path / "Lanzhou" / "time_indexed.db"
    for side in ("-wal", "-shm"):
        Path(f"{db}{side}").unlink(missing_ok=True)
    db.write_bytes(b"")  # damaged: reported in /health's damaged_journals
    with LiveServer(make_settings(tmp_path, api_token="s3cret")) as srv:
        auth = {"Authorization": "Bearer s3cret"}
        assert srv.get("/api/characters/Lanzhou/recent", headers=auth).status_code == 200
        open_answer = srv.get("/health")
        assert open_answer.status_code == 200
        assert "Lanzhou" not in open_answer.text and str(tmp_path) not in open_answer.text, open_answer.text
        body = open_answer.json()
        assert body["names_withheld"] is True and body.get("pid") is None and body.get("memory_root") is None
        assert body["storage"]["state"] == "journal_damaged" and len(body["storage"]["damaged_journals"]) == 1
        full = srv.get("/health", headers=auth).json()
        assert [d["character"] for d in full["storage"]["damaged_journals"]] == ["Lanzhou"]
        assert full["pid"] == os.getpid() and full["memory_root"] == str(tmp_path.resolve())
        assert srv.get("/health", headers={"Authorization": "Bearer wrong"}).json()["names_withheld"] is True
