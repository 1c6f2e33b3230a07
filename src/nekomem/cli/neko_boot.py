"""Run a N.E.K.O. install's own launcher with nekomem as its memory server.

``nekomem neko`` runs this file *by path* with the N.E.K.O. install's Python, in the
install's folder: ``<neko python> cli/neko_boot.py <install dir>``. It uses the standard
library only (nekomem is not installed in N.E.K.O.'s environment) and imports nothing of
nekomem. It:

1. imports the install's ``launcher_core.runtime`` (the launcher's code since the
   ``launcher.py`` facade; see docs/NEKO.md for the commit read) and refuses, with a
   ``NEKOMEM_EVENT boot_refused`` line and exit status 3, a layout it does not know;
2. replaces ``runtime.run_memory_server`` -- the target ``start_server`` hands to
   ``multiprocessing.Process`` for the ``memory_server`` module -- with
   :func:`run_memory_server` below, which starts nekomem (the command in
   ``NEKOMEM_NEKO_SERVE``) on the port and instance id the launcher chose, and signals the
   launcher's events as its own memory server does;
3. points ``runtime._build_launcher_relaunch_command`` (when present) at this file, so a
   launcher that restarts itself after a storage change still comes back through it;
4. calls ``runtime.start_launcher()``, the launcher's own entry, unchanged otherwise.

Under the ``spawn`` start method (macOS, Windows) the child re-imports this file as
``__mp_main__`` and unpickles :func:`run_memory_server` from it; under ``fork`` (Linux) it
inherits the patched module. Merged mode (every app in one process, the default of frozen
builds) loads the reference's memory app in process, so ``nekomem neko`` sets
``NEKO_MERGED=0``; the launcher honours it (``_should_use_merged_mode``).
"""

from __future__ import annotations

import os
import sys

# Run by path, Python put this file's folder (nekomem's package folder, with its own
# ``config`` and ``http`` packages) first on sys.path: neither the standard library's
# ``http`` nor N.E.K.O.'s ``config`` may resolve to them, so the path is cleaned before any
# other import. Forked and spawned children inherit the cleaned path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import importlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from typing import Any  # noqa: E402

SERVE_ENV = "NEKOMEM_NEKO_SERVE"
EVENT_PREFIX = "NEKOMEM_EVENT"
REFUSED_STATUS = 3
HEALTH_POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0  # within the launcher's 12 s budget for the memory server


def emit(event: str, **payload: Any) -> None:
    """One machine-readable line on stdout, read by ``nekomem neko``."""
    print(f"{EVENT_PREFIX} {json.dumps({'event': event, 'payload': payload}, ensure_ascii=True)}", flush=True)


def _health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


def _post_shutdown(port: int) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/shutdown", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            resp.read()
    except (OSError, urllib.error.URLError):
        pass  # already gone, or going: the wait below decides


def _runtime() -> Any:
    return sys.modules.get("launcher_core.runtime") or importlib.import_module("launcher_core.runtime")


def run_memory_server(ready_event: Any, import_event: Any = None, shutdown_event: Any = None, shutdown_complete_event: Any = None) -> None:
    """The memory server's process, as the launcher's ``run_memory_server`` is: the same
    signal policy and config reload, ``import_event`` and ``ready_event`` once nekomem
    answers ``/health`` as this instance's memory service, a graceful stop when
    ``shutdown_event`` is set (or SIGTERM arrives), ``shutdown_complete_event`` at the end."""
    proc: subprocess.Popen[bytes] | None = None
    stop = threading.Event()
    try:
        runtime = _runtime()
        for step in ("_apply_child_process_signal_policy", "_reload_runtime_config_from_env"):
            hook = getattr(runtime, step, None)
            if callable(hook):
                hook()
        register = getattr(runtime, "register_child_graceful_stop_hook", None)
        if callable(register):
            register(stop.set)
        if shutdown_event is not None:
            launcher_shutdown = getattr(runtime, "register_launcher_shutdown_event", None)
            if callable(launcher_shutdown):
                launcher_shutdown(shutdown_event)
        port = int(os.environ.get("NEKO_MEMORY_SERVER_PORT") or runtime.MEMORY_SERVER_PORT)
        instance_id = str(getattr(runtime, "INSTANCE_ID", "") or os.environ.get("NEKO_INSTANCE_ID", ""))
        command = [str(part) for part in json.loads(os.environ[SERVE_ENV])]
        command += ["--port", str(port), "--instance-id", instance_id]
        env = dict(os.environ, NEKO_INSTANCE_ID=instance_id)
        # stdin is a pipe only this process holds: nekomem stops when it closes, so it
        # never outlives this process, however it ends. On Windows a console Ctrl+C goes to
        # every process of the console; the launcher drives the shutdown, so nekomem gets
        # its own process group there (SIGINT is ignored here, and inherited, on POSIX).
        flags = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0) if sys.platform == "win32" else 0
        proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, creationflags=flags)
        print(f"[nekomem] memory server starting on port {port} (pid {proc.pid})", flush=True)
        while True:
            if proc.poll() is not None:
                print(f"[nekomem] memory server exited during start-up (status {proc.returncode})", flush=True)
                return
            if stop.is_set() or (shutdown_event is not None and shutdown_event.is_set()):
                break
            health = _health(port)
            if health and health.get("server") == "nekomem" and health.get("instance_id") == instance_id:
                emit("memory_ready", port=port, instance_id=instance_id, pid=proc.pid)
                # The launcher starts the next server (main) once the import event is set:
                # here that is once nekomem serves, so main's first calls find it.
                if import_event is not None:
                    import_event.set()
                ready_event.set()
                break
            time.sleep(HEALTH_POLL_SECONDS)
        while not stop.is_set() and proc.poll() is None:
            if shutdown_event is not None and shutdown_event.wait(0.5):
                break
            if shutdown_event is None:
                stop.wait(0.5)
        if proc.poll() is None:
            print("[nekomem] stopping the memory server", flush=True)
            _post_shutdown(port)
            try:
                proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(timeout=5)
    except Exception as exc:  # noqa: BLE001 -- foreign code runs here; report as the launcher's own entry does
        print(f"[nekomem] memory server error: {type(exc).__name__}: {exc}", flush=True)
        if proc is not None and proc.poll() is None:
            proc.kill()
    finally:
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if shutdown_complete_event is not None:
            shutdown_complete_event.set()


def relaunch_command() -> list[str]:
    """The command a self-restarting launcher runs for its next generation: this file again."""
    return [sys.executable, os.path.abspath(__file__), os.getcwd()]


REQUIRED = ("apply_port_strategy", "start_server", "run_memory_server", "start_launcher")


def refuse(reason: str) -> int:
    """Report a layout this file cannot run and end the boot (nothing was started)."""
    emit("boot_refused", reason=reason)
    print(f"[nekomem] {reason}", file=sys.stderr, flush=True)
    return REFUSED_STATUS


def main(argv: list[str]) -> int:
    """Patch the install's launcher and run it; the launcher's exit status."""
    if len(argv) != 2:
        return refuse("usage: cli/neko_boot.py <N.E.K.O. install folder>")
    install = os.path.abspath(argv[1])
    if not os.path.isfile(os.path.join(install, "launcher_core", "runtime.py")):
        return refuse(f"{install} has no launcher_core/runtime.py: this N.E.K.O. launcher layout is not supported")
    if SERVE_ENV not in os.environ:
        return refuse(f"{SERVE_ENV} is not set: run this through `nekomem neko`")
    os.chdir(install)
    sys.path.insert(0, install)
    # The launcher re-executes into the install's .venv when it was started by another
    # Python (launcher_core.bootstrap._maybe_reexec_into_project_venv); it re-runs sys.argv,
    # which must name this file, not the launcher.
    sys.argv = [os.path.abspath(__file__), install]
    try:
        runtime: Any = importlib.import_module("launcher_core.runtime")
    except Exception as exc:  # noqa: BLE001 -- any failure of the install's import is a refusal
        return refuse(f"the N.E.K.O. launcher cannot be imported: {type(exc).__name__}: {exc}")
    absent = [name for name in REQUIRED if not callable(getattr(runtime, name, None))]
    if absent:
        return refuse(f"launcher_core.runtime lacks {', '.join(absent)}: this N.E.K.O. launcher layout is not supported")
    runtime.run_memory_server = run_memory_server
    if callable(getattr(runtime, "_build_launcher_relaunch_command", None)):
        # A launcher that restarts itself (no owner relaunch) re-runs this file, not launcher.py.
        runtime._build_launcher_relaunch_command = relaunch_command
    emit("boot_patched", install=install, python=sys.executable, pid=os.getpid())
    return int(runtime.start_launcher() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
