"""The reference launcher's lifecycle against a real nekomem: start-up gate, limited mode,
/shutdown; and ``nekomem neko`` running a N.E.K.O. install's own launcher with nekomem as its
memory server.

``tests/support/neko_standin/`` is a N.E.K.O. install laid out as the reference's current
``launcher_core`` is (its docstring names the reference files and commit it follows): port
strategy with the all-three-ports rule, ``NEKO_EVENT`` lines, ``multiprocessing`` children
started through ``run_memory_server`` and friends with their ready events, the ordered
shutdown, merged mode and the storage restart. Its own memory server logs that it started:
every test that runs N.E.K.O. through ``nekomem neko`` fails when that line appears, and the
turns the stand-in's main server sent are read back from nekomem's memory root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.support.live import ROOT, TEST_EMBEDDING_MODEL, LiveServer, ServerProcess, free_port, make_settings
from tests.support.waiting import wait_for

STANDIN = ROOT / "tests" / "support" / "neko_standin"


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


# -- nekomem neko: the install's own launcher, nekomem in its memory server's place ----------
def install_standin(tmp_path: Path) -> Path:
    """A copy of the stand-in install (tests may add files to it) and a N.E.K.O. data
    directory beside it."""
    install = tmp_path / "N.E.K.O"
    shutil.copytree(STANDIN, install, ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "data" / "config"
    config.mkdir(parents=True)
    (config / "characters.json").write_text(json.dumps({"主人": {"档案名": "Tomo"}, "猫娘": {"Lan": {}}}), encoding="utf-8")
    return install


class NekoRun:
    """``python -m nekomem neko --neko-source INSTALL`` as a child process (the stand-in runs
    on the same Python), its output in a log file, the default ports free ones of this test."""

    def __init__(self, tmp_path: Path, install: Path, ports: dict[str, int] | None = None, **env: str) -> None:
        self.root, self.data = tmp_path / "mem", tmp_path / "data"
        self.events_path = tmp_path / "standin-events.jsonl"
        self.ports = ports or default_ports()
        self.log_path = tmp_path / "neko.log"
        full_env = _env(
            HOME=str(tmp_path),
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            STANDIN_LOG=str(self.events_path),
            **{k: str(v) for k, v in self.ports.items()},
        )
        full_env.update(env)
        cmd = [sys.executable, "-m", "nekomem", "neko", "--neko-source", str(install), "--neko-python", sys.executable]
        cmd += ["--memory-root", str(self.root), "--neko-data-dir", str(self.data)]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=tmp_path, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict]:
        if not self.events_path.exists():
            return []
        rows = [json.loads(line) for line in self.events_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in rows if name is None or r["event"] == name]

    def wait_output(self, text: str, count: int = 1, timeout: float = 180) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and self.output().count(text) < count:
                raise AssertionError(f"nekomem neko exited ({self.proc.returncode}):\n{self.output()[-6000:]}")
            return self.output().count(text) >= count

        wait_for(seen, timeout=timeout, what=f"{text!r} in the output")

    def interrupt(self) -> int:
        """Ctrl+C, as a terminal sends it to nekomem neko; its exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=120)

    def __enter__(self) -> NekoRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self._log.close()
        if self.proc.poll() is not None:
            return
        # A failed test: stop it as a user would, then harder, and sweep what its launchers
        # left (each leads its own process group): nothing of it may outlive the test.
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for launcher in re.findall(r'"event": "boot_patched".*?"pid": (\d+)', self.output()):
            try:
                os.killpg(int(launcher), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def default_ports() -> dict[str, int]:
    """This test's N.E.K.O. default ports (never 48911-48915: tests run side by side)."""
    return {"NEKO_MAIN_SERVER_PORT": free_port(), "NEKO_MEMORY_SERVER_PORT": free_port(), "NEKO_TOOL_SERVER_PORT": free_port()}


RUNNING = "N.E.K.O. is running with nekomem as its memory server"


def read_back(root: Path, *paths: str) -> list[httpx.Response]:
    """``paths`` from a fresh server on the memory root another process wrote."""
    again = ServerProcess(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"})
    again.start()
    try:
        return [httpx.get(f"{again.url}{path}", timeout=30) for path in paths]
    finally:
        again.stop()


def port_answers(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        return True
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_the_launcher_runs_with_nekomem_as_its_memory_server(tmp_path: Path, start_method: str) -> None:
    """The user's launcher, with NEKO_MERGED=1 set (nekomem turns merged mode off), under
    both start methods: the memory port is nekomem with the launcher's instance id, the main
    server's turns land in nekomem's memory root, and at Ctrl+C the launcher stops main
    while nekomem still serves (its shutdown turn is stored) before nekomem."""
    install = install_standin(tmp_path)
    text = "the kettle is on the left shelf"
    with NekoRun(tmp_path, install, STANDIN_MP_START=start_method, NEKO_MERGED="1", STANDIN_TURN=text) as neko:
        neko.wait_output(RUNNING)
        wait_for(lambda: neko.events("turn"), timeout=60, what="the main server's turn")
        memory_port = neko.ports["NEKO_MEMORY_SERVER_PORT"]
        health = httpx.get(f"http://127.0.0.1:{memory_port}/health", timeout=10).json()
        assert health["server"] == "nekomem" and health["app"] == "N.E.K.O" and health["service"] == "memory"
        assert f"(instance {health['instance_id']})" in neko.output()
        assert neko.interrupt() == 0, neko.output()[-6000:]
        output = neko.output()
    assert neko.events("own_memory_server_started") == [], "the stand-in's own memory server ran: nekomem was bypassed"
    assert [e["status"] for e in neko.events("continue")] == [200]
    assert [e["status"] for e in neko.events("turn")] == [200]
    assert [e["status"] for e in neko.events("shutdown_turn")] == [200]  # main stopped first
    assert "memory root" in output and str(neko.root) in output and "from N.E.K.O." in output  # serve's banner
    assert "no model configured" in output and "set the model in N.E.K.O.'s API settings" in output
    assert not port_answers(memory_port)
    [context] = read_back(neko.root, "/new_dialog/Lan")
    assert text in context.text and "said during shutdown" in context.text


def test_a_storage_restart_starts_the_next_launcher_through_nekomem(tmp_path: Path) -> None:
    """The launcher exits for its owner to relaunch it (NEKO_OWNER_RELAUNCH): nekomem neko
    starts the next generation the same way, so it too runs on nekomem."""
    install = install_standin(tmp_path)
    with NekoRun(tmp_path, install, STANDIN_STORAGE_RESTART=str(tmp_path / "restart.json")) as neko:
        neko.wait_output(RUNNING, count=2)
        wait_for(lambda: len(neko.events("turn")) == 2, timeout=60, what="a turn from each generation")
        assert "N.E.K.O. asked for a restart" in neko.output()
        assert neko.interrupt() == 0, neko.output()[-6000:]
    assert neko.events("own_memory_server_started") == []
    assert [e["status"] for e in neko.events("turn")] == [200, 200]
    assert len(neko.events("storage_restart_requested")) == 1


def test_a_memory_port_held_by_another_program_moves_and_nekomem_serves_the_new_one(tmp_path: Path) -> None:
    """Something that is not N.E.K.O. holds the default memory port: the launcher moves that
    port (reason other_process) and nekomem serves where it moved; the ready line says so."""
    install = install_standin(tmp_path)
    ports = default_ports()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports["NEKO_MEMORY_SERVER_PORT"]))
        squatter.listen()
        with NekoRun(tmp_path, install, ports) as neko:
            neko.wait_output(RUNNING)
            wait_for(lambda: neko.events("turn"), timeout=60, what="the main server's turn")
            [turn] = neko.events("turn")
            assert turn["status"] == 200 and turn["memory_port"] != ports["NEKO_MEMORY_SERVER_PORT"]
            assert httpx.get(f"http://127.0.0.1:{turn['memory_port']}/health", timeout=10).json()["server"] == "nekomem"
            assert f"MEMORY_SERVER_PORT {ports['NEKO_MEMORY_SERVER_PORT']} -> {turn['memory_port']} (other_process)" in neko.output()
            assert f"memory server (port {turn['memory_port']})" in neko.output()
            assert neko.interrupt() == 0
    assert neko.events("own_memory_server_started") == []


def test_a_launcher_that_relaunches_itself_past_nekomem_is_stopped_with_its_next_generation(tmp_path: Path) -> None:
    """A launcher that ignores NEKO_OWNER_RELAUNCH starts its next generation by itself after a
    storage restart, past nekomem neko's watch: nekomem neko says so, exits 3 and takes that
    generation down with the launcher's process group."""
    install = install_standin(tmp_path)
    restart = str(tmp_path / "restart.json")
    with NekoRun(tmp_path, install, STANDIN_STORAGE_RESTART=restart, STANDIN_IGNORE_OWNER_RELAUNCH="1") as neko:
        assert neko.proc.wait(timeout=180) == 3, neko.output()[-6000:]
        output = neko.output()
    assert "restarts itself" in output and "NEKO_OWNER_RELAUNCH" in output
    wait_for(lambda: not any(port_answers(port) for port in neko.ports.values()), timeout=60, what="every N.E.K.O. port closed")


def test_a_launcher_that_starts_its_own_memory_server_is_stopped_with_a_message(tmp_path: Path) -> None:
    """A launcher variant that binds its server targets at import (so the replaced
    run_memory_server is never used) runs its own memory server: nekomem neko notices at
    startup_ready, says so, stops the launcher and exits 3 -- it never sits idle."""
    install = install_standin(tmp_path)
    with NekoRun(tmp_path, install, STANDIN_EARLY_TARGETS="1") as neko:
        assert neko.proc.wait(timeout=180) == 3, neko.output()[-6000:]
        output = neko.output()
    assert len(neko.events("own_memory_server_started")) == 1
    assert "nekomem was bypassed" in output and RUNNING not in output
    assert not any(port_answers(port) for port in neko.ports.values())  # the launcher was stopped


def test_another_neko_memory_service_on_the_default_port_stops_nekomem_neko(tmp_path: Path) -> None:
    """A N.E.K.O. memory service already answers on the default memory port (an old
    N.E.K.O. still running): the launcher's port_plan moves every port and would run beside
    it; nekomem neko stops with a message instead."""
    install = install_standin(tmp_path)
    ports = default_ports()
    other = _neko_service(ports["NEKO_MEMORY_SERVER_PORT"], "memory", "old-instance")
    try:
        with NekoRun(tmp_path, install, ports) as neko:
            assert neko.proc.wait(timeout=180) == 3, neko.output()[-6000:]
            output = neko.output()
    finally:
        other.shutdown()
        other.server_close()
    assert "a N.E.K.O. service already answers on" in output and "MEMORY_SERVER_PORT" in output
    assert neko.events("own_memory_server_started") == []


def _neko_service(port: int, service: str, instance_id: str) -> ThreadingHTTPServer:
    class Health(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"app": "N.E.K.O", "service": service, "status": "ok", "instance_id": instance_id}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_unsupported_launcher_layout_is_refused(tmp_path: Path) -> None:
    """An install whose launcher_core/runtime.py lacks the entries nekomem replaces and
    calls: the boot file refuses it, nothing starts, nekomem neko exits 3 and says why."""
    install = tmp_path / "N.E.K.O"
    (install / "launcher_core").mkdir(parents=True)
    (install / "launcher_core" / "__init__.py").write_text("")
    (install / "launcher_core" / "runtime.py").write_text("def start_launcher():\n    raise SystemExit('must not run')\n")
    (tmp_path / "data" / "config").mkdir(parents=True)
    with NekoRun(tmp_path, install) as neko:
        assert neko.proc.wait(timeout=120) == 3, neko.output()[-6000:]
        output = neko.output()
    assert "cannot be run with nekomem" in output and "run_memory_server" in output


def test_an_install_without_launcher_core_and_the_old_command_form_are_refused(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "launcher.py").write_text("raise SystemExit('must not run')\n")
    env = {**_env(), "PYTHONPATH": str(ROOT / "src")}
    base = [sys.executable, "-m", "nekomem", "neko", "--memory-root", str(tmp_path / "mem")]
    r = subprocess.run([*base, "--neko-source", str(tmp_path / "old")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "launcher_core/runtime.py" in r.stderr
    r = subprocess.run([*base, "--", sys.executable, "launcher.py"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is gone" in r.stderr
    assert not (tmp_path / "mem").exists()


def test_neko_refuses_to_write_into_a_python_package(tmp_path: Path) -> None:
    """Started from a N.E.K.O. source folder with no data directory, ./memory is the
    reference's ``memory`` package: nekomem stops with a clear message and writes nothing."""
    install = install_standin(tmp_path)
    (install / "memory").mkdir()
    (install / "memory" / "__init__.py").write_text("")
    env = {**_env(HOME=str(tmp_path / "home")), "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [sys.executable, "-m", "nekomem", "neko", "--neko-python", sys.executable],
        cwd=install,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Python package" in r.stderr
    assert sorted(p.name for p in (install / "memory").iterdir()) == ["__init__.py"]


# -- the model a N.E.K.O. user set in N.E.K.O. ----------------------------------------------
PROVIDERS = {
    "assist_api_providers": {
        "qwen": {"openrouter_url": "", "summary_model": "qwen-plus", "correction_model": "qwen-max", "emotion_model": "qwen-flash"},
        "free": {
            "openrouter_url": "https://lanlan.tech/text/v1",
            "summary_model": "free-model",
            "correction_model": "free-model",
            "emotion_model": "free-mini-model",
            "openrouter_api_key": "free-access",
        },
    },
    "api_key_registry": {"qwen": {"config_field": "assistApiKeyQwen"}},
}


def neko_files(tmp_path: Path, core_config: dict, assist_url: str = "http://127.0.0.1:9/v1") -> tuple[Path, Path]:
    """(install, data dir) holding the reference's config files: the install's
    config/api_providers.json and the data directory's config/core_config.json."""
    install = tmp_path / "N.E.K.O"
    (install / "config").mkdir(parents=True)
    providers = json.loads(json.dumps(PROVIDERS))
    providers["assist_api_providers"]["qwen"]["openrouter_url"] = assist_url
    (install / "config" / "api_providers.json").write_text(json.dumps(providers), encoding="utf-8")
    data = tmp_path / "data"
    (data / "config").mkdir(parents=True)
    (data / "config" / "core_config.json").write_text(json.dumps(core_config), encoding="utf-8")
    (data / "config" / "characters.json").write_text(json.dumps({"主人": {"档案名": "Tomo"}}), encoding="utf-8")
    return install, data


def test_the_assist_provider_custom_slots_and_key_fallbacks_are_read_as_neko_reads_them(tmp_path: Path) -> None:
    from nekomem.config import neko_models

    install, data = neko_files(tmp_path, {"coreApi": "qwen", "assistApi": "qwen", "coreApiKey": "sk-core", "assistApiKeyQwen": "sk-q"})
    found = neko_models.resolve(data, install)
    assert {t: (m.base_url, m.model, m.api_key) for t, m in found.tiers.items()} == {
        "summary": ("http://127.0.0.1:9/v1", "qwen-plus", "sk-q"),
        "correction": ("http://127.0.0.1:9/v1", "qwen-max", "sk-q"),
        "emotion": ("http://127.0.0.1:9/v1", "qwen-flash", "sk-q"),
    }
    assert "sk-q" not in found.describe() and "sk-q" not in repr(found)
    # No key of the provider's own: the core key, as get_core_config falls back.
    install, data = neko_files(tmp_path / "b", {"coreApi": "qwen", "coreApiKey": "sk-core"})
    assert {m.api_key for m in neko_models.resolve(data, install).tiers.values()} == {"sk-core"}
    # The free route: its profile's placeholder key; coreApi free makes assist default to free.
    install, data = neko_files(tmp_path / "c", {"coreApi": "free", "coreApiKey": "free-access"})
    free = neko_models.resolve(data, install)
    assert free.tiers["emotion"] == neko_models.TierModel("https://lanlan.tech/text/v1", "free-mini-model", "free-access")
    # Custom slots (enableCustomApi): a complete slot wins for its tier only.
    custom = {"assistApi": "qwen", "assistApiKeyQwen": "sk-q", "enableCustomApi": True, "correctionModelProvider": "custom"}
    custom |= {"correctionModelUrl": "http://127.0.0.1:8/v1", "correctionModelId": "mine", "correctionModelApiKey": "sk-mine"}
    custom |= {"emotionModelProvider": "follow_assist", "emotionModelId": "qwen-turbo"}
    install, data = neko_files(tmp_path / "d", custom)
    tiers = neko_models.resolve(data, install).tiers
    assert tiers["correction"] == neko_models.TierModel("http://127.0.0.1:8/v1", "mine", "sk-mine")
    assert tiers["emotion"] == neko_models.TierModel("http://127.0.0.1:9/v1", "qwen-turbo", "sk-q")
    assert tiers["summary"].model == "qwen-plus"
    # Without the install's providers file an assist tier cannot be resolved: said, not guessed.
    missing = neko_models.resolve(data, None)
    assert "summary" not in missing.tiers and "not found" in missing.missing["summary"]


@pytest.mark.parametrize("user_model", [False, True], ids=["from-neko", "nekomem-env-wins"])
def test_neko_serve_calls_the_model_set_in_neko_unless_nekomem_llm_says_otherwise(tmp_path: Path, fake_llm, user_model: bool) -> None:
    core = {"coreApi": "qwen", "assistApi": "qwen", "assistApiKeyQwen": "sk-assist-secret", "powerful_memory_enabled": False}
    core |= {"enableCustomApi": True, "summaryModelProvider": "custom", "summaryModelUrl": fake_llm.base_url}
    core |= {"summaryModelId": "neko-summary", "summaryModelApiKey": "sk-summary-secret"}
    install, data = neko_files(tmp_path, core, assist_url=fake_llm.base_url)
    env = _env(HOME=str(tmp_path), PYTHONPATH=str(ROOT / "src"))
    if user_model:
        env.update(NEKOMEM_LLM_BASE_URL=fake_llm.base_url, NEKOMEM_LLM_MODEL="user-model", NEKOMEM_LLM_API_KEY="sk-user-secret")
    port, log_path = free_port(), tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "nekomem", "neko-serve", "--port", str(port), "--instance-id", "inst-5"]
    cmd += ["--neko-source", str(install), "--neko-data-dir", str(data), "--memory-root", str(tmp_path / "mem")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: port_answers(port), timeout=120, what="neko-serve to listen")
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["instance_id"] == "inst-5"
        assert httpx.post(f"http://127.0.0.1:{port}/internal/storage/startup/continue", json={}, timeout=60).status_code == 200
        body = {"input_history": [{"role": "user", "content": "I keep my bike in the shed."}, {"role": "assistant", "content": "Ok"}]}
        assert httpx.post(f"http://127.0.0.1:{port}/cache/Lan", json=body, timeout=30).status_code == 200
        wait_for(lambda: fake_llm.calls("extract_facts"), timeout=60, what="a fact extraction")
        call = fake_llm.calls("extract_facts")[0]
        banner = log_path.read_text(errors="replace")
        if user_model:
            assert (call["body"]["model"], call["headers"]["authorization"]) == ("user-model", "Bearer sk-user-secret")
            assert f"summary: user-model at {fake_llm.base_url}" in banner and "NEKOMEM_LLM_* / the settings file name one" in banner
        else:
            assert (call["body"]["model"], call["headers"]["authorization"]) == ("neko-summary", "Bearer sk-summary-secret")
            assert f"summary: neko-summary at {fake_llm.base_url}" in banner and "correction: qwen-max" in banner
            assert "from N.E.K.O.   summary: neko-summary (custom API slot, custom, key set)" in banner
        assert "secret" not in banner  # no key is ever printed
        assert proc.stdin is not None
        proc.stdin.close()  # the boot file's process is gone: neko-serve stops by itself
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
