"""Stand-in of the reference launcher's ``launcher_core/runtime.py``, for nekomem's tests.

Written for these tests (no reference code), with the reference's module, function and
event names and its flow, as read in ``Project-N-E-K-O/N.E.K.O`` at
``launcher_core/runtime.py`` 0021e9d113a3caec8df4061052a5630d70a0d19d,
``launcher_core/bootstrap.py`` 4d4e08a5ed86690525db0166a47eef5289025c0e and
``utils/port_utils.py`` (``build_health_response`` / ``probe_neko_health``):

- ``apply_port_strategy``: each default port (memory, agent, main) that cannot be bound is
  probed; the launcher attaches (``"attach"``, starts nothing) only when all three answer as
  main / memory / agent of one instance (``_validated_existing_backend_instance``); any other
  N.E.K.O. answer moves every public port to a fallback (a "partial or mixed existing
  backend"). ``NEKO_EVENT port_plan`` / ``attach_existing`` lines report it.
- multi-process mode: ``start_server`` hands ``run_memory_server`` / ``run_main_server`` /
  ``run_agent_server`` (looked up by module name at call time) to ``multiprocessing.Process``
  with the ready / import / shutdown / shutdown-complete events; ``wait_for_servers`` waits
  for every port and ready event; ``NEKO_EVENT startup_ready`` follows.
- children: SIGINT ignored, SIGTERM runs the registered graceful-stop hooks
  (``_apply_child_process_signal_policy``), config re-read from the ``NEKO_*`` environment
  (``_reload_runtime_config_from_env``).
- shutdown: ``cleanup_servers`` stops main, then memory, then agent (``SHUTDOWN_MODULE_ORDER``),
  each through its shutdown event, waiting for its shutdown-complete event.
- merged mode (``NEKO_MERGED=1``, the default of frozen builds): all three apps in this
  process, the reference's own memory app included.
- storage restart: when main exits after asking for one, the launcher cleans up, emits
  ``storage_migration_restart`` and, with ``NEKO_OWNER_RELAUNCH`` set, exits for its owner to
  start the next generation; without it, it starts ``launcher.py`` again itself
  (``_spawn_restarted_launcher``).

Left out: the single-instance lock, the parent-death guard, cloudsave and storage layout
resolution, Windows job objects, internal ports. Test-only switches: ``STANDIN_MP_START``
(the multiprocessing start method), ``STANDIN_EARLY_TARGETS`` (a variant whose
``start_server`` binds its targets at import, so a replaced ``run_memory_server`` is not
used), ``STANDIN_STORAGE_RESTART`` (main asks for a storage restart once),
``STANDIN_IGNORE_OWNER_RELAUNCH`` (a launcher that always relaunches itself), ``STANDIN_LOG``.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from multiprocessing import Event, Process

import config as config_module
from config import MAIN_SERVER_PORT, MEMORY_SERVER_PORT, TOOL_SERVER_PORT
from utils.port_utils import probe_neko_health, set_port_probe_reuse

from launcher_core.bootstrap import IS_FROZEN, _maybe_reexec_into_project_venv, bundle_dir

LAUNCH_ID = ""
INSTANCE_ID = ""
DEFAULT_PORTS = {"MAIN_SERVER_PORT": MAIN_SERVER_PORT, "MEMORY_SERVER_PORT": MEMORY_SERVER_PORT, "TOOL_SERVER_PORT": TOOL_SERVER_PORT}
AVOID_FALLBACK_PORTS = set(range(48911, 48917))
SHUTDOWN_MODULE_ORDER = ("main_server", "memory_server", "agent_server")
_partial_or_mixed_existing_backend = False
_child_graceful_stop_hooks: list = []
_launcher_shutdown_event = None

SERVERS = [
    {"name": "Memory Server", "module": "memory_server", "port": MEMORY_SERVER_PORT, "process": None, "graceful_shutdown_timeout": 12},
    {"name": "Main Server", "module": "main_server", "port": MAIN_SERVER_PORT, "process": None, "graceful_shutdown_timeout": 20},
    {"name": "Agent Server", "module": "agent_server", "port": TOOL_SERVER_PORT, "process": None, "graceful_shutdown_timeout": 8},
]


def emit_frontend_event(event_type: str, payload: dict | None = None) -> None:
    envelope = {
        "source": "neko_launcher",
        "event": event_type,
        "ts": datetime.now(timezone.utc).isoformat(),
        "launch_id": LAUNCH_ID,
        "payload": payload or {},
    }
    print(f"NEKO_EVENT {json.dumps(envelope, ensure_ascii=True, separators=(',', ':'))}", flush=True)


def report_startup_failure(message: str) -> None:
    print(message, flush=True)
    emit_frontend_event("startup_failure", {"message": message})


def _initialize_launcher_context() -> None:
    global LAUNCH_ID, INSTANCE_ID
    LAUNCH_ID = LAUNCH_ID or uuid.uuid4().hex
    if not INSTANCE_ID:
        INSTANCE_ID = os.environ.get("NEKO_INSTANCE_ID") or uuid.uuid4().hex
        os.environ.setdefault("NEKO_INSTANCE_ID", INSTANCE_ID)
        _sync_runtime_config_globals()


def _sync_runtime_config_globals(selected: dict[str, int] | None = None) -> None:
    for key, value in {"INSTANCE_ID": INSTANCE_ID, **(selected or {})}.items():
        setattr(config_module, key, value)


def _reload_runtime_config_from_env() -> None:
    global INSTANCE_ID, MAIN_SERVER_PORT, MEMORY_SERVER_PORT, TOOL_SERVER_PORT
    reloaded = importlib.reload(config_module)
    INSTANCE_ID = str(reloaded.INSTANCE_ID)
    MAIN_SERVER_PORT, MEMORY_SERVER_PORT = int(reloaded.MAIN_SERVER_PORT), int(reloaded.MEMORY_SERVER_PORT)
    TOOL_SERVER_PORT = int(reloaded.TOOL_SERVER_PORT)


# -- children ---------------------------------------------------------------------------
def register_child_graceful_stop_hook(hook) -> None:
    _child_graceful_stop_hooks.append(hook)


def register_launcher_shutdown_event(event) -> None:
    global _launcher_shutdown_event
    _launcher_shutdown_event = event


def _handle_child_termination_signal(signum, frame) -> None:
    for hook in list(_child_graceful_stop_hooks):
        hook()
    if not _child_graceful_stop_hooks:
        raise SystemExit(0)


def _apply_child_process_signal_policy() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the launcher reacts to Ctrl+C
    signal.signal(signal.SIGTERM, _handle_child_termination_signal)


def _run_app(module: str, port: int, events: tuple, after_start=None, before_stop=None) -> None:
    ready_event, import_event, shutdown_event, shutdown_complete_event = events
    try:
        app = importlib.import_module(f"app.{module}")
        if import_event is not None:
            import_event.set()
        server = app.build(port)
        stop = threading.Event()
        register_child_graceful_stop_hook(stop.set)
        if shutdown_event is not None:
            register_launcher_shutdown_event(shutdown_event)
            threading.Thread(target=lambda: (shutdown_event.wait(), stop.set()), daemon=True).start()
        serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        serving.start()
        print(f"[{module}] running on port {port}", flush=True)
        ready_event.set()
        if after_start is not None:
            threading.Thread(target=after_start, args=(stop,), daemon=True).start()
        stop.wait()
        if before_stop is not None:
            before_stop()
        server.shutdown()
        server.server_close()
    finally:
        if shutdown_complete_event is not None:
            shutdown_complete_event.set()


def run_memory_server(ready_event, import_event=None, shutdown_event=None, shutdown_complete_event=None) -> None:
    _apply_child_process_signal_policy()
    _reload_runtime_config_from_env()
    _run_app("memory_server", MEMORY_SERVER_PORT, (ready_event, import_event, shutdown_event, shutdown_complete_event))


def run_agent_server(ready_event, import_event=None, shutdown_event=None, shutdown_complete_event=None) -> None:
    _apply_child_process_signal_policy()
    _reload_runtime_config_from_env()
    _run_app("agent_server", TOOL_SERVER_PORT, (ready_event, import_event, shutdown_event, shutdown_complete_event))


def run_main_server(ready_event, import_event=None, shutdown_event=None, shutdown_complete_event=None) -> None:
    _apply_child_process_signal_policy()
    _reload_runtime_config_from_env()
    from app import main_server

    memory_port = MEMORY_SERVER_PORT
    _run_app(
        "main_server",
        MAIN_SERVER_PORT,
        (ready_event, import_event, shutdown_event, shutdown_complete_event),
        after_start=lambda stop: main_server.started(memory_port, stop),
        before_stop=lambda: main_server.stopping(memory_port),
    )


# A launcher variant that binds its targets when imported: replacing the module's
# run_memory_server afterwards changes nothing (STANDIN_EARLY_TARGETS).
_EARLY_TARGETS = {"memory_server": run_memory_server, "agent_server": run_agent_server, "main_server": run_main_server}


# -- ports --------------------------------------------------------------------------------
def _is_port_bindable(port: int) -> bool:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        set_port_probe_reuse(sock)
        sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def check_port(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pick_fallback_port(preferred: int, reserved: set[int]) -> int | None:
    for port in range(preferred + 1, min(preferred + 101, 65535)):
        if port not in reserved and port not in AVOID_FALLBACK_PORTS and _is_port_bindable(port):
            return port
    return None


def _classify_port_conflict(port: int) -> tuple[str, list]:
    return ("neko", []) if probe_neko_health(port) is not None else ("other_process", [])


def _validated_existing_backend_instance(health_by_key: dict[str, dict]) -> str | None:
    expected = {"MAIN_SERVER_PORT": "main", "MEMORY_SERVER_PORT": "memory", "TOOL_SERVER_PORT": "agent"}
    if set(health_by_key) != set(expected):
        return None
    ids = set()
    for key, service in expected.items():
        health = health_by_key[key]
        if health.get("service") != service or not health.get("instance_id"):
            return None
        ids.add(str(health["instance_id"]))
    return ids.pop() if len(ids) == 1 else None


def apply_port_strategy() -> bool | str:
    global MAIN_SERVER_PORT, MEMORY_SERVER_PORT, TOOL_SERVER_PORT, _partial_or_mixed_existing_backend
    chosen: dict[str, int] = {}
    fallbacks: list[dict] = []
    existing: dict[str, dict] = {}
    reserved: set[int] = set()
    for key in ("MEMORY_SERVER_PORT", "TOOL_SERVER_PORT", "MAIN_SERVER_PORT"):
        preferred = int(DEFAULT_PORTS[key])
        if preferred not in reserved and _is_port_bindable(preferred):
            chosen[key] = preferred
            reserved.add(preferred)
            continue
        reason, owners = _classify_port_conflict(preferred)
        if reason == "neko":
            chosen[key] = preferred
            reserved.add(preferred)
            existing[key] = probe_neko_health(preferred) or {}
            continue
        fallback = _pick_fallback_port(preferred, reserved)
        if fallback is None:
            report_startup_failure(f"Startup failed: no fallback port available for {key}")
            return False
        chosen[key] = fallback
        reserved.add(fallback)
        fallbacks.append({"port_key": key, "preferred": preferred, "selected": fallback, "reason": reason, "owners": owners})

    attached = _validated_existing_backend_instance(existing)
    if attached is not None:
        common = {"instance_id": attached, "launcher_instance_id": INSTANCE_ID, "selected": chosen}
        emit_frontend_event("port_plan", {**common, "defaults": DEFAULT_PORTS, "fallbacks": [], "fallback_applied": False})
        emit_frontend_event("attach_existing", {**common, "existing_instance_id": attached})
        return "attach"

    _partial_or_mixed_existing_backend = bool(existing)
    for key in ("MEMORY_SERVER_PORT", "TOOL_SERVER_PORT", "MAIN_SERVER_PORT"):
        preferred = int(DEFAULT_PORTS[key])
        if not _partial_or_mixed_existing_backend or chosen[key] != preferred:
            continue
        fallback = _pick_fallback_port(preferred, reserved)
        if fallback is None:
            report_startup_failure(f"Startup failed: no isolated fallback port available for {key}")
            return False
        chosen[key] = fallback
        reserved.add(fallback)
        reason = "existing_neko_conflict" if key in existing else "isolate_from_existing_neko_backend"
        fallbacks.append({"port_key": key, "preferred": preferred, "selected": fallback, "reason": reason, "owners": []})

    MAIN_SERVER_PORT, MEMORY_SERVER_PORT = chosen["MAIN_SERVER_PORT"], chosen["MEMORY_SERVER_PORT"]
    TOOL_SERVER_PORT = chosen["TOOL_SERVER_PORT"]
    for key, value in chosen.items():
        os.environ[f"NEKO_{key}"] = str(value)
    _sync_runtime_config_globals(chosen)
    for server in SERVERS:
        server["port"] = {"memory_server": MEMORY_SERVER_PORT, "agent_server": TOOL_SERVER_PORT, "main_server": MAIN_SERVER_PORT}[
            server["module"]
        ]
    emit_frontend_event(
        "port_plan",
        {
            "instance_id": INSTANCE_ID,
            "defaults": DEFAULT_PORTS,
            "selected": chosen,
            "fallbacks": fallbacks,
            "fallback_applied": bool(fallbacks),
        },
    )
    return True


# -- multi-process mode -------------------------------------------------------------------
def start_server(server: dict) -> bool:
    if check_port(server["port"]):
        report_startup_failure(f"Start failed: {server['name']} port {server['port']} already in use")
        return False
    if os.environ.get("STANDIN_EARLY_TARGETS"):
        target = _EARLY_TARGETS[server["module"]]
    elif server["module"] == "memory_server":
        target = run_memory_server
    elif server["module"] == "agent_server":
        target = run_agent_server
    else:
        target = run_main_server
    for name in ("ready_event", "import_event", "shutdown_event", "shutdown_complete_event"):
        server[name] = Event()
    server["process"] = Process(
        target=target,
        args=(server["ready_event"], server["import_event"], server["shutdown_event"], server["shutdown_complete_event"]),
        daemon=False,
    )
    server["process"].start()
    print(f"started {server['name']} (pid {server['process'].pid})", flush=True)
    return True


def wait_for_servers(timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for server in SERVERS:
            proc = server["process"]
            if not proc.is_alive() and not check_port(server["port"]):
                report_startup_failure(f"Startup failed: {server['name']} exited early (exitcode={proc.exitcode})")
                return False
        if all(check_port(s["port"]) for s in SERVERS) and all(s["ready_event"].is_set() for s in SERVERS):
            return True
        time.sleep(0.1)
    report_startup_failure("Startup timeout: at least one service did not become ready")
    return False


def cleanup_servers() -> None:
    order = {module: index for index, module in enumerate(SHUTDOWN_MODULE_ORDER)}
    for server in sorted(SERVERS, key=lambda s: order[s["module"]]):
        proc = server.get("process")
        if proc is None:
            continue
        if proc.is_alive():
            server["shutdown_event"].set()
            server["shutdown_complete_event"].wait(timeout=server["graceful_shutdown_timeout"])
            proc.join(timeout=2)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        print(f"stopped {server['name']}", flush=True)


def _handle_termination_signal(signum, frame) -> None:
    cleanup_servers()
    raise SystemExit(0)


# -- merged mode --------------------------------------------------------------------------
def _should_use_merged_mode() -> bool:
    value = os.environ.get("NEKO_MERGED", "").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return IS_FROZEN


def run_merged_servers() -> int:
    from app import agent_server, main_server, memory_server

    stop = threading.Event()
    servers = [("memory", memory_server.build(MEMORY_SERVER_PORT)), ("agent", agent_server.build(TOOL_SERVER_PORT))]
    servers.append(("main", main_server.build(MAIN_SERVER_PORT)))
    for _name, server in servers:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    emit_frontend_event("startup_ready", {"instance_id": INSTANCE_ID, "selected": _selected()})
    threading.Thread(target=main_server.started, args=(MEMORY_SERVER_PORT, stop), daemon=True).start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    for name in ("main", "memory", "agent"):
        dict(servers)[name].shutdown()
    return 0


def _selected() -> dict[str, int]:
    return {"MAIN_SERVER_PORT": MAIN_SERVER_PORT, "MEMORY_SERVER_PORT": MEMORY_SERVER_PORT, "TOOL_SERVER_PORT": TOOL_SERVER_PORT}


# -- storage restart ----------------------------------------------------------------------
def _is_pending_storage_restart_request() -> bool:
    marker = os.environ.get("STANDIN_STORAGE_RESTART")
    if not marker or not os.path.exists(marker):
        return False
    with open(marker, encoding="utf-8") as source:
        return str(json.load(source).get("last_migration_result", "")).startswith("restart_pending:")


def _build_launcher_relaunch_command() -> list[str]:
    return [sys.executable, os.path.join(bundle_dir, "launcher.py"), *sys.argv[1:]]


def _maybe_schedule_storage_restart() -> bool:
    if not _is_pending_storage_restart_request():
        return False
    with open(os.environ["STANDIN_STORAGE_RESTART"], "w", encoding="utf-8") as out:
        json.dump({"last_migration_result": "restart_done:standin"}, out)
    owner = os.environ.get("NEKO_OWNER_RELAUNCH", "").strip().lower() in ("1", "true", "yes")
    owner = owner and not os.environ.get("STANDIN_IGNORE_OWNER_RELAUNCH")  # a launcher without owner relaunch
    emit_frontend_event("storage_migration_restart", {"restart_reason": "rebind_only", "relaunch": "owner" if owner else "self"})
    if not owner:
        subprocess.Popen(_build_launcher_relaunch_command(), cwd=os.getcwd(), env=dict(os.environ), close_fds=True)
    return True


# -- entry --------------------------------------------------------------------------------
def main() -> int:
    emit_frontend_event("startup_begin", {"instance_id": INSTANCE_ID})
    result = apply_port_strategy()
    if result == "attach":
        return 0
    if not result:
        return 1
    signal.signal(signal.SIGTERM, _handle_termination_signal)
    if _should_use_merged_mode() and not _partial_or_mixed_existing_backend:
        os.environ["NEKO_LAUNCH_MODE"] = "merged"
        return run_merged_servers()
    os.environ["NEKO_LAUNCH_MODE"] = "multi"
    exit_code = 0
    try:
        for server in SERVERS:
            if not start_server(server):
                cleanup_servers()
                return 1
            if not server["import_event"].wait(timeout=90):
                report_startup_failure(f"Startup timeout: {server['name']} import not complete")
                cleanup_servers()
                return 1
        if not wait_for_servers():
            cleanup_servers()
            return 1
        emit_frontend_event("startup_ready", {"instance_id": INSTANCE_ID, "selected": _selected()})
        while True:
            time.sleep(0.2)
            dead = [s for s in SERVERS if s["module"] in ("main_server", "memory_server") and not s["process"].is_alive()]
            if dead:
                print(f"critical service exited: {dead[0]['name']}", flush=True)
                break
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("interrupted; shutting down", flush=True)
    finally:
        cleanup_servers()
        _maybe_schedule_storage_restart()
    return exit_code


def start_launcher() -> int:
    _maybe_reexec_into_project_venv(bundle_dir)
    if bundle_dir not in sys.path:
        sys.path.insert(0, bundle_dir)
    os.chdir(bundle_dir)
    method = os.environ.get("STANDIN_MP_START")
    if method:
        multiprocessing.set_start_method(method, force=True)
    _initialize_launcher_context()
    return main()
