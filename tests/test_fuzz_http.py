"""Issue 10: property-based fuzzing of every operation of ``/openapi.json`` (schemathesis)
against a real server: no request may answer 5xx, and every store parses afterwards.

Bounded for CI. Generating a case (hypothesis drawing a body from the schema) costs far
more CPU than answering it, so generation runs in several worker processes at once
(:mod:`tests.support.fuzzing`), each sending to the same server over one keep-alive
connection. Hypothesis only generates: no shrinking (a passing run has nothing to
shrink), no example database, no deadline, no health checks. Cases per operation are
weighted by how much input it takes: ``BODY_EXAMPLES`` for an operation with a request
body, ``PARAM_EXAMPLES`` for one with free query/path parameters, and for the rest
(character name only, or nothing) their whole input space of at most seven requests. The
test asserts how many requests were answered (``FUZZ_REQUESTS``, default 5,000) and that
every operation of the document was among them. Generation is positive (valid per the
schema; invalid bodies have their own tests in test_http_errors and test_http_security).
``FUZZ_SEED`` repeats the generated cases of a run; ``FUZZ_WORKERS`` sets the processes
(default: the CPU count, 2 to 4)."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("schemathesis")

from tests.support import fuzzing, neko_fixture
from tests.support.live import ServerProcess

TARGET_REQUESTS = int(os.environ.get("FUZZ_REQUESTS", "5000"))
BODY_EXAMPLES = 270
PARAM_EXAMPLES = 200
WHOLE_SPACE = 20  # more than the seven names: hypothesis stops when it has tried each
WORKERS = int(os.environ.get("FUZZ_WORKERS", "0")) or max(2, min(4, os.cpu_count() or 2))
REFUSED_EXAMPLES = 3  # per operation with a body and refused name
VALID_NAMES = ["Lan", "Mio", "ねこ"]
REFUSED_NAMES = ["NUL", " ", "..", "a\u200bb"]


def check_stores(root: Path) -> int:
    """Parse every store under ``root``; returns how many files were checked."""
    checked = 0
    for path in root.rglob("*"):
        if not path.is_file() or ".corrupt-" in path.name:
            continue
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".ndjson":
            lines = path.read_bytes().split(b"\n")
            for line in lines[:-1]:  # the last piece is "" after a complete final line
                if line.strip():
                    json.loads(line)
            assert lines[-1] == b"", f"{path} ends in a torn line"
        elif path.suffix == ".db":
            with sqlite3.connect(path) as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        else:
            continue
        checked += 1
    return checked


@pytest.fixture
def workdir(tmp_path):
    # On a RAM file system when there is one: the run measures request handling, not fsync.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="nekomem-fuzz-") as folder:
            yield Path(folder)
    else:
        yield tmp_path


def narrow(document: dict[str, Any], import_sources: list[str]) -> None:
    """Fix the inputs that would otherwise test something else. Character names are a few,
    since each new valid name creates a character folder and name validation has its own
    tests (test_http_security, test_http_errors): valid and refused ones for an operation
    without a body; only valid ones for an operation with a body, whose generated body a
    refused name would throw away unread (:func:`refused_name_tasks` sends a few of
    those). The folder ``/api/import/neko`` reads is one of ``import_sources``, never a
    random path on this machine."""
    for item in document["paths"].values():
        for op in item.values():
            names = VALID_NAMES if "requestBody" in op else VALID_NAMES + REFUSED_NAMES
            for param in op["parameters"]:
                if param["name"] == "name":
                    param["schema"] = {"type": "string", "enum": names}
    body = document["paths"]["/api/import/neko"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    component = body["$ref"].rsplit("/", 1)[1]
    document["components"]["schemas"][component]["properties"]["source_dir"] = {"enum": import_sources}


def quotas(document: dict[str, Any]) -> dict[str, int]:
    """Cases to generate per ``"METHOD path"``, weighted by how much input the operation takes."""
    out: dict[str, int] = {}
    for path, item in document["paths"].items():
        for method, op in item.items():
            free = [p for p in op["parameters"] if "enum" not in p["schema"]]
            out[f"{method.upper()} {path}"] = BODY_EXAMPLES if "requestBody" in op else PARAM_EXAMPLES if free else WHOLE_SPACE
    return out


def refused_name_tasks(document: dict[str, Any], seed: int) -> list[fuzzing.Task]:
    """``REFUSED_EXAMPLES`` generated bodies for each operation with a body and a
    character name, and each refused name."""
    tasks = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            if "requestBody" in op and any(p["name"] == "name" for p in op["parameters"]):
                tasks += [fuzzing.Task(method, path, REFUSED_EXAMPLES, seed - len(tasks) - 1, name) for name in REFUSED_NAMES]
    return tasks


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU of a running process (Linux), for the run's summary line."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_fuzz_every_operation_no_5xx_and_stores_parse(workdir):
    root = workdir / "memory"
    import_sources = [str(workdir / "missing"), "relative/folder"]
    neko_fixture.build(workdir / "neko-memory")
    import_sources.append(str(workdir / "neko-memory"))
    seed = int(os.environ.get("FUZZ_SEED", random.randrange(2**31)))
    rerun = f"(repeat the generated cases with FUZZ_SEED={seed})"

    # A server process of its own, beside the generator processes.
    srv = ServerProcess(
        root,
        env={
            "NEKOMEM_MAX_BODY_BYTES": "65536",
            "NEKOMEM_ASK_TIMEOUT_SECONDS": "20",
            "NEKOMEM_LOG_LEVEL": "WARNING",
            "NEKOMEM_IMPORT_ROOT": str(workdir),
        },
    )
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            # Seed a character so that reads and edits meet real data.
            client.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "I like plums"}]}).raise_for_status()
            client.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master likes plums"}]}).raise_for_status()
            document = client.get("/openapi.json").json()
            narrow(document, import_sources)
            tasks = fuzzing.plan(document, quotas(document), seed) + refused_name_tasks(document, seed)
            outcome = fuzzing.run(document, srv.url, tasks, WORKERS, timeout=900)
            assert srv.proc is not None
            print(
                f"fuzz: {outcome.total} requests, {WORKERS} workers, seed {seed}, statuses {sorted(outcome.statuses.items())},"
                f" CPU: generators {outcome.cpu_seconds:.1f} s, server {server_cpu_seconds(srv.proc.pid):.1f} s"
            )

            assert outcome.crashes == [], outcome.crashes[:3]
            assert outcome.transport_errors == [], (rerun, outcome.transport_errors[:10])
            assert outcome.server_errors == [], (rerun, outcome.server_errors[:10])
            assert outcome.total >= TARGET_REQUESTS, (outcome.total, outcome.sent)
            assert set(outcome.sent) == {task.key for task in tasks}, "operations never requested"
            assert client.get("/health").json()["supervision"]["failed_children"] == 0
        assert srv.proc is not None and srv.proc.poll() is None, "the server died during the run"
    finally:
        srv.stop()
    assert check_stores(root) > 0
