"""Public-knowledge lookup latency beside /query_memory, at the same number of documents.

Run from the project root: ``python -m bench.knowledge_latency [--sizes 10000] [--vectors]``.
For each size one in-process server (uvicorn in a thread, real HTTP on 127.0.0.1) gets the
same synthetic bilingual texts of ``bench.recall_latency`` twice: as knowledge entries,
imported through ``POST /internal/knowledge/packs/import`` in packs of at most 5,000
entries (the pack limit) and waited for as jobs, and as one character's facts, fed to its
recall index as ``bench.recall_http_latency`` does. Then every query goes to both routes in
turn (``/internal/knowledge/query`` with a 5 s budget, ``/query_memory/bench``). Printed per
size: the import seconds, then p50/p99 ms of each route and their ratio. Without
``--vectors`` both run BM25 only; with it both get random unit document vectors and the
real model embeds each query (hybrid), as in ``bench.recall_http_latency``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import smoke_option
from bench.recall_http_latency import NAME, build
from bench.recall_latency import SEED, Corpus, percentiles
from nekomem.config.embeddings import EmbeddingSettings
from nekomem.models.embeddings import EmbeddingService
from tests.support.live import LiveServer, make_settings

SIZES = (10_000,)
QUERIES = 200
PACK_ENTRIES = 5_000
K = "/internal/knowledge"


def import_packs(srv: LiveServer, texts: Sequence[str]) -> float:
    """Import ``texts`` as packs of PACK_ENTRIES and wait for every job; returns seconds."""
    started = time.perf_counter()
    for n, lo in enumerate(range(0, len(texts), PACK_ENTRIES)):
        entries = [{"title": f"entry {i}", "content": texts[i]} for i in range(lo, min(len(texts), lo + PACK_ENTRIES))]
        pack = {
            "schema_version": 1,
            "pack_id": f"bench-{n}",
            "material_type": "knowledge",
            "source": {"name": "bench", "license": "CC0-1.0"},
            "entries": entries,
        }
        answer = srv.post(
            f"{K}/packs/import", content=json.dumps(pack, ensure_ascii=False), headers={"Content-Type": "application/json"}
        ).json()
        assert answer["ok"], answer
        deadline = time.monotonic() + 600
        while True:
            jobs = {job["job_id"]: job for job in srv.get(f"{K}/packs/jobs").json()["jobs"]}
            state = jobs[answer["job_id"]]["state"]
            if state == "active":
                break
            assert state in ("queued", "building"), jobs[answer["job_id"]]
            if time.monotonic() > deadline:
                raise RuntimeError("the import did not finish in 600 s")
            time.sleep(0.05)
    return time.perf_counter() - started


def give_vectors(srv: LiveServer, dim: int, rng: np.random.Generator) -> None:
    """Random unit vectors for every knowledge entry, set directly (as the memory side's are)."""
    st = srv.runtime.knowledge.st
    with st.lock:
        for doc_id in list(st.index.entries):
            vec = rng.standard_normal(dim).astype(np.float32)
            st.index.set_vector(doc_id, vec / np.linalg.norm(vec), st.legs())


def measure(srv: LiveServer, queries: Sequence[str]) -> tuple[tuple[float, float], tuple[float, float], dict[str, int]]:
    routes: list[tuple[str, Any]] = [
        (f"{K}/query", lambda q: {"query": q, "budget_ms": 5000, "limit": 3}),
        (f"/query_memory/{NAME}", lambda q: {"query": q}),
    ]
    samples: list[list[float]] = [[], []]
    results: dict[str, int] = {}
    for n, q in enumerate(queries):
        for i in range(2):
            k = (n + i) % 2
            path, body = routes[k]
            t0 = time.perf_counter()
            r = srv.post(path, json=body(q))
            samples[k].append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            if k == 0:
                result = r.json()["result"]
                results[result] = results.get(result, 0) + 1
    return percentiles(samples[0]), percentiles(samples[1]), results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--vectors", action="store_true", help="hybrid on both routes: the real model embeds each query")
    parser.add_argument("--queries", type=int, default=QUERIES)
    smoke_option(parser, argv, sizes=[100], queries=20)
    args = parser.parse_args(argv)
    gen = Corpus(SEED)
    texts = [gen.fact() for _ in range(max(args.sizes))]
    queries = [gen.query() for _ in range(args.queries)]
    rng = np.random.default_rng(SEED)
    emb: EmbeddingService | None = None
    if args.vectors:
        emb = EmbeddingService(make_settings(Path(tempfile.gettempdir()), embedding_model=EmbeddingSettings().embedding_model).embeddings)
        emb.start()
        emb.wait_ready(120)
        print(f"embeddings: {emb.state} {emb.model_id or emb.reason}")
        if not emb.is_ready:
            emb = None
    legs = "hybrid" if emb is not None else "bm25"
    print(f"{args.queries} queries per route, legs {legs}, times in ms")
    print(
        f"{'docs':>8} {'import s':>9} {'knowledge p50':>14} {'p99':>8} {'query_memory p50':>17} {'p99':>8} {'ratio p50':>10}  knowledge results"
    )
    for size in sorted(args.sizes):
        with tempfile.TemporaryDirectory(prefix="nekomem-knowledge-lat-") as tmp:
            settings = make_settings(Path(tmp), recall_legs="both" if emb else "bm25", embedding_enabled=emb is not None)
            with LiveServer(settings, embeddings=emb) as srv:
                imported = import_packs(srv, texts[:size])
                build(srv, texts[:size], emb.model_id if emb else None, (emb.dim or 0) if emb else 0, rng)
                if emb is not None:
                    give_vectors(srv, emb.dim or 0, rng)
                (k50, k99), (m50, m99), results = measure(srv, queries)
                print(
                    f"{size:>8} {imported:>9.2f} {k50:>14.2f} {k99:>8.2f} {m50:>17.2f} {m99:>8.2f} {k50 / m50:>10.2f}  {results}",
                    flush=True,
                )
    if emb is not None:
        emb.close()


if __name__ == "__main__":
    main()
