"""Real servers for tests: uvicorn in a thread (shares objects such as a ManualClock with
the test) or ``python -m nekomem serve`` in a subprocess (for kill tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from nekomem.config import Settings, load_settings
from nekomem.domain.layers import layer_settings
from nekomem.http.connections import uvicorn_options
from nekomem.server.app import create_app
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


# The suite runs the fast embedding model its real-model tests were written against (and
# that model's profile thresholds); tests/test_e5_model.py covers e5 and the pair, and the
# benches pass the model they measure.
TEST_EMBEDDING_MODEL = "use"


def make_settings(memory_root: Path, **overrides: Any) -> Settings:
    """Settings for a test: defaults, this memory root, port 0, no environment, and the
    TEST_EMBEDDING_MODEL (unless overridden). In-process servers share the test process's
    interpreter, so they keep Python's own garbage collection rule (the scheduled full
    collections are tested in test_collector.py and run in every subprocess server)."""
    values: dict[str, Any] = {
        "memory_root": str(memory_root),
        "port": 0,
        "embedding_model": TEST_EMBEDDING_MODEL,
        "gc_full_collection_seconds": 0,
    }
    values.update(overrides)
    return load_settings(None, env={}, overrides=values, layers=layer_settings())


class LiveServer:
    """uvicorn serving a fresh app on 127.0.0.1 and an ephemeral port, in a thread."""

    def __init__(self, settings: Settings, **app_kwargs: Any) -> None:
        self.settings = settings
        self.app = create_app(settings, **app_kwargs)
        self.runtime = self.app.state.runtime
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            access_log=False,
            **uvicorn_options(settings.server),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""
        self.client: httpx.Client | None = None

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.url, timeout=60)
        assert self.runtime.wait_ready(20), "start-up recovery did not finish"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.client is not None:
            self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=30)

    # conveniences
    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.client.post(path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.client.get(path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.client.patch(path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.client.delete(path, **kwargs)

    def wait_vectors(self, name: str, timeout: float = 180.0) -> None:
        """Wait until every vector of the entries stored so far is computed (``/health``
        counts them as pending from each write's acknowledgement on). ``name`` is kept for
        the callers. Raises AssertionError after ``timeout``."""
        wait_for(lambda: self.get("/health").json()["embeddings"]["pending"] == 0, timeout=timeout, what="the vectors")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``python -m nekomem serve`` as a child process, for tests that kill it."""

    def __init__(
        self,
        memory_root: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        host: str | None = None,
        preexec_fn: Any = None,
    ) -> None:
        self.memory_root = memory_root
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. a lower RLIMIT_NOFILE)
        self.host = host
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
        self.env.update(env or {})
        self.env.setdefault("NEKOMEM_EMBEDDING_MODEL", TEST_EMBEDDING_MODEL)
        self.proc: subprocess.Popen[bytes] | None = None
        # The server's log goes to a file, never to a pipe nobody reads (a full pipe would
        # block the server inside a log call).
        self.log_path = memory_root.parent / f"{memory_root.name}-server-{self.port}.log"

    def command(self) -> list[str]:
        """The command line that starts the server (``--host`` only when one was given)."""
        cmd = [sys.executable, "-m", "nekomem", "serve", "--port", str(self.port), "--memory-root", str(self.memory_root)]
        return cmd + (["--host", self.host] if self.host else [])

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=self.preexec_fn,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.log_path.read_text(errors="replace")[-4000:])
            try:
                health = httpx.get(self.url + "/health", timeout=1).json()
                if not health["limited_mode"]:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        self.stop()  # not left running behind a failed test
        raise RuntimeError("server did not become ready")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL when the server has not exited after ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
