"""The reference launcher's lifecycle against a real nekomem: start-up gate, limited mode,
/shutdown, and the whole launcher sequence replayed by a child of ``nekomem neko``.

``tests/support/neko_launcher_replay.py`` plays the launcher and main server in the order of
their code (port probe, continue, traffic, shutdown, monitor loop); here it runs as the
COMMAND of a real ``python -m nekomem neko`` process, and what it wrote is read back by a
second server on the same memory root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.support.live import ROOT, TEST_EMBEDDING_MODEL, LiveServer, ServerProcess, free_port, make_settings
from tests.support.waiting import wait_for

REPLAY = ROOT / "tests" / "support" / "neko_launcher_replay.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEKOMEM_", "NEKO_"))}
    env.update(NEKOMEM_EMBEDDING_MODEL=TEST_EMBEDDING_MODEL, NEKOMEM_EMBEDDING_ENABLED="false", HOME=extra.pop("HOME", "/nonexistent"))
    env.update(extra)
    return env


# -- the gate's semantics, in process ------------------------------------------------------
def test_continue_block_and_limited_mode(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        assert srv.post("/internal/storage/startup/continue").json() == {"ok": True, "initialized": False}
        assert srv.post("/internal/storage/startup/continue", json={"reason": "x"}).json() == {"ok": True, "initialized": False}
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "one"}]}).status_code == 200

        blocked = srv.post("/internal/storage/startup/block", json={"reason": "storage_selection:main_server_init_failed"})
        assert blocked.json() == {"ok": True, "limited_mode": True, "reason": "storage_selection:main_server_init_failed"}
        refused = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "two"}]})
        assert refused.status_code == 409
        body = refused.json()
        assert body["ok"] is False and body["error_code"] == "storage_startup_blocked" and body["limited_mode"] is True
        assert body["blocking_reason"] == "storage_startup_blocked_after_init"
        assert srv.get("/new_dialog/Lan").status_code == 409
        health = srv.get("/health").json()
        assert health["limited_mode"] is True and health["app"] == "N.E.K.O" and health["service"] == "memory"
        assert health["status"] == "starting"  # the reference says "ok"; its launcher looks at "app" only
        # The allow-list stays reachable; shutdown is off in this server.
        assert srv.post("/shutdown").json()["status"] == "shutdown_disabled"
        assert srv.post("/internal/storage/startup/block").json() == {"ok": True, "limited_mode": True, "reason": ""}
        activate = srv.post("/internal/storage/startup/activate", json={"reason": "x"})
        assert activate.status_code == 409 and activate.json()["ok"] is False  # not while blocked

        assert srv.post("/internal/storage/startup/continue", content=b"null", headers={"content-type": "application/json"}).json() == {
            "ok": True,
            "initialized": False,
        }
        assert srv.get("/health").json()["limited_mode"] is False
        # The newest reference's second step, after its own initialisation.
        assert srv.post("/internal/storage/startup/activate", json={"reason": "x"}).json() == {"ok": True}
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "three"}]}).status_code == 200
        text = srv.get("/new_dialog/Lan").text
        assert "one" in text and "three" in text and "two" not in text  # the refused write stored nothing


def test_continue_is_refused_while_the_storage_cannot_serve(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        # The state start-up recovery leaves when the memory root cannot be listed.
        srv.runtime.limited_reason = "storage_recovery_failed"
        r = srv.post("/internal/storage/startup/continue", json={"reason": "x"})
        assert r.status_code == 409
        body = r.json()
        assert body["ok"] is False and body["error_code"] == "storage_startup_blocked"
        assert body["blocking_reason"] == "storage_recovery_failed"  # what the chat server reports
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]}).status_code == 409
        srv.runtime.limited_reason = None


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [(b"[1]", 422, "body_not_object"), (b"{", 400, "malformed_json"), (b'{"reason": 3}', 422, "schema_violation")],
)
def test_a_bad_gate_body_gets_a_clear_error_and_changes_nothing(tmp_path: Path, body: bytes, status: int, code: str) -> None:
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        r = srv.post("/internal/storage/startup/block", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status and r.json()["error_code"] == code
        assert srv.get("/health").json()["limited_mode"] is False


def test_shutdown_without_a_host_hook_says_so(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, embedding_enabled=False, shutdown_enabled=True)) as srv:
        # LiveServer runs uvicorn itself and registers no stop hook: an honest error, no exit.
        assert srv.post("/shutdown").json()["status"] == "error"
        assert srv.get("/health").status_code == 200


# -- a real process ------------------------------------------------------------------------
class ShutdownServer(ServerProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--enable-shutdown"]


def test_serve_enable_shutdown_stops_gracefully_and_keeps_every_turn(tmp_path: Path) -> None:
    root = tmp_path / "mem"
    server = ShutdownServer(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"})
    server.start()
    try:
        for i in range(20):
            r = httpx.post(f"{server.url}/cache/Lan", json={"input_history": [{"role": "user", "content": f"turn {i}"}]}, timeout=30)
            assert r.status_code == 200
        r = httpx.post(f"{server.url}/shutdown", timeout=30)
        assert r.json() == {"status": "shutdown_signal_received"}
        assert server.proc is not None
        assert server.proc.wait(timeout=60) == 0  # a clean exit, not a signal
    finally:
        server.stop()
    journal, context = read_back(root, "/api/browse/Lan/journal?limit=100", "/new_dialog/Lan")
    assert journal.json()["total"] == 20
    assert "turn 0" in context.text and "turn 19" in context.text


class Neko:
    """``python -m nekomem neko --port P --memory-root R [-- COMMAND]`` as a child process,
    its output in a log file; killed at exit if still running."""

    def __init__(self, tmp_path: Path, command: list[str] | None = None, **env: str) -> None:
        self.root, self.port = tmp_path / "mem", free_port()
        self.log_path = tmp_path / "neko.log"
        cmd = [sys.executable, "-m", "nekomem", "neko", "--port", str(self.port), "--memory-root", str(self.root)]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*cmd, *(["--", *command] if command else [])], cwd=ROOT, env=_env(**env), stdout=self._log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> Neko:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


def read_back(root: Path, *paths: str) -> list[httpx.Response]:
    """``paths`` from a fresh server on the memory root another process wrote."""
    again = ServerProcess(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"})
    again.start()
    try:
        return [httpx.get(f"{again.url}{path}", timeout=30) for path in paths]
    finally:
        again.stop()


def test_the_launcher_sequence_replayed_against_nekomem_neko(tmp_path: Path) -> None:
    name, text = "Neko (cat)", "the kettle is on the left shelf"
    with Neko(tmp_path, [sys.executable, str(REPLAY), name, text]) as neko:
        code = neko.proc.wait(timeout=180)
        assert code == 0, neko.output()[-4000:]
        assert "replay: ok" in neko.output()
    context, journal = read_back(neko.root, f"/new_dialog/{quote(name, safe='')}", f"/api/browse/{quote(name, safe='')}/journal")
    assert text in context.text
    assert journal.json()["total"] == 2


WAIT_FOR_SIGINT = """
import json, os, signal, sys, threading, urllib.request
port = os.environ["NEKO_MEMORY_SERVER_PORT"]
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *_: stop.set())
print("child-ready", flush=True)
stop.wait(120)
# The launcher's shutdown: the memory server still serves while main cleans up.
r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/cache/Lan", method="POST",
    data=json.dumps({"input_history": [{"role": "user", "content": "said during shutdown"}]}).encode(),
    headers={"Content-Type": "application/json"}), timeout=30)
sys.exit(0 if json.loads(r.read())["status"] == "cached" else 3)
"""


def test_ctrl_c_reaches_the_launcher_first_and_nekomem_serves_until_it_exits(tmp_path: Path) -> None:
    with Neko(tmp_path, [sys.executable, "-c", WAIT_FOR_SIGINT]) as neko:
        wait_for(lambda: "child-ready" in neko.output(), timeout=120, what="the launcher child")
        neko.proc.send_signal(signal.SIGINT)
        assert neko.proc.wait(timeout=120) == 0, neko.output()[-4000:]
    [context] = read_back(neko.root, "/new_dialog/Lan")
    assert "said during shutdown" in context.text


def test_health_reports_the_inherited_instance_id(tmp_path: Path) -> None:
    with Neko(tmp_path, NEKO_INSTANCE_ID="launcher-instance-7") as neko:

        def health() -> dict | None:
            try:
                return httpx.get(f"http://127.0.0.1:{neko.port}/health", timeout=2).json()
            except httpx.HTTPError:
                return None

        body = wait_for(health, timeout=120, what="nekomem neko to serve")
        assert body["instance_id"] == "launcher-instance-7" and body["app"] == "N.E.K.O" and body["service"] == "memory"
        assert httpx.post(f"http://127.0.0.1:{neko.port}/shutdown", timeout=30).json()["status"] == "shutdown_signal_received"
        assert neko.proc.wait(timeout=60) == 0


def test_neko_refuses_to_write_into_a_python_package(tmp_path: Path) -> None:
    """Started from a N.E.K.O. source folder with no data directory, ./memory is the
    reference's ``memory`` package: nekomem stops with a clear message and writes nothing."""
    source = tmp_path / "N.E.K.O-src"
    (source / "memory").mkdir(parents=True)
    (source / "memory" / "__init__.py").write_text("")
    env = {**_env(), "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable, "-m", "nekomem", "neko", "--port", str(free_port())],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Python package" in r.stderr
    assert sorted(p.name for p in (source / "memory").iterdir()) == ["__init__.py"]
