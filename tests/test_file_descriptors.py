"""Issue 28, item 5, on real server processes: the active set is sized from the open-file
limit (RLIMIT_NOFILE, lowered for the child with preexec_fn / prlimit), and running out of
file descriptors is reported as such, not as a read-only disk."""

from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path

import httpx

from nekomem.runtime.fdlimit import FDS_PER_CHARACTER
from nekomem.stores.faults import TOO_MANY_FILES, classify
from tests.support.live import ServerProcess
from tests.support.waiting import wait_for


def _turn(text: str) -> dict:
    return {"input_history": [{"role": "user", "content": text}]}


def _limit(n: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply


def test_the_active_set_fits_a_low_open_file_limit(tmp_path: Path) -> None:
    env = {"NEKOMEM_MAX_CONNECTIONS": "32", "NEKOMEM_FD_RESERVE": "128", "NEKOMEM_LOG_LEVEL": "WARNING"}
    srv = ServerProcess(tmp_path / "memory", env=env, preexec_fn=_limit(350))
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            files = client.get("/health").json()["files"]
            assert files["soft_limit"] == 350 and files["hard_limit"] == 350  # the hard limit cannot be passed
            bound = (350 - 128 - 32) // FDS_PER_CHARACTER
            assert files["max_active_characters"] == bound
            # Twice as many characters as fit: each is answered, older idle ones are passivated.
            for i in range(2 * bound):
                answer = client.post(f"/cache/C{i}", json=_turn(f"hello {i}"))
                assert answer.status_code == 200, (i, answer.text)
            health = client.get("/health").json()
            assert health["active_characters"] <= bound
            assert health["storage"]["state"] == "ok", health["storage"]
            assert 0 < health["files"]["open"] < 350
    finally:
        srv.stop()


def test_the_soft_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    soft = min(512, hard)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    srv = ServerProcess(tmp_path / "memory", env={"NEKOMEM_LOG_LEVEL": "WARNING"}, preexec_fn=lower)
    srv.start()
    try:
        files = httpx.get(srv.url + "/health", timeout=30).json()["files"]
        assert files["soft_limit"] == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        srv.stop()


def test_running_out_of_file_descriptors_is_its_own_fault(tmp_path: Path) -> None:
    # The limit is cut under a running server (prlimit on its pid), below what its active
    # set was sized for: the new characters meet EMFILE.
    srv = ServerProcess(tmp_path / "memory", env={"NEKOMEM_LOG_LEVEL": "WARNING"})
    srv.start()
    try:
        assert srv.proc is not None
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            assert client.post("/cache/First", json=_turn("hello")).status_code == 200
            open_now = client.get("/health").json()["files"]["open"]
            hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (open_now + 12, hard))  # the soft limit only
            codes = [client.post(f"/cache/N{i}", json=_turn("hi")) for i in range(12)]
            refused = [a for a in codes if a.status_code != 200]
            assert refused, "the lowered limit was never met"
            for answer in refused:
                assert answer.status_code == 503, answer.text
                assert answer.json()["error_code"] == TOO_MANY_FILES.code
                assert int(answer.headers["retry-after"]) > 0
            health = client.get("/health").json()
            assert health["storage"]["state"] == TOO_MANY_FILES.code
            assert health["storage"]["read_only"] is False
            # Once files can be opened again, everything is served, with nothing marked failed.
            resource.prlimit(srv.proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
            assert client.post("/cache/First", json=_turn("after")).status_code == 200
            for i in range(12):
                assert client.post(f"/cache/N{i}", json=_turn("after")).status_code == 200
            assert client.get("/health").json()["supervision"]["failed_children"] == 0
            try:
                wait_for(lambda: client.get("/health").json()["storage"]["state"] == "ok", timeout=20, what="storage ok again")
            except AssertionError:
                raise AssertionError(str(client.get("/health").json()["storage"])) from None
    finally:
        srv.stop()


def test_emfile_is_classified_apart_from_a_read_only_disk() -> None:
    assert classify(OSError(24, "Too many open files")) is TOO_MANY_FILES
    assert classify(OSError(23, "Too many open files in system")) is TOO_MANY_FILES
