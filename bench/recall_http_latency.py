"""End-to-end /query_memory latency with both legs at 1k, 10k and 100k memories.

Run from the project root: ``python -m bench.recall_http_latency [--sizes 1000 10000 100000]
[--models use e5 use+e5] [--baseline] [--no-bm25]`` (default: the configured embedding_model);
the models run side by side in one run: every row's server is built first, then each query
goes to every server in turn, so their rows compare. ``--baseline`` adds a row
for the first model with the query-side rules of issue 13 switched off (no hubness
correction, no name-balanced query vector, no year look-back): recall as it was before
them, the reference of "within 2x". ``--no-bm25`` skips the BM25-only row.
For each size a fresh in-process server (uvicorn in a thread, real HTTP on 127.0.0.1) gets
its character's recall index fed directly (``IndexUpsert`` through the registry, the way
FactActor feeds it at load) with the synthetic bilingual facts of ``bench.recall_latency``
and cached vectors: random unit vectors for the documents (so the build does not wait for
100k embeddings), tagged with the running model's id and the texts' sha256 so RecallActor
adopts them. Queries are real text embedded by the real model on the model pool. Printed
per size: index build seconds, then p50/p99 ms of hybrid, BM25-only (``recall_legs=bm25``
server) and time+query requests, and each row's p50 over the first row's. Without the model file only
the BM25 rows are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench._common import smoke_option
from bench.recall_latency import SEED, Corpus, percentiles
from nekomem.actors.messages import IndexEntry, IndexUpsert, ListEntries
from nekomem.config.embeddings import EmbeddingSettings
from nekomem.domain import vector_codec
from nekomem.models.embeddings import EmbeddingService, text_sha256
from tests.support.live import LiveServer, make_settings

SIZES = (1_000, 10_000, 100_000)
# The query-side rules of issue 13 switched off (recall as it was before them).
WITHOUT_RULES = {"recall_vector_hub_weight": 0.0, "recall_query_unnamed_weight": 0.0, "recall_query_time_year_lookback": 0}
QUERIES = 200
NAME = "bench"
FEED_CHUNK = 5_000


def build(srv: LiveServer, facts: Sequence[str], model: str | None, dim: int, rng: np.random.Generator) -> float:
    registry = srv.runtime.registry
    for owner in ("facts", "reflections"):  # let the owners send their own (empty) feed first
        registry.ask_sync(NAME, owner, lambda reply: ListEntries(reply=reply))
    started = time.perf_counter()
    for lo in range(0, len(facts), FEED_CHUNK):
        entries = []
        for i in range(lo, min(len(facts), lo + FEED_CHUNK)):
            text = facts[i]
            vec = vector_codec.encode(rng.standard_normal(dim).astype(np.float32)) if model else None
            day = 1 + i % 28
            entries.append(
                IndexEntry(
                    id=f"f{i}",
                    tier="fact",
                    text=text,
                    entity="master",
                    created_at=f"2026-02-{day:02d}T10:00:00+00:00",
                    event_start_at=f"2026-02-{day:02d}T10:00:00+00:00",
                    vector=vec,
                    vector_model=model,
                    text_sha256=text_sha256(text) if model else None,
                )
            )
        registry.tell(NAME, "recall", IndexUpsert(entries=entries))
    # Queued after the whole feed; on a loaded machine the first asks may time out (answered
    # 200 with error_code) while the actor still adopts the feed: ask again until one is served.
    deadline = time.monotonic() + 600
    while "error_code" in srv.post(f"/query_memory/{NAME}", json={"query": "warm up"}).json():
        if time.monotonic() > deadline:
            raise RuntimeError("the index was not ready after 600 s")
    return time.perf_counter() - started


def measure(servers: Sequence[LiveServer], queries: Sequence[str], time_spec: str | None = None) -> list[tuple[float, float]]:
    """p50/p99 ms per server; every query goes to every server in turn (the order rotates),
    so a change of the machine's load weighs on all rows alike."""
    samples: list[list[float]] = [[] for _ in servers]
    for n, q in enumerate(queries):
        body = {"query": q} if time_spec is None else {"query": q, "time": time_spec}
        for i in range(len(servers)):
            k = (n + i) % len(servers)
            t0 = time.perf_counter()
            r = servers[k].post(f"/query_memory/{NAME}", json=body)
            samples[k].append(time.perf_counter() - t0)
            assert r.status_code == 200 and "error_code" not in r.json(), r.text
    return [percentiles(s) for s in samples]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--models", nargs="*", default=[], help="embedding_model values to compare (default: the configured one)")
    parser.add_argument("--baseline", action="store_true", help="add the first model without the query-side rules")
    parser.add_argument("--no-bm25", action="store_true", help="skip the BM25-only row")
    smoke_option(parser, argv, sizes=[100])
    args = parser.parse_args(argv)
    gen = Corpus(SEED)
    facts = [gen.fact() for _ in range(max(args.sizes))]
    queries = [gen.query() for _ in range(QUERIES)]
    rng = np.random.default_rng(SEED)

    models = args.models or [EmbeddingSettings().embedding_model]
    services: dict[str, EmbeddingService] = {}
    for model in models:
        emb = services[model] = EmbeddingService(make_settings(Path(tempfile.gettempdir()), embedding_model=model).embeddings)
        emb.start()
        emb.wait_ready(120)
        print(f"embeddings {model}: {emb.state} {emb.model_id or emb.reason}")
    print(f"{QUERIES} queries per row, times in ms; rules: the query-side rules (hubness, unnamed query vector, look-back)")
    print(f"{'docs':>8} {'model':>8} {'legs':>6} {'rules':>6} {'build s':>8} {'p50':>8} {'p99':>8} {'+time p50':>10} {'+time p99':>10}")
    ready = [m for m, e in services.items() if e.is_ready]
    rows = [(m, "both", True) for m in ready]
    if args.baseline and ready:
        rows.insert(0, (ready[0], "both", False))
    if not args.no_bm25:
        rows.append(("-", "bm25", True))
    for size in sorted(args.sizes):
        with contextlib.ExitStack() as stack:
            servers, built = [], []
            for model, legs, rules in rows:  # every row's server lives for the whole size
                emb = services.get(model)
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="nekomem-recall-lat-"))
                chosen = model if emb is not None else models[0]
                off = {} if rules else WITHOUT_RULES
                settings = make_settings(Path(tmp), recall_legs=legs, embedding_model=chosen, embedding_enabled=legs == "both", **off)
                service = emb if settings.embeddings.embedding_enabled else None
                srv = stack.enter_context(LiveServer(settings, embeddings=service))
                built.append(build(srv, facts[:size], emb.model_id if emb is not None else None, (emb.dim or 0) if emb else 0, rng))
                servers.append(srv)
            plain = measure(servers, queries)
            timed = measure(servers, queries, "2026-02-10")
            for (model, legs, rules), seconds, (p50, p99), (t50, t99) in zip(rows, built, plain, timed, strict=True):
                print(
                    f"{size:>8} {model:>8} {legs:>6} {'on' if rules else 'off':>6} {seconds:>8.2f} {p50:>8.2f} {p99:>8.2f} {t50:>10.2f} {t99:>10.2f}",
                    flush=True,
                )
            base50 = plain[0][0]
            print(
                "p50 / first row: "
                + ", ".join(f"{m} {'on' if r else 'off'} {p50 / base50:.2f}x" for (m, _, r), (p50, _) in zip(rows, plain, strict=True))
            )
    for emb in services.values():
        emb.close()


if __name__ == "__main__":
    main()
