"""Vector-leg latency with two models side by side: column-range searches against masked queries.

Run from the project root: ``python -m bench.vector_latency [--sizes 10000 100000]``.
Fills a :class:`~nekomem.recall.vectors.VectorIndex` with random two-model rows shaped like
``embedding_model = use+e5`` (a 512-wide and a 384-wide unit vector, each scaled by
1/sqrt(2)) and times, per query, the two vector legs recall runs (hubness-corrected, the
default weight 1.0, budget 8):

- ``masked``: each leg's query zeroed outside its columns and searched over all 896 columns,
  with a zero-padded centroid (how the legs searched before column ranges);
- ``strided``: each leg searched over its own columns only (``columns=(start, stop)``) of
  the same single array (a strided view of the matrix);
- ``blocks``: the same searches on an index that stores each model's columns as their own
  array (``blocks=[512]``, as RecallIndex builds it for ``use+e5``).

All three run in the same process on the same rows and queries, interleaved (the order
rotates per query), so their ratios hold on a loaded machine; every query's three answers
are checked to be the same ids. Printed per size: p50/p99 ms per query (both legs) over the
whole index and inside a 2% allowed set (a time-hinted leg), and the masked / strided and
masked / blocks ratios of the p50s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np

from bench._common import smoke_option
from bench.recall_latency import SEED, percentiles
from nekomem.config.recall import RecallSettings
from nekomem.recall.vectors import VectorIndex

SIZES = (10_000, 100_000)
BLOCKS = ((0, 512), (512, 896))
WEIGHT = float(1 / np.sqrt(2))
QUERIES = 200
BUDGET = 8
HUB = 1.0


def two_model_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` rows of two unit vectors, each scaled by 1/sqrt(2), side by side."""
    parts = []
    for start, stop in BLOCKS:
        block = rng.standard_normal((n, stop - start)).astype(np.float32)
        parts.append(block / np.linalg.norm(block, axis=1, keepdims=True) * WEIGHT)
    return np.concatenate(parts, axis=1)


Leg = Callable[[np.ndarray, "set[str] | None"], list[list[str]]]


def masked_legs(index: VectorIndex) -> Leg:
    def run(q: np.ndarray, allowed: set[str] | None) -> list[list[str]]:
        out = []
        centroid = index.centroid()
        for start, stop in BLOCKS:
            masked = np.zeros_like(q)
            masked[start:stop] = q[start:stop]
            padded = np.zeros_like(centroid)
            padded[start:stop] = centroid[start:stop] / WEIGHT
            hits = index.search(masked, BUDGET, allowed, min_score=0.0, hub=HUB, centroid=padded)
            out.append([d for d, _ in hits])
        return out

    return run


def column_legs(index: VectorIndex) -> Leg:
    def run(q: np.ndarray, allowed: set[str] | None) -> list[list[str]]:
        out = []
        centroid = index.centroid()
        for start, stop in BLOCKS:
            hits = index.search(q, BUDGET, allowed, min_score=0.0, hub=HUB, centroid=centroid[start:stop] / WEIGHT, columns=(start, stop))
            out.append([d for d, _ in hits])
        return out

    return run


def timed_ways(ways: Sequence[Leg], queries: np.ndarray, allowed: set[str] | None) -> list[list[float]]:
    """Every way on every query, rotating which goes first; asserts equal answers."""
    samples: list[list[float]] = [[] for _ in ways]
    for n, q in enumerate(queries):
        answers = []
        for i in range(len(ways)):
            way = (n + i) % len(ways)
            t0 = time.perf_counter()
            answers.append(ways[way](q, allowed))
            samples[way].append(time.perf_counter() - t0)
        assert all(a == answers[0] for a in answers), f"query {n}: the ways disagree"
    return samples


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    smoke_option(parser, argv, sizes=[500])
    args = parser.parse_args(argv)
    rng = np.random.default_rng(SEED)
    queries = two_model_rows(rng, QUERIES)
    print(f"{QUERIES} queries, two hubness-corrected legs (512 + 384 columns) per query; p50 / p99 in ms")
    print(f"{'docs':>8} {'rows':>5} {'masked':>15} {'strided':>15} {'blocks':>15} {'x strided':>10} {'x blocks':>9}")
    for size in sorted(args.sizes):
        settings = RecallSettings(recall_index_initial_capacity=1024)
        one, split = VectorIndex(BLOCKS[-1][1], settings), VectorIndex(BLOCKS[-1][1], settings, blocks=[BLOCKS[1][0]])
        for i, row in enumerate(two_model_rows(rng, size)):
            one.upsert(f"d{i}", row)
            split.upsert(f"d{i}", row)
        subset = {f"d{i}" for i in rng.choice(size, size // 50, replace=False)}
        ways = [masked_legs(one), column_legs(one), column_legs(split)]
        for way in ways:
            way(queries[0], None)  # fill the centroid-dot caches
        for label, allowed in (("all", None), ("2%", subset)):
            cells = [percentiles(t) for t in timed_ways(ways, queries, allowed)]
            text = " ".join(f"{p50:>7.2f} {p99:>7.2f}" for p50, p99 in cells)
            m50 = cells[0][0]
            print(f"{size:>8} {label:>5} {text} {m50 / cells[1][0]:>10.2f} {m50 / cells[2][0]:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
