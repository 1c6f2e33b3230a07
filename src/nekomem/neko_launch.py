"""``nekomem neko [-- COMMAND ...]``: run nekomem as the memory server of a N.E.K.O. install.

How the reference's ``launcher.py`` picks its memory server (read from its code): it draws
an instance id (``NEKO_INSTANCE_ID`` when its parent set one, else a new one, exported to
every child), then probes each default port (memory 48912, agent 48915, main 48911). A port
it cannot bind is probed with ``GET /health``; when the answer's ``app`` is ``"N.E.K.O"`` the
port is taken as an existing N.E.K.O. service and that server is *not* started (the rest
are). Anything else on the port makes it move the port and start its own memory server.

So nekomem takes the memory server's place by being there first, answering the probe as
N.E.K.O. does: this command exports (or inherits) ``NEKO_INSTANCE_ID``, serves on
``NEKO_MEMORY_SERVER_PORT`` (else the ``port`` setting, 48912) with ``/shutdown`` enabled
and the N.E.K.O. data directory discovered (see :mod:`nekomem.config.neko_data`), and, when
given a COMMAND (the launcher), starts it once the server is ready, with the same instance
id in its environment (and ``NEKO_MERGED=0`` unless set: the launcher's merged mode, the
default of packaged builds, starts every app in one process and never skips the memory
server). The launcher's main server then calls
``/internal/storage/startup/continue``, sends its traffic, and at its own shutdown posts
``/shutdown``, which stops nekomem gracefully.

Lifetime: the COMMAND runs in its own session (POSIX), so a terminal's Ctrl+C reaches
nekomem only; nekomem forwards it (SIGINT; SIGTERM as SIGTERM) to the launcher (on Windows
the launcher shares the console and gets the Ctrl+C itself) and keeps
serving while the launcher shuts its servers down (the reference's order: main before
memory). nekomem stops when the launcher exits or when /shutdown arrives, and waits up to
``neko_stop_grace_seconds`` for the launcher before terminating it. A second signal stops
nekomem at once. The exit status is the COMMAND's (0 without one).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import FrameType

import uvicorn

from nekomem.config import SettingsError, load_settings

log = logging.getLogger("nekomem.neko")

INSTANCE_ENV = "NEKO_INSTANCE_ID"
PORT_ENV = "NEKO_MEMORY_SERVER_PORT"
MERGED_ENV = "NEKO_MERGED"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the ``neko`` subcommand on the CLI's subparsers."""
    neko = sub.add_parser("neko", help="serve as the memory server of a N.E.K.O. install; optionally start its launcher after --")
    neko.add_argument("--port", type=int, help=f"port (default ${PORT_ENV}, else the port setting, 48912)")
    neko.add_argument("--memory-root", help="data folder (default ./memory, env NEKOMEM_MEMORY_ROOT)")
    neko.add_argument("--neko-data-dir", help="the N.E.K.O. data directory (default: found where N.E.K.O. keeps it)")
    neko.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    neko.add_argument("launcher", nargs=argparse.REMAINDER, help="-- then the command that starts N.E.K.O. (e.g. python launcher.py)")


def _port(args: argparse.Namespace) -> int | None:
    if args.port is not None:
        return int(args.port)
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise SettingsError(f"{PORT_ENV}={raw!r} is not a port number")
    return port


class _Child:
    """The launcher COMMAND, started once the server serves, and how nekomem ends with it."""

    def __init__(self, command: list[str], server: uvicorn.Server, grace: float) -> None:
        self.command = command
        self.server = server
        self.grace = grace
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled = False

    def start_when_ready(self, ready: threading.Event) -> None:
        """Start the command once ``ready`` is set (server up, recovery over), then stop
        the server when the command exits."""
        ready.wait()
        if self.server.should_exit:
            return
        env = dict(os.environ)
        env[PORT_ENV] = str(self.server.config.port)
        # Packaged builds default to the launcher's merged mode, which starts all three
        # apps in one process without checking for an existing memory server (its bind
        # would fail); the multi-process mode skips a port held by a N.E.K.O. service.
        env.setdefault(MERGED_ENV, "0")
        log.info("starting the N.E.K.O. launcher")
        try:
            self.proc = subprocess.Popen(self.command, env=env, start_new_session=os.name == "posix")
        except OSError as exc:
            log.error("the launcher command could not start: %s", exc)
            self.server.should_exit = True
            return
        code = self.proc.wait()
        log.info("the N.E.K.O. launcher exited with %s; stopping", code)
        self.server.should_exit = True

    def handle_signal(self, sig: int, frame: FrameType | None) -> None:
        """First signal: forward it to the launcher and keep serving until it exits (or
        the grace runs out). Without a live launcher, or on a second signal: stop now."""
        proc = self.proc
        if proc is None or proc.poll() is not None or self.signalled:
            self.server.should_exit = True
            if proc is not None and proc.poll() is None:
                proc.terminate()
            return
        self.signalled = True
        if os.name == "posix":
            log.info("forwarding signal %d to the N.E.K.O. launcher", sig)
            proc.send_signal(signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM)
        # Elsewhere the launcher shares nekomem's console and got the Ctrl+C itself.
        timer = threading.Timer(self.grace, self._give_up)
        timer.daemon = True
        timer.start()

    def _give_up(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            log.warning("the N.E.K.O. launcher did not exit in %.0f s; terminating it", self.grace)
            proc.terminate()
        self.server.should_exit = True

    def finish(self) -> int:
        """After the server stopped: wait for the launcher (up to the grace), then end it."""
        proc = self.proc
        if proc is None:
            return 0
        try:
            return proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                return proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()


def main(args: argparse.Namespace) -> int:
    """Run ``nekomem neko``; the exit status (the launcher's, 0 without one, 2 on bad settings)."""
    from nekomem.cli import make_embeddings
    from nekomem.http.app import create_app
    from nekomem.http.runtime_access import app_runtime
    from nekomem.serving import StartupRefused, build_server, claim, startup_refusal

    instance_id = os.environ.get(INSTANCE_ENV, "").strip() or uuid.uuid4().hex
    os.environ[INSTANCE_ENV] = instance_id  # inherited by the launcher and its servers
    command = list(args.launcher)
    if command and command[0] == "--":
        command = command[1:]
    try:
        overrides: dict[str, object] = {
            "memory_root": args.memory_root,
            "port": _port(args),
            "instance_id": instance_id,
            "shutdown_enabled": True,
            "neko_data_dir": args.neko_data_dir,
        }
        settings = load_settings(args.config, overrides=overrides)
        if not settings.server.neko_data_dir:
            settings = load_settings(args.config, overrides={**overrides, "neko_data_dir": "auto"})
    except SettingsError as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 2
    root = Path(settings.server.memory_root).expanduser()
    if (root / "__init__.py").is_file():
        # Run from a N.E.K.O. source folder with no data directory found, ./memory is its
        # Python package: never write characters into it.
        print(f"nekomem: {root} is a Python package (N.E.K.O.'s source); choose a memory root with --memory-root", file=sys.stderr)
        return 2
    refusal = startup_refusal(settings)
    if refusal is not None:
        print(f"nekomem: {refusal}", file=sys.stderr)
        return 2
    app = create_app(settings, embeddings=make_embeddings(settings))
    app_runtime(app).lock_role = "neko"
    try:
        sock = claim(app, settings)  # the root's lock, then the port, before anything starts
    except StartupRefused as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 1
    server = build_server(app, settings)
    child = _Child(command, server, settings.server.neko_stop_grace_seconds) if command else None
    if child is not None:
        server.handle_exit = child.handle_signal  # type: ignore[method-assign]
        ready = threading.Event()

        def wait_ready() -> None:
            # server.started flips once the socket listens; recovery may still run.
            while not server.started and not server.should_exit:
                threading.Event().wait(0.05)
            app_runtime(app).wait_ready(settings.server.startup_continue_wait_seconds)
            ready.set()

        threading.Thread(target=wait_ready, name="nekomem-neko-ready", daemon=True).start()
        threading.Thread(target=child.start_when_ready, args=(ready,), name="nekomem-neko-launcher", daemon=True).start()
    log.info("starting as the N.E.K.O. memory server on port %d (instance %s)", settings.server.port, instance_id)
    server.run(sockets=[sock])
    return child.finish() if child is not None else 0
