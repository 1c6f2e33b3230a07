"""How long a character with a long memory takes to wake, and how fast facts go in.

    python -m bench.activation [--facts 50000] [--big 200000] [--http-import] [--smoke]

For each size: ``--facts`` facts are written into a fresh memory root through the documented
offline import (``nekomem import`` of a ``nekomem-export`` file, timed), ``python -m nekomem
serve`` is started on it (embeddings off), and the first ``/query_memory`` of the character
is timed; the server is restarted and the first ``/new_dialog`` is timed the same way. Beside
them, in the same run, a plain ``json.loads`` of the character's ``facts.json`` (best of three)
and the warm ``/query_memory`` p50. ``--baseline SRC`` (a ``src`` folder of another
version, e.g. ``git archive <commit> src | tar -x -C /tmp/base``) measures that version's
server on the same root too, so before and after come from one machine at one moment.
``--big`` repeats the measurement at a larger size (skipped in smoke).

``--embeddings MODEL`` measures the wake a default install meets: the server runs with that
embedding model (``use+e5`` is the default setting) and every fact carries a cached vector
of it, as the server stores them once computed (random unit vectors with the model's id
and the text's sha256: what is timed is reading them back, not the model). The server is
started and stopped once before the timed starts, so its recall segment and vector block
describe the views (the vectors are written into facts.json behind its back); that stop is
waited for however long it takes, and its time printed (a stop after the facts changed
writes both files). No HTTP import then (each fact would wait for the model).

``--http-import`` (on by default) also imports the same facts over HTTP,
``POST /api/characters/{name}/facts`` in batches of ``--batch``, into a running server, and
prints its time beside the offline import's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._common import print_table, smoke_option, start_nekomem, wait_embeddings_settled
from nekomem.domain import vector_codec
from nekomem.models.embeddings import text_sha256
from nekomem.stores.layout import CharacterPaths
from tests.support.live import ROOT

NAME = "Long"
QUERIES = ("what does master like to eat", "the cello lessons", "trip to Osaka in spring", "cats and tea", "weekend plans")
WORDS = (
    "master likes plays cello piano tea coffee jasmine morning evening weekend trip osaka kyoto tokyo spring "
    "summer autumn winter rain snow garden cat dog bird fish kite book novel film music concert friend sister "
    "brother mother father office work project deadline meeting lunch dinner breakfast ramen sushi curry bread "
    "cake walk run swim bike train bus station river mountain beach sea park library museum school exam "
    "birthday gift letter phone game chess puzzle paint draw photo camera song dance sleep dream late early"
).split()


def _fact(rng: random.Random, i: int, created: str) -> dict[str, Any]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16)))
    text = f"Master {words} (note {i})"
    return {"text": text, "importance": 1 + i % 10, "entity": ("master", "neko", "relationship")[i % 3], "event_start_at": created}


def make_facts(count: int, seed: int = 40) -> list[dict[str, Any]]:
    """``count`` imported facts with varied words (so the lexical index is realistic)."""
    rng = random.Random(seed)
    return [_fact(rng, i, f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}T10:00:00+00:00") for i in range(count)]


def export_document(facts: list[dict[str, Any]]) -> dict[str, Any]:
    """A ``nekomem-export`` file with one character holding ``facts`` as its facts.json."""
    stored = []
    for i, f in enumerate(facts):
        stored.append(
            {
                "id": f"fact_{i:07d}",
                "text": f["text"],
                "importance": f["importance"],
                "entity": f["entity"],
                "created_at": f["event_start_at"],
                "event_start_at": f["event_start_at"],
            }
        )
    character = {
        "format": "nekomem-character",
        "version": 1,
        "name": NAME,
        "files": {"facts.json": stored},
        "logs": {},
        "journal": {"rows": [], "cursors": {}, "sequence": 0},
    }
    return {"format": "nekomem-export", "version": 1, "exported_at": "2026-12-06T00:00:00+00:00", "characters": [character]}


def offline_import(root: Path, export_file: Path) -> float:
    """``nekomem import`` of ``export_file`` into ``root``; the seconds the process took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nekomem", "import", str(export_file), "--memory-root", str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"nekomem import failed: {done.stderr}")
    return time.monotonic() - started


def parse_seconds(path: Path) -> float:
    """Best of three plain json.loads of ``path`` (read included)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        json.loads(path.read_bytes())
        best = min(best, time.perf_counter() - started)
    return best


def _env(src: str | None, model: str | None = None) -> dict[str, str]:
    """The server's environment: embeddings off, or ``model`` embedding; ``src`` first on
    the path when given."""
    env = {"NEKOMEM_EMBEDDING_ENABLED": "false"} if model is None else {"NEKOMEM_EMBEDDING_MODEL": model}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join((src, str(ROOT)))
    return env


def _started(root: Path, src: str | None, model: str | None) -> tuple[Any, Any]:
    """A server on ``root`` whose embedding model (if any) has loaded: its load is not
    the wake's."""
    server, log = start_nekomem(root, env=_env(src, model), timeout=120)
    if model is not None and wait_embeddings_settled(server.url, timeout=300) != "ready":
        server.stop()
        raise SystemExit(f"the embedding model {model} did not load:\n{log.text()}")
    return server, log


def cache_vectors(root: Path, tmp: Path, model: str) -> str:
    """Give every fact of ``root`` a cached vector of ``model`` (the id a server reports,
    random unit rows of its width); the model id."""
    server, _ = _started(tmp / "probe", None, model)
    try:
        model_id = str(httpx.get(server.url + "/health", timeout=10).json()["embeddings"]["model"])
    finally:
        server.stop()
    dims = re.search(r"-(\d+)d-", model_id)
    if dims is None:
        raise SystemExit(f"cannot tell the width of {model_id}")
    dim = int(dims.group(1))
    path = CharacterPaths(root, NAME).facts
    facts = json.loads(path.read_bytes())
    rng = np.random.default_rng(40)
    for fact in facts:
        vec = rng.standard_normal(dim).astype(np.float32)
        fact.update(
            embedding=vector_codec.encode(vec / np.linalg.norm(vec)),
            embedding_model_id=model_id,
            embedding_text_sha256=text_sha256(fact["text"]),
        )
    path.write_bytes(json.dumps(facts, separators=(",", ":")).encode() + b"\n")  # laid out as the server writes its views
    return model_id


def first_request(root: Path, src: str | None, route: str, model: str | None = None, stops: list[float] | None = None) -> float:
    """Start a server on ``root``, time the first ``route`` of the character, stop it.
    ``stops``: the stop is waited for however long it takes (it writes the recall segment
    and vector block of the views as they are: a server killed meanwhile leaves the next
    wake without them) and its seconds appended."""
    server, log = _started(root, src, model)
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            started = time.perf_counter()
            if route == "query":
                answer = client.post(f"/query_memory/{NAME}", json={"query": QUERIES[0]})
            else:
                answer = client.get(f"/new_dialog/{NAME}")
            took = time.perf_counter() - started
            if answer.status_code != 200:
                raise SystemExit(f"{route}: {answer.status_code} {answer.text[:300]}\n{log.text()}")
            return took
    finally:
        stopping = time.perf_counter()
        server.stop(timeout=15.0 if stops is None else 1800.0)
        if stops is not None:
            stops.append(time.perf_counter() - stopping)


def warm_p50(root: Path, src: str | None, rounds: int, model: str | None = None) -> float:
    """p50 seconds of ``/query_memory`` once the character is awake: after a first query
    and a facts listing (answered by the fact actor once it has loaded and sent recall its
    complete index, so the next query comes after recall has taken it: nothing of the wake
    is still running, whichever version answered the first query how)."""
    server, _ = _started(root, src, model)
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            client.post(f"/query_memory/{NAME}", json={"query": "warm up"}).raise_for_status()
            client.get(f"/api/characters/{NAME}/facts", params={"limit": 1}).raise_for_status()
            client.post(f"/query_memory/{NAME}", json={"query": "warm up"}).raise_for_status()
            samples = []
            for i in range(rounds):
                started = time.perf_counter()
                client.post(f"/query_memory/{NAME}", json={"query": QUERIES[i % len(QUERIES)]}).raise_for_status()
                samples.append(time.perf_counter() - started)
            return statistics.median(samples)
    finally:
        server.stop()


def http_import(root: Path, facts: list[dict[str, Any]], batch: int, src: str | None = None) -> float:
    """Seconds to import ``facts`` over HTTP into a fresh character of a running server
    (of the version at ``src`` when given)."""
    server, log = start_nekomem(root, env=_env(src), timeout=120)
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            started = time.monotonic()
            added = 0
            for start in range(0, len(facts), batch):
                answer = client.post(f"/api/characters/{NAME}/facts", json={"facts": facts[start : start + batch]})
                if answer.status_code != 200:
                    raise SystemExit(f"HTTP import: {answer.status_code} {answer.text[:300]}\n{log.text()}")
                added += len(answer.json()["added"])
            took = time.monotonic() - started
            if added != len(facts):
                print(f"  (HTTP import added {added} of {len(facts)}: the rest were duplicates)")
            return took
    finally:
        server.stop()


def measure(count: int, tmp: Path, rounds: int, http: bool, batch: int, baseline: str | None, model: str | None = None) -> list[list[Any]]:
    facts = make_facts(count)
    export_file = tmp / f"export-{count}.json"
    export_file.write_bytes(json.dumps(export_document(facts)).encode())
    root = tmp / f"root-{count}"
    imported = offline_import(root, export_file)
    paths = CharacterPaths(root, NAME)
    facts_json = paths.facts
    if model is not None:
        model_id = cache_vectors(root, tmp, model)
        stops: list[float] = []
        first_request(root, None, "query", model, stops)  # the segment rebuilt for the views as they are now
        print(f"{count} facts: each with a cached vector of {model_id}")
        print(f"{count} facts: the stop that wrote the recall segment and vector block took {stops[0]:.1f} s")
    parse = parse_seconds(facts_json)
    # The import writes the facts' recall segment too (recall_index_persist); a baseline ignores it.
    segment = f", recall segment {paths.recall_segment.stat().st_size / 1e6:.1f} MB" if paths.recall_segment.exists() else ""
    print(
        f"{count} facts: facts.json {facts_json.stat().st_size / 1e6:.1f} MB{segment}, json.loads {parse * 1000:.0f} ms, "
        f"offline import {imported:.2f} s"
    )
    rows: list[list[Any]] = []
    versions: list[tuple[str, str | None]] = ([("baseline", baseline)] if baseline else []) + [("this", None)]
    for label, src in versions:
        query = first_request(root, src, "query", model)
        dialog = first_request(root, src, "dialog", model)
        warm = warm_p50(root, src, rounds, model)
        rows.append([count, label, query * 1000, query / parse, dialog * 1000, dialog / parse, warm * 1000])
    if http and model is None:
        for label, src in versions:
            took = http_import(tmp / f"http-{count}-{label}", facts, batch, src)
            rate = f"{count / took:.0f} facts/s, batches of {batch}"
            print(f"{count} facts, {label}: HTTP import {took:.2f} s ({rate}) vs offline import {imported:.2f} s")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--facts", type=int, default=50_000)
    parser.add_argument("--big", type=int, default=200_000, help="a second, larger size (0: skip)")
    parser.add_argument("--rounds", type=int, default=50, help="warm queries for the p50")
    parser.add_argument("--batch", type=int, default=5_000, help="facts per HTTP import request")
    parser.add_argument("--no-http-import", dest="http", action="store_false")
    parser.add_argument("--baseline", default=None, help="a src folder of another version, measured beside this one")
    parser.add_argument(
        "--embeddings",
        default=None,
        metavar="MODEL",
        help="run the server with this embedding model (e.g. use+e5), every fact with a cached vector",
    )
    smoke_option(parser, argv, facts=2_000, big=0, rounds=5, batch=500)
    args = parser.parse_args(argv)
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="nekomem-activation-bench-") as tmp:
        for count in [args.facts] + ([args.big] if args.big else []):
            rows += measure(count, Path(tmp), args.rounds, args.http and count == args.facts, args.batch, args.baseline, args.embeddings)
    print_table(["facts", "server", "first query ms", "× parse", "first new_dialog ms", "× parse", "warm query p50 ms"], rows)


if __name__ == "__main__":
    main()
