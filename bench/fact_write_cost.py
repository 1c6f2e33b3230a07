"""Cost of adding one fact at 100 vs 100,000 stored facts (long-term memory issue).

Runs the real runtime in process (actors, journal, views, recall feed) on a temp memory
root, preloads N facts through FactActor, then times single-fact imports, each a full
message round trip through the character's actors. Prints p50, mean and p99 per size and
the ratio large/small. The view rewrite (batched: every ``view_flush_changes`` changes or
``view_flush_seconds``) is included in the mean, not hidden.

    python -m bench.fact_write_cost [--small 100] [--large 100000] [--samples 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench._common import smoke_option
from nekomem.actors.host import ACTORS
from nekomem.actors.messages import Flush, ImportFacts
from nekomem.config import load_settings
from nekomem.runtime.runtime import Runtime

SYLLABLES = "ka ki ku ke ko sa shi su se so ta chi tsu te to na ni nu ne no ha hi fu he ho ma mi mu me mo ra ri ru re ro".split()
COMMON = "master likes loves often goes visits wants has the a to with in on".split()


def _vocabulary(size: int) -> list[str]:
    rng = random.Random(0)
    return sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(2, 4))) for _ in range(size * 2)})[:size]


# A Zipf-like synthetic vocabulary: a few words everywhere, most words rare, as in real
# facts ("Master likes ..." + specifics).
VOCAB = _vocabulary(20_000)
WEIGHTS = [1.0 / (rank + 1) for rank in range(len(VOCAB))]


def fact_text(rng: random.Random, i: int) -> str:
    words = rng.sample(COMMON, 2) + rng.choices(VOCAB, weights=WEIGHTS, k=5)
    return " ".join(words)


def run(size: int, samples: int, chunk: int) -> list[float]:
    rng = random.Random(size)
    with tempfile.TemporaryDirectory() as root:
        settings = load_settings(None, env={}, overrides={"memory_root": str(Path(root)), "embedding_enabled": False})
        rt = Runtime(settings, actors=ACTORS)
        rt.start(background=False)
        try:
            ask = rt.registry.ask_sync
            for start in range(0, size, chunk):
                batch = [{"text": fact_text(rng, i), "importance": 5} for i in range(start, min(size, start + chunk))]
                ask("bench", "facts", lambda reply, b=batch: ImportFacts(facts=b, reply=reply), timeout=600)
            ask("bench", "facts", lambda reply: Flush(reply=reply), timeout=600)
            timings = []
            for i in range(samples):
                fact = [{"text": fact_text(rng, size + i), "importance": 5}]
                t0 = time.perf_counter()
                ask("bench", "facts", lambda reply, f=fact: ImportFacts(facts=f, reply=reply), timeout=600)
                timings.append(time.perf_counter() - t0)
            return timings
        finally:
            rt.stop()


def describe(timings: list[float]) -> tuple[float, float, float]:
    ordered = sorted(timings)
    return ordered[len(ordered) // 2] * 1000, statistics.fmean(timings) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=5000)
    smoke_option(parser, None, small=10, large=200, samples=20, chunk=100)
    args = parser.parse_args()
    results = {}
    for size in (args.small, args.large):
        t0 = time.perf_counter()
        results[size] = describe(run(size, args.samples, args.chunk))
        p50, mean, p99 = results[size]
        print(
            f"stored={size:>7}  add one fact: p50 {p50:7.2f} ms  mean {mean:7.2f} ms  p99 {p99:7.2f} ms  (run {time.perf_counter() - t0:.0f} s)"
        )
    small, large = results[args.small], results[args.large]
    print(
        f"ratio {args.large}/{args.small}: p50 {large[0] / small[0]:.2f}x  mean {large[1] / small[1]:.2f}x  p99 {large[2] / small[2]:.2f}x"
    )


if __name__ == "__main__":
    main()
