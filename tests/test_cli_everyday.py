"""The commands a person types: ``make serve`` honours the settings file and the NEKOMEM_*
variables (the Makefile adds no flags of its own), the start-up banner, ``nekomem
--version``, ``nekomem status`` and ``serve --log-level``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nekomem import __version__
from nekomem.cli.main import build_parser
from tests.support.live import ROOT, free_port

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(NEKOMEM_EMBEDDING_ENABLED="false", **extra)
    return env


def fake_install(tmp: Path) -> list[str]:
    """Make variables for a venv whose stamps and models are already there, so ``make serve``
    goes straight to the command it runs (with this interpreter)."""
    venv = tmp / "venv"
    venv.mkdir()
    models = []
    for name in ("use.onnx", "e5.onnx"):
        (tmp / name).write_bytes(b"")
        models.append(tmp / name)
    for stamp in (".nekomem-serve-installed", ".nekomem-installed"):
        (venv / stamp).touch()
    return [f"VENV={venv}", f"PY={sys.executable}", f"MODEL={models[0]}", f"E5_MODEL={models[1]}"]


def wait_health(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError("make serve exited: " + log.read_text(errors="replace")[-3000:])
        try:
            health = httpx.get(url + "/health", timeout=1).json()
            if not health["limited_mode"]:  # start-up recovery is over
                return health
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("make serve did not answer on " + url + ": " + log.read_text(errors="replace")[-3000:])


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.parametrize("source", ["toml", "env"])
def test_make_serve_takes_port_and_memory_root_from_the_settings(tmp_path, source):
    port = free_port()
    root = tmp_path / "mem"
    if source == "toml":
        config = tmp_path / "nekomem.toml"
        config.write_text(f'port = {port}\nmemory_root = "{root}"\n', encoding="utf-8")
        env = clean_env(NEKOMEM_CONFIG=str(config))
    else:
        env = clean_env(NEKOMEM_PORT=str(port), NEKOMEM_MEMORY_ROOT=str(root))
    env["PORT"] = "1"  # a PORT in the environment is not the make variable PORT=...
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "-C", str(ROOT), "serve", *fake_install(tmp_path)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make and the server it starts stop together
        )
    try:
        url = f"http://127.0.0.1:{port}"
        health = wait_health(url, proc, log)
        assert health["service"] == "memory"
        assert httpx.post(url + "/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert (root / "Lan" / "time_indexed.db").is_file()
        # `nekomem status` reads the same settings for its default URL.
        status = subprocess.run([sys.executable, "-m", "nekomem", "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert f"nekomem {__version__}: ok" in status.stdout and "not configured" in status.stdout
    finally:
        stop(proc)
    text = log.read_text(errors="replace")
    assert "-m nekomem serve\n" in text  # the command make ran: no flags of its own
    assert f"listening on    {url}" in text and f"memory browser  {url}/ui" in text
    assert f"memory root     {root}" in text and "no model configured" in text


def test_make_serve_flags_win_when_given(tmp_path):
    port = free_port()
    config = tmp_path / "nekomem.toml"
    config.write_text(f'port = {free_port()}\nmemory_root = "{tmp_path / "ignored"}"\n', encoding="utf-8")
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), "serve", *fake_install(tmp_path), f"PORT={port}", f"CONFIG={config}"],
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1].endswith(f"-m nekomem serve --port '{port}' --config '{config}'")


def test_version_and_log_level():
    out = subprocess.run([sys.executable, "-m", "nekomem", "--version"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"nekomem {__version__}"
    assert build_parser().parse_args(["serve", "--log-level", "debug"]).log_level == "DEBUG"
    bad = subprocess.run(
        [sys.executable, "-m", "nekomem", "serve", "--log-level", "loud"], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--log-level" in bad.stderr


def test_status_of_a_server_that_is_not_running():
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "nekomem", "status", "--url", url, "--timeout", "2"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and f"the server at {url} is not reachable" in out.stderr and "Traceback" not in out.stderr
