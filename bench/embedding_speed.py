"""Embedding model speed and memory, the models side by side in one run.

Run from the project root: ``python -m bench.embedding_speed [--models use e5 use+e5]``.
Each model runs in a child process of its own (so its peak RSS is its own): load time, then
one query at a time (p50/p99 ms over the synthetic bilingual facts of
``bench.recall_latency``), then passages in batches of ``embedding_max_batch_size``
(passages per second), then the child's peak RSS. The last columns are ratios against the
first model of the list, measured in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench._common import smoke_option
from bench.recall_latency import SEED, Corpus

SINGLE = 200
BATCHED = 512


def measure_one(model: str) -> dict[str, float]:
    """Load ``model`` here and time it; returns the numbers (runs in the child)."""
    from nekomem.models.embeddings import EmbeddingService
    from tests.support.live import make_settings

    gen = Corpus(SEED)
    texts = [gen.fact() for _ in range(BATCHED)]
    queries = [gen.query() for _ in range(SINGLE)]
    started = time.perf_counter()
    service = EmbeddingService(make_settings(Path(tempfile.gettempdir()), embedding_model=model).embeddings)
    service.start()
    if not service.wait_ready(300):
        raise SystemExit(f"{model}: {service.reason}")
    load = time.perf_counter() - started
    service.embed(queries[:5], "query")  # warm-up
    samples = []
    for q in queries:
        t0 = time.perf_counter()
        service.embed([q], "query")
        samples.append(time.perf_counter() - t0)
    samples.sort()
    t0 = time.perf_counter()
    service.embed(texts, "passage")
    batched = time.perf_counter() - t0
    service.close()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "load_s": load,
        "query_p50_ms": statistics.median(samples) * 1000,
        "query_p99_ms": samples[int(len(samples) * 0.99) - 1] * 1000,
        "passages_per_s": len(texts) / batched,
        "peak_rss_mb": rss_mb,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["use", "e5", "use+e5"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    smoke_option(parser, argv, models=["use"])
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_one(args.child)))
        return
    rows: dict[str, dict[str, float]] = {}
    for model in args.models:
        out = subprocess.run([sys.executable, "-m", "bench.embedding_speed", "--child", model], capture_output=True, text=True, check=True)
        rows[model] = json.loads(out.stdout.strip().splitlines()[-1])
    base = rows[args.models[0]]
    print(
        f"{'model':>8} {'load s':>7} {'q p50 ms':>9} {'q p99 ms':>9} {'passages/s':>11} {'peak RSS MB':>12} {'p50 x':>6} {'thru x':>7} {'RSS x':>6}"
    )
    for model, r in rows.items():
        print(
            f"{model:>8} {r['load_s']:>7.2f} {r['query_p50_ms']:>9.2f} {r['query_p99_ms']:>9.2f} {r['passages_per_s']:>11.1f} "
            f"{r['peak_rss_mb']:>12.0f} {r['query_p50_ms'] / base['query_p50_ms']:>6.2f} "
            f"{r['passages_per_s'] / base['passages_per_s']:>7.2f} {r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f}"
        )


if __name__ == "__main__":
    main()
