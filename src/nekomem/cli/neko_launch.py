"""``nekomem neko``: run a N.E.K.O. install with nekomem as its memory server.

How the reference's launcher picks its memory server (``launcher_core/runtime.py``, read at
the commit named in docs/NEKO.md, where the launcher's behaviour is written out step by
step): ``apply_port_strategy`` probes the three default ports (memory 48912, agent 48915,
main 48911). It *attaches* -- starts nothing and exits -- only when all three answer
``/health`` as the expected services of one instance
(``_validated_existing_backend_instance``); any other N.E.K.O. answer on a default port
("partial or mixed existing backend") moves every public port to a fallback and starts its
own complete topology, memory server included (``start_server`` -> ``run_memory_server``).
So a nekomem already serving 48912 is never used: the old way in (serve first, start the
launcher after) leaves nekomem idle, and answering for main and agent too would make the
launcher attach and start no N.E.K.O. at all.

The way in is therefore the launcher's own code with one part replaced. This command runs
:mod:`nekomem.cli.neko_boot` with the install's Python in the install's folder. That file
imports ``launcher_core.runtime``, replaces ``run_memory_server`` (the target
``start_server`` gives ``multiprocessing.Process``) with one that starts
``nekomem neko-serve`` on the port and instance id the launcher chose, sets the launcher's
import, ready and shutdown-complete events as the reference's memory server does, and
stops nekomem gracefully when the launcher's ordered shutdown (main, then memory, then
agent) reaches the memory server. Everything else is the user's launcher, unchanged.

The launcher is started with ``NEKO_MERGED=0`` (merged mode loads the reference's memory
app in process), ``NEKO_OWNER_RELAUNCH=1`` (a storage-location restart exits cleanly and
this command starts the next generation, through the same boot file, instead of the
launcher re-running ``launcher.py`` by itself) and the instance id exported (inherited
from ``NEKO_INSTANCE_ID`` or drawn here).

This command reads the launcher's stdout (echoing it) and stops with a message and status
3 -- never sits idle -- when N.E.K.O. ended up on another memory server: the boot file
refused the layout; ``port_plan`` shows a N.E.K.O. service already on a default port;
``attach_existing`` or a ``single_instance`` duplicate (another N.E.K.O. runs); or, at
``startup_ready``, the memory port does not answer ``/health`` as nekomem with the
launcher's instance id. It then stops the launcher as Ctrl+C would.

Lifetime: the launcher runs in its own session (POSIX), so a terminal's Ctrl+C reaches this
process only; it is forwarded to the launcher alone (SIGINT; a second signal as SIGTERM,
which runs the launcher's ordered cleanup too), whose shutdown order stops nekomem after
the main server. The exit status is the launcher's.

``nekomem neko-serve`` (internal, started by the boot file): the memory server itself, with
the settings of :func:`decide_settings`, ``/shutdown`` on, and a watch on stdin: when the
process that started it goes away, it stops.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import uvicorn

from nekomem.cli import neko_boot
from nekomem.config import Settings, SettingsError, load_settings, neko_models
from nekomem.config.llm import TIERS
from nekomem.domain.layers import layer_settings

log = logging.getLogger("nekomem.neko")

INSTANCE_ENV = "NEKO_INSTANCE_ID"
PORT_ENV = "NEKO_MEMORY_SERVER_PORT"
MERGED_ENV = "NEKO_MERGED"
OWNER_RELAUNCH_ENV = "NEKO_OWNER_RELAUNCH"
# The desktop owner's private storage-bootstrap channel (fd 5): this command is no such owner.
GUARD_ENVS = ("NEKO_STORAGE_BOOTSTRAP_GUARD_V1", "NEKO_STORAGE_BOOTSTRAP_GUARD_FD")
EVENT_PREFIX = "NEKO_EVENT "
BOOT_EVENT_PREFIX = neko_boot.EVENT_PREFIX + " "
BYPASSED = 3  # exit status: N.E.K.O. ended up on another memory server, or could not be run
DOCS = "docs/NEKO.md"
_LLM_ENDPOINT_FIELDS = ("llm_base_url", "llm_model", "llm_api_key") + tuple(
    f"llm_{tier}_{part}" for tier in TIERS for part in ("base_url", "model", "api_key")
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the ``neko`` subcommand (and the internal ``neko-serve``) on the CLI."""
    neko = sub.add_parser("neko", help="run a N.E.K.O. install (its own launcher) with nekomem as its memory server")
    neko.add_argument("--neko-source", help="the N.E.K.O. install folder, holding launcher_core/ (default: the current folder)")
    neko.add_argument("--neko-python", help="N.E.K.O.'s Python (default: the install's .venv, else python3 on PATH)")
    neko.add_argument("--port", type=int, help=f"memory port N.E.K.O. prefers (exported as {PORT_ENV}; default 48912)")
    _add_settings_args(neko)
    neko.add_argument("launcher", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    serve = sub.add_parser("neko-serve", help="(internal) the memory server `nekomem neko` starts inside N.E.K.O.'s launcher")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--instance-id", required=True)
    serve.add_argument("--neko-source", help="the N.E.K.O. install folder (for its config/api_providers.json)")
    _add_settings_args(serve)


def _add_settings_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-root",
        help="memory folder (default: the N.E.K.O. data directory's memory/, served in place; env NEKOMEM_MEMORY_ROOT)",
    )
    parser.add_argument("--neko-data-dir", help="the N.E.K.O. data directory (default: found where N.E.K.O. keeps it)")
    parser.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")


def user_set_a_model(settings: Settings) -> bool:
    """Whether NEKOMEM_LLM_* / the TOML file / flags name any model endpoint, key or model:
    then nothing is taken from N.E.K.O. (a partial mix of both would be nobody's choice)."""
    return any(getattr(settings.llm, name) for name in _LLM_ENDPOINT_FIELDS)


def decide_settings(
    args: argparse.Namespace, install: Path | None, *, port: int | None = None, instance_id: str | None = None
) -> tuple[Settings, neko_models.NekoModels | None]:
    """The settings ``nekomem neko`` serves with, and the model settings taken from N.E.K.O.
    (None when the user set a model, or there is no N.E.K.O. data directory).

    The memory root is decided here, and only here: ``--memory-root``, else
    NEKOMEM_MEMORY_ROOT / the TOML file, else the default the N.E.K.O. data directory gives
    (:func:`nekomem.config.neko_data.defaults`). The data directory is ``--neko-data-dir``,
    else the setting, else ``auto`` (which follows ``NEKO_STORAGE_SELECTED_ROOT``, exported
    by the launcher once it resolved its storage layout). Raises SettingsError."""
    overrides: dict[str, object] = {
        "memory_root": args.memory_root,
        "port": port,
        "instance_id": instance_id,
        "shutdown_enabled": True,
        "neko_data_dir": args.neko_data_dir,
    }
    settings = load_settings(args.config, overrides=overrides, layers=layer_settings())
    if not settings.server.neko_data_dir:
        overrides["neko_data_dir"] = "auto"
        settings = load_settings(args.config, overrides=overrides, layers=layer_settings())
    data_dir = settings.server.neko_data_dir
    if not data_dir or user_set_a_model(settings):
        return settings, None
    models = neko_models.resolve(Path(data_dir), install)
    if models.tiers:
        settings = load_settings(
            args.config, overrides={**overrides, "neko_data_dir": data_dir, **models.overrides()}, layers=layer_settings()
        )
    return settings, models


LEGACY_ROOT = "nekomem-memory"


def legacy_root_notice(settings: Settings) -> str | None:
    """What to tell a user whose data directory still holds ``nekomem-memory/`` (the memory
    root before N.E.K.O.'s own ``memory/`` was served in place), or None."""
    data_dir = settings.server.neko_data_dir.strip()
    if not data_dir:
        return None
    legacy = Path(data_dir).expanduser() / LEGACY_ROOT
    root = Path(settings.server.memory_root).expanduser()
    if not legacy.is_dir() or root.resolve() == legacy.resolve():
        return None
    return (
        f"{legacy} (nekomem's memory root before it served N.E.K.O.'s own memory folder) is not read any more; "
        f"{root} is served in place. To keep what nekomem learned there, stop nekomem and run: "
        f"nekomem restore {legacy} --memory-root {root} --replace"
    )


def _memory_root_refusal(settings: Settings) -> str | None:
    root = Path(settings.server.memory_root).expanduser()
    if (root / "__init__.py").is_file():
        # Run from a N.E.K.O. source folder with no data directory found, ./memory is its
        # Python package: never write characters into it.
        return f"{root} is a Python package (N.E.K.O.'s source); choose a memory root with --memory-root"
    return None


def install_python(install: Path) -> str:
    """The install's own interpreter: its ``.venv`` (as the launcher's bootstrap prefers),
    else ``python3`` (``python`` on Windows) from PATH."""
    venv = install / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if venv.exists():
        return str(venv)
    return "python" if os.name == "nt" else "python3"


def launcher_env(base: dict[str, str], serve_command: list[str], instance_id: str, port: int | None) -> dict[str, str]:
    """The environment the N.E.K.O. launcher runs in (see the module docstring)."""
    env = dict(base)
    if env.get(MERGED_ENV, "").strip().lower() in ("1", "true", "yes"):
        log.warning("%s=1 ignored: merged mode runs N.E.K.O.'s own memory server in process", MERGED_ENV)
    env[MERGED_ENV] = "0"
    env[OWNER_RELAUNCH_ENV] = "1"
    env[INSTANCE_ENV] = instance_id
    env[neko_boot.SERVE_ENV] = json.dumps(serve_command)
    env["PYTHONUNBUFFERED"] = "1"
    for name in GUARD_ENVS:
        env.pop(name, None)
    if port is not None:
        env[PORT_ENV] = str(port)
    return env


def memory_health(port: int) -> dict[str, Any] | None:
    """``GET /health`` of the memory port, or None when nothing answers it as JSON."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return body if isinstance(body, dict) else None


class Bypassed(Exception):
    """N.E.K.O. ended up (or would end up) on a memory server that is not nekomem."""


def _port_of(payload: dict[str, Any], key: str) -> int | None:
    selected = payload.get("selected")
    value = selected.get(key) if isinstance(selected, dict) else None
    return value if isinstance(value, int) else None


class Watch:
    """What the launcher's stdout said, and the checks run on it (raise :class:`Bypassed`)."""

    def __init__(self) -> None:
        self.ready = False
        self.relaunch = False
        self.memory_ready: dict[str, Any] | None = None

    def line(self, text: str) -> str | None:
        """Check one line; returns a note to print (or None). Raises Bypassed."""
        if text.startswith(BOOT_EVENT_PREFIX):
            event, payload = self._decode(text[len(BOOT_EVENT_PREFIX) :])
            if event == "boot_refused":
                raise Bypassed(
                    f"N.E.K.O.'s launcher cannot be run with nekomem: {payload.get('reason')}. "
                    f"nekomem supports the launcher_core layout described in {DOCS}; update N.E.K.O. or run it without nekomem."
                )
            if event == "memory_ready":
                self.memory_ready = payload
            return None
        if not text.startswith(EVENT_PREFIX):
            return None
        event, payload = self._decode(text[len(EVENT_PREFIX) :])
        if event == "port_plan":
            return self._port_plan(payload)
        if event == "attach_existing":
            raise Bypassed(
                f"a complete N.E.K.O. backend (instance {payload.get('existing_instance_id')}) already runs on the default ports; "
                "the launcher attached to it and started nothing, so N.E.K.O. uses that backend's memory server, not nekomem. "
                "Quit that N.E.K.O. and run `nekomem neko` again."
            )
        if event == "single_instance" and payload.get("role") == "duplicate":
            found = payload.get("owner")
            owner: dict[str, Any] = found if isinstance(found, dict) else {}
            raise Bypassed(
                f"another N.E.K.O. runtime is running (pid {owner.get('pid')}), with its own memory server; "
                "quit it and run `nekomem neko` again."
            )
        if event == "storage_migration_restart":
            if payload.get("relaunch") != "owner":
                raise Bypassed(
                    "N.E.K.O.'s launcher restarts itself (storage location) instead of leaving the next start to "
                    f"`nekomem neko` (it ignores {OWNER_RELAUNCH_ENV}: an older launcher). Such a generation runs past "
                    "nekomem's watch (an older launcher even detaches it), so it is stopped here. Start `nekomem neko` "
                    f"again to continue; see {DOCS} for the supported N.E.K.O. versions."
                )
            self.relaunch = True
            return "N.E.K.O. asked for a restart (storage location); it is started again once it exited"
        if event == "startup_ready":
            return self._startup_ready(payload)
        return None

    @staticmethod
    def _decode(raw: str) -> tuple[str, dict[str, Any]]:
        try:
            envelope = json.loads(raw)
        except ValueError:
            return "", {}
        if not isinstance(envelope, dict):
            return "", {}
        payload = envelope.get("payload")
        return str(envelope.get("event") or ""), payload if isinstance(payload, dict) else {}

    @staticmethod
    def _port_plan(payload: dict[str, Any]) -> str | None:
        fallbacks = payload.get("fallbacks")
        moved = [f for f in fallbacks if isinstance(f, dict)] if isinstance(fallbacks, list) else []
        neko_held = [f for f in moved if f.get("reason") in ("neko", "existing_neko_conflict")]
        if neko_held:
            ports = ", ".join(f"{f.get('preferred')} ({f.get('port_key')}, pids {f.get('owners') or '?'})" for f in neko_held)
            raise Bypassed(
                f"a N.E.K.O. service already answers on {ports}: the launcher moved every port and would run a second "
                "N.E.K.O. beside it, with the browser still reaching the first one and its memory server. Stop that "
                "process (an older N.E.K.O., `nekomem serve` or `nekomem neko` on the default ports) and run `nekomem neko` again."
            )
        notes = [f"{f.get('port_key')} {f.get('preferred')} -> {f.get('selected')} ({f.get('reason')})" for f in moved]
        return "the launcher moved ports: " + "; ".join(notes) if notes else None

    def _startup_ready(self, payload: dict[str, Any]) -> str:
        port = _port_of(payload, "MEMORY_SERVER_PORT")
        instance_id = payload.get("instance_id")
        health = memory_health(port) if port is not None else None
        if health is None or health.get("server") != "nekomem" or health.get("instance_id") != instance_id:
            if health is None:
                who = "nothing"
            elif health.get("server") == "nekomem":
                who = f"a nekomem of another instance ({health.get('instance_id')}, the launcher's is {instance_id})"
            else:
                who = "N.E.K.O.'s own memory server"
            raise Bypassed(
                f"N.E.K.O. reported ready with its memory server on port {port}, and that port answers as {who}: "
                "nekomem was bypassed, this launcher did not run the memory server nekomem put in its place. "
                f"See {DOCS} for the supported N.E.K.O. versions."
            )
        self.ready = True
        main_port = _port_of(payload, "MAIN_SERVER_PORT")
        return f"N.E.K.O. is running with nekomem as its memory server (port {port}); open http://127.0.0.1:{main_port}"


class LauncherRun:
    """The N.E.K.O. launcher as a child: its output echoed and watched, signals forwarded,
    a storage restart answered with the next generation."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], grace: float, out: TextIO) -> None:
        self.command, self.cwd, self.env, self.grace, self.out = command, cwd, env, grace, out
        self.proc: subprocess.Popen[bytes] | None = None
        self.signals = 0

    def run(self) -> int:
        """Run generations until one exits without asking for a restart; its status, or
        :data:`BYPASSED` after a message when N.E.K.O. ended up on another memory server."""
        while True:
            watch = Watch()
            lines: queue.Queue[bytes | None] = queue.Queue()
            try:
                self.proc = subprocess.Popen(
                    self.command,
                    cwd=self.cwd,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=os.name == "posix",
                )
            except OSError as exc:
                self._say(f"N.E.K.O.'s launcher could not start ({' '.join(self.command[:1])}): {exc}; pass --neko-python")
                return BYPASSED
            assert self.proc.stdout is not None
            threading.Thread(target=self._pump, args=(self.proc.stdout, lines), name="nekomem-neko-output", daemon=True).start()
            try:
                self._follow(lines, watch)
            except Bypassed as exc:
                self._say(str(exc))
                self._stop_after_bypass(lines)
                return BYPASSED
            code = self.proc.wait()
            if watch.relaunch and code == 0 and self.signals == 0:
                continue
            if not watch.ready and self.signals == 0:
                self._say(f"N.E.K.O.'s launcher exited (status {code}) before it reported ready; its output is above")
            return code

    def handle_signal(self, sig: int, frame: FrameType | None) -> None:
        """First Ctrl+C / SIGTERM: SIGINT to the launcher alone (it stops main, then the
        memory server, then agent). Second: SIGTERM (its ordered cleanup as well). Third: kill."""
        self.signals += 1
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if os.name != "posix":
            return  # the launcher shares the console and got the Ctrl+C itself
        proc.send_signal(signal.SIGINT if self.signals == 1 else signal.SIGTERM if self.signals == 2 else signal.SIGKILL)

    def _follow(self, lines: queue.Queue[bytes | None], watch: Watch) -> None:
        while True:
            raw = lines.get()
            if raw is None:
                return
            self._echo(raw)
            note = watch.line(raw.decode("utf-8", errors="replace").strip())
            if note:
                self._say(note)

    def _stop_after_bypass(self, lines: queue.Queue[bytes | None]) -> None:
        """Stop the launcher as Ctrl+C would, echoing its output meanwhile; escalate after
        the grace."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is None and os.name == "posix":
            proc.send_signal(signal.SIGINT)
        elif proc.poll() is None:
            proc.terminate()
        drained = threading.Thread(target=self._drain, args=(lines,), daemon=True)
        drained.start()
        try:
            proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._sweep_group(proc.pid)
        drained.join(timeout=5)

    def _sweep_group(self, pgid: int) -> None:
        """What the launcher left in its process group (a launcher that relaunched itself
        past nekomem leaves its next generation there): SIGTERM, then SIGKILL after the grace."""
        if os.name != "posix":
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + (self.grace if sig == signal.SIGTERM else 10)
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except (ProcessLookupError, PermissionError):
                    return
                time.sleep(0.1)

    def _drain(self, lines: queue.Queue[bytes | None]) -> None:
        while (raw := lines.get()) is not None:
            self._echo(raw)

    @staticmethod
    def _pump(stream: Any, lines: queue.Queue[bytes | None]) -> None:
        for raw in stream:
            lines.put(raw)
        lines.put(None)

    def _echo(self, raw: bytes) -> None:
        self.out.write(raw.decode("utf-8", errors="replace"))
        self.out.flush()

    def _say(self, message: str) -> None:
        self.out.write(f"nekomem: {message}\n")
        self.out.flush()


def main(args: argparse.Namespace) -> int:
    """Run ``nekomem neko``; the launcher's exit status, 2 on bad settings or arguments,
    3 when N.E.K.O. ended up (or would end up) on another memory server."""
    if args.launcher:
        print(
            "nekomem: `nekomem neko -- COMMAND` is gone: N.E.K.O.'s current launcher moves every port and starts its own "
            "memory server when it finds nekomem on the memory port. Run `nekomem neko` in the N.E.K.O. folder "
            f"(or pass --neko-source FOLDER); see {DOCS}.",
            file=sys.stderr,
        )
        return 2
    install = Path(args.neko_source or os.getcwd()).expanduser().resolve()
    if not (install / "launcher_core" / "runtime.py").is_file():
        print(
            f"nekomem: {install} is not a N.E.K.O. install with launcher_core/runtime.py (the launcher layout nekomem "
            f"supports, see {DOCS}); run `nekomem neko` in the N.E.K.O. folder or pass --neko-source FOLDER",
            file=sys.stderr,
        )
        return 2
    instance_id = os.environ.get(INSTANCE_ENV, "").strip() or uuid.uuid4().hex
    try:
        settings, _models = decide_settings(args, install, instance_id=instance_id)
    except SettingsError as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 2
    refusal = _memory_root_refusal(settings)
    if refusal is not None:
        print(f"nekomem: {refusal}", file=sys.stderr)
        return 2
    notice = legacy_root_notice(settings)
    if notice is not None:
        print(f"nekomem: {notice}", file=sys.stderr)
    serve = [sys.executable, "-m", "nekomem", "neko-serve", "--neko-source", str(install)]
    for flag, value in (("--memory-root", args.memory_root), ("--neko-data-dir", args.neko_data_dir), ("--config", args.config)):
        if value:  # the server runs in the install's folder: relative paths are made absolute here
            serve += [flag, value if value.strip().lower() == "auto" else str(Path(value).expanduser().resolve())]
    python = args.neko_python or install_python(install)
    command = [python, str(Path(neko_boot.__file__).resolve()), str(install)]
    env = launcher_env(dict(os.environ), serve, instance_id, args.port)
    run = LauncherRun(command, install, env, settings.server.neko_stop_grace_seconds, sys.stdout)
    previous = {sig: signal.signal(sig, run.handle_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"nekomem: starting N.E.K.O. from {install} with {python} (instance {instance_id})", flush=True)
        return run.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_main(args: argparse.Namespace) -> int:
    """Run ``nekomem neko-serve``: the memory server inside N.E.K.O.'s launcher."""
    from nekomem.cli.banner import print_banner
    from nekomem.http.runtime_access import app_runtime
    from nekomem.server.app import create_app
    from nekomem.server.model_services import make_embeddings
    from nekomem.server.serving import StartupRefused, build_server, claim, startup_refusal

    install = Path(args.neko_source).resolve() if args.neko_source else None
    try:
        settings, models = decide_settings(args, install, port=args.port, instance_id=args.instance_id)
    except SettingsError as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 2
    refusal = _memory_root_refusal(settings) or startup_refusal(settings)
    if refusal is not None:
        print(f"nekomem: {refusal}", file=sys.stderr)
        return 2
    embeddings = make_embeddings(settings)
    app = create_app(settings, embeddings=embeddings)
    app_runtime(app).lock_role = "neko"
    try:
        sock = claim(app, settings)  # the root's lock, then the port, before the banner promises them
    except StartupRefused as exc:
        print(f"nekomem: {exc}", file=sys.stderr)
        return 1
    if models is not None:
        taken = ("from N.E.K.O.", models.describe())
    elif settings.server.neko_data_dir:
        taken = ("from N.E.K.O.", "no model: NEKOMEM_LLM_* / the settings file name one")
    else:
        taken = ("from N.E.K.O.", "nothing: no N.E.K.O. data directory found (pass --neko-data-dir)")
    hint = "set the model in N.E.K.O.'s API settings, or NEKOMEM_LLM_BASE_URL and NEKOMEM_LLM_MODEL"
    print_banner(settings, embeddings.state if embeddings is not None else None, sys.stderr, notes=[taken], no_model_hint=hint)
    server = build_server(app, settings)
    threading.Thread(target=_stop_when_stdin_closes, args=(server,), name="nekomem-neko-parent", daemon=True).start()
    log.info("serving as N.E.K.O.'s memory server on port %d (instance %s)", settings.server.port, args.instance_id)
    server.run(sockets=[sock])
    return 0


def _stop_when_stdin_closes(server: uvicorn.Server) -> None:
    """The boot file holds this process's stdin: end of file means it is gone."""
    try:
        # os.read, not sys.stdin: a buffered reader's lock held by this daemon thread
        # would abort the interpreter's shutdown.
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    log.info("the N.E.K.O. launcher's memory-server process is gone; stopping")
    server.should_exit = True
