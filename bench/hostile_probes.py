"""The probes of issue 28, items 4-7, against a real ``nekomem serve`` process.

    python -m bench.hostile_probes [--src DIR] [--only NAME ...]

``--src`` is the ``src`` folder of the nekomem to probe (default: this checkout's), so the
same probes measure an older tree (``git archive <commit> | tar -x -C /tmp/before``) and
this one. Each probe starts its own server on a fresh memory root (embeddings off) and
prints one row: what was measured and the number. Bounds on every wait keep a probe of a
server without the guards finite (the row then says "held >= N s").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench._common import SMOKE_HELP

HERE = Path(__file__).resolve().parents[1]


class Server:
    """``python -m nekomem serve`` from ``src`` on a fresh root."""

    def __init__(self, src: Path, root: Path, env: dict[str, str] | None = None, preexec: Callable[[], None] | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = root
        environ = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
        environ.update({"PYTHONPATH": str(src), "NEKOMEM_EMBEDDING_ENABLED": "false", "NEKOMEM_LOG_LEVEL": "ERROR", **(env or {})})
        cmd = [sys.executable, "-m", "nekomem", "serve", "--port", str(self.port), "--memory-root", str(root)]
        self.proc = subprocess.Popen(cmd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if not httpx.get(self.url + "/health", timeout=1).json()["limited_mode"]:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.1)
        raise RuntimeError("the server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Sizes:
    """How much each probe does; ``--smoke`` shrinks every one (the rows then say little, but
    every probe runs to its end)."""

    short_body_cap: float = 180.0
    trickle_connections: int = 1000
    trickle_seconds: float = 45.0
    burst: int = 2000
    burst_read_after: float = 5.0
    time_repeats: int = 70_000
    fd_characters: int = 600


SMOKE_SIZES = Sizes(
    short_body_cap=2.0, trickle_connections=20, trickle_seconds=2.0, burst=40, burst_read_after=0.2, time_repeats=700, fd_characters=20
)
SIZES = Sizes()


def _sock(srv: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=5)


def _held(sock: socket.socket, cap: float) -> float:
    """Seconds until the server closes ``sock`` (at most ``cap``)."""
    started = time.monotonic()
    sock.settimeout(0.5)
    while time.monotonic() - started < cap:
        try:
            if not sock.recv(65536):
                break
        except TimeoutError:
            continue
        except OSError:
            break
    return time.monotonic() - started


def probe_short_body(srv: Server) -> str:
    sock = _sock(srv)
    sock.sendall(b"POST /query_memory/Lan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    held = _held(sock, SIZES.short_body_cap)
    sock.close()
    return f"connection held {held:.1f} s" + (" (cap)" if held >= SIZES.short_body_cap else "")


def probe_trickle(srv: Server) -> str:
    count, seconds = SIZES.trickle_connections, SIZES.trickle_seconds
    socks = []
    for _ in range(count):
        try:
            s = _sock(srv)
            s.setblocking(False)
            socks.append(s)
        except OSError:
            break
    started = time.monotonic()
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4096
    step = 0
    while time.monotonic() - started < seconds:
        for s in socks:
            try:
                s.send(head[step : step + 1])
            except OSError:
                pass
        step += 1
        time.sleep(1.0)
    alive = 0
    for s in socks:
        try:
            s.recv(65536, socket.MSG_PEEK)  # an answer (408) or b"": closed by the server
        except BlockingIOError:
            alive += 1  # nothing sent back and not closed: still held open
        except OSError:
            pass
        s.close()
    return f"{alive} of {len(socks)} trickling connections still open after {seconds:.0f} s"


async def _burst(srv: Server, count: int) -> str:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120, limits=limits) as client:
        body = {"input_history": [{"role": "user", "content": "hello there"}]}

        async def one(i: int) -> tuple[int, float, bool]:
            t = time.monotonic()
            try:
                r = await client.post(f"/cache/B{i % 50}", json=body)
            except httpx.HTTPError:
                return 0, time.monotonic() - t, False  # the connection failed
            return r.status_code, time.monotonic() - t, "retry-after" in r.headers

        async def read() -> float:
            # From another process (curl), so that this client's own load is not measured;
            # a few seconds in, while the server holds the burst.
            await asyncio.sleep(SIZES.burst_read_after)
            proc = await asyncio.create_subprocess_exec(
                "curl", "-s", "-o", "/dev/null", "-w", "%{time_total}", srv.url + "/api/characters", stdout=asyncio.subprocess.PIPE
            )
            out, _ = await proc.communicate()
            return float(out or b"nan")

        results, read_s = await asyncio.gather(asyncio.gather(*(one(i) for i in range(count))), read())
    ok = [d for s, d, _ in results if s == 200]
    busy = [d for s, d, ra in results if s == 503 and ra]
    p50 = statistics.median([d for _, d, _ in results])
    busy_p50 = statistics.median(busy) if busy else float("nan")
    failed = sum(1 for s, _, _ in results if s == 0)
    return (
        f"{len(ok)} × 200, {len(busy)} × 503+Retry-After (their p50 {busy_p50:.2f} s), {failed} connection errors; "
        f"p50 of all {p50:.2f} s (client-side, one Python process); a read from curl during it {read_s:.2f} s"
    )


def probe_burst(srv: Server) -> str:
    return asyncio.run(_burst(srv, SIZES.burst))


async def _long_time(srv: Server) -> str:
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
        await client.post("/cache/Other", json={"input_history": [{"role": "user", "content": "hi"}]})
        await client.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "I drank tea"}]})
        spec = "2026年5月7日" + "の前日" * SIZES.time_repeats

        async def heavy() -> tuple[int, str, float]:
            t = time.monotonic()
            r = await client.post("/query_memory/Lan", json={"query": "tea", "time": spec})
            return r.status_code, r.json().get("error_code", ""), time.monotonic() - t

        async def other() -> tuple[int, float]:
            await asyncio.sleep(0.3)
            t = time.monotonic()
            r = await client.post("/cache/Other", json={"input_history": [{"role": "user", "content": "still"}]})
            return r.status_code, time.monotonic() - t

        a, b, c = await asyncio.gather(heavy(), heavy(), other())
    return f"time × {SIZES.time_repeats:,}: {a[0]} {a[1] or ''} in {a[2]:.1f} s and {b[0]} in {b[2]:.1f} s; other character's /cache {c[0]} in {c[1]:.2f} s"


def probe_long_time(srv: Server) -> str:
    return asyncio.run(_long_time(srv))


def probe_deep_time(srv: Server) -> str:
    httpx.post(srv.url + "/cache/Lan", json={"input_history": [{"role": "user", "content": "I drank tea"}]}, timeout=60)
    r = httpx.post(srv.url + "/query_memory/Lan", json={"query": "tea", "time": "the day before " * 2000 + "today"}, timeout=120)
    short = httpx.post(srv.url + "/query_memory/Lan", json={"query": "tea", "time": "2026年5月7日" + "の前日" * 20}, timeout=120)
    return f"2,000-deep: {r.status_code} {r.json().get('error_code', '')}; 20-deep (60 chars): {short.status_code} {short.json().get('error_code', '')}"


def probe_fds(src: Path, root: Path) -> str:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    srv = Server(src, root, preexec=lower)
    try:
        codes: dict[str, int] = {}
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            for i in range(SIZES.fd_characters):
                r = client.post(f"/cache/F{i}", json={"input_history": [{"role": "user", "content": "hi"}]})
                key = "200" if r.status_code == 200 else f"{r.status_code} {r.json().get('error_code')}"
                codes[key] = codes.get(key, 0) + 1
            health = client.get("/health").json()
        return f"ulimit -n 1024, {SIZES.fd_characters} characters: {codes}; /health storage {health['storage']['state']}"
    finally:
        srv.stop()


def probe_token(src: Path, root: Path) -> str:
    token = "ねこのトークン"
    srv = Server(src, root, env={"NEKOMEM_API_TOKEN": token})
    try:
        r = httpx.get(srv.url + "/api/characters", headers={"Authorization": f"Bearer {token}".encode()}, timeout=30)
        return f"non-ASCII token: {r.status_code}"
    finally:
        srv.stop()


def probe_import_root(srv: Server) -> str:
    out = []
    for path in ("/etc", "/root", "/nonexistent"):
        r = httpx.post(srv.url + "/api/import/neko", json={"source_dir": path}, timeout=30)
        out.append(f"{path}: {r.status_code} {r.json().get('error_code', '')}")
    return "; ".join(out)


def probe_patch(srv: Server) -> str:
    httpx.post(srv.url + "/cache/Lan", json={"input_history": [{"role": "user", "content": "short"}]}, timeout=30)
    r = httpx.patch(srv.url + "/api/characters/Lan/recent/0", json={"text": "x" * 7_000_000}, timeout=60)
    return f"PATCH 7 MB text: {r.status_code} {r.json().get('error_code', '') if r.status_code != 200 else ''}"


def probe_failed_character(src: Path, root: Path) -> str:
    (root / "Lan").mkdir(parents=True)
    (root / "Lan" / "facts.json").mkdir()
    srv = Server(src, root)
    try:
        t = time.monotonic()
        r = httpx.get(srv.url + "/api/characters/Lan/facts", timeout=120)
        return f"folder in place of facts.json: {r.status_code} {r.json().get('error_code', '')} in {time.monotonic() - t:.1f} s"
    finally:
        srv.stop()


SERVED = {
    "short_body": probe_short_body,
    "trickle": probe_trickle,
    "burst": probe_burst,
    "long_time": probe_long_time,
    "deep_time": probe_deep_time,
    "import_root": probe_import_root,
    "patch": probe_patch,
}
OWN = {"fds": probe_fds, "token": probe_token, "failed_character": probe_failed_character}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=HERE / "src")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    global SIZES
    SIZES = SMOKE_SIZES if args.smoke else Sizes()
    names = args.only or [*SERVED, *OWN]
    work = Path(tempfile.mkdtemp(prefix="nekomem-probes-"))
    shared: Server | None = None  # --smoke: one server for every served probe (start-up is most of a smoke run)
    try:
        for name in names:
            root = work / name / "memory"
            if name in OWN:
                row = OWN[name](args.src, root)
            elif args.smoke:
                shared = shared or Server(args.src, work / "shared" / "memory")
                row = SERVED[name](shared)
            else:
                srv = Server(args.src, root)
                try:
                    row = SERVED[name](srv)
                finally:
                    srv.stop()
            print(f"| {name} | {row} |", flush=True)
    finally:
        if shared is not None:
            shared.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
