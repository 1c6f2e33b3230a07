"""Lexical recall latency: LexicalIndex against rank_bm25.BM25Okapi on synthetic memories.

Run from the project root: ``python -m bench.recall_latency``. Builds corpora of 1k, 10k and
100k short facts (half English-like, half spaceless Chinese/Japanese-like, from a seeded
generator with Zipf-distributed vocabularies), times 200 queries per size against our index
and a baseline that scores the same tokenized corpus with ``BM25Okapi.get_scores`` plus a
top-k selection, and prints p50/p99 per size and the ratios. Also times single-document
writes (update = remove + add) on the largest index.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
from rank_bm25 import BM25Okapi

from bench._common import smoke_option
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.tokenize import tokenize

SEED = 20261201
SIZES = (1_000, 10_000, 100_000)
QUERIES = 200
BASELINE_QUERIES = {1_000: 200, 10_000: 200, 100_000: 100}
TOP_K = 4
WRITES = 500

_ONSETS = [
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "ch",
    "cl",
    "dr",
    "fl",
    "gr",
    "pl",
    "sh",
    "st",
    "th",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "oo"]
_CODAS = ["", "n", "r", "s", "t", "l", "m", "nd", "ng", "ck", "st"]
_FUNCTION_WORDS = [
    "the",
    "and",
    "likes",
    "with",
    "was",
    "her",
    "his",
    "at",
    "in",
    "on",
    "to",
    "of",
    "master",
    "yesterday",
    "always",
    "never",
    "favourite",
    "wants",
    "said",
    "about",
]
_KANA = [chr(c) for c in range(0x30A1, 0x30F7)]
_PARTICLES = ["の", "を", "は", "が", "に", "了", "的", "在", "和"]


class Corpus:
    """Seeded generator of short bilingual facts and of queries drawn from the same vocabularies."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.en_words = self._english_vocabulary(6000)
        self.cjk_words = self._cjk_vocabulary(4000)
        self.en_cdf = np.cumsum(self._zipf(len(self.en_words)))
        self.cjk_cdf = np.cumsum(self._zipf(len(self.cjk_words)))

    def _zipf(self, n: int, s: float = 1.05) -> np.ndarray:
        weights = 1.0 / np.arange(1, n + 1) ** s
        return weights / weights.sum()

    def _english_vocabulary(self, n: int) -> list[str]:
        words: dict[str, None] = {}
        while len(words) < n:
            syllables = self.rng.integers(1, 4)
            word = "".join(
                _ONSETS[self.rng.integers(len(_ONSETS))] + _VOWELS[self.rng.integers(len(_VOWELS))] + _CODAS[self.rng.integers(len(_CODAS))]
                for _ in range(syllables)
            )
            if len(word) >= 3:
                words[word] = None
        return list(words)

    def _cjk_vocabulary(self, n: int) -> list[str]:
        han = [chr(c) for c in range(0x4E00, 0x4E00 + 2500)]
        words: dict[str, None] = {}
        while len(words) < n:
            if self.rng.random() < 0.2:
                word = "".join(_KANA[self.rng.integers(len(_KANA))] for _ in range(self.rng.integers(3, 6)))
            else:
                word = "".join(han[self.rng.integers(len(han))] for _ in range(self.rng.integers(1, 4)))
            words[word] = None
        return list(words)

    def _draw(self, words: list[str], cdf: np.ndarray, count: int) -> list[str]:
        picks = np.searchsorted(cdf, self.rng.random(count), side="right")
        return [words[min(int(i), len(words) - 1)] for i in picks]

    def fact(self) -> str:
        if self.rng.random() < 0.5:
            words = self._draw(self.en_words, self.en_cdf, int(self.rng.integers(4, 10)))
            words += [_FUNCTION_WORDS[i] for i in self.rng.integers(len(_FUNCTION_WORDS), size=self.rng.integers(2, 5))]
            self.rng.shuffle(words)
            return " ".join(words)
        parts = self._draw(self.cjk_words, self.cjk_cdf, int(self.rng.integers(3, 7)))
        return "".join(p + _PARTICLES[self.rng.integers(len(_PARTICLES))] for p in parts)

    def query(self) -> str:
        if self.rng.random() < 0.5:
            return " ".join(self._draw(self.en_words, self.en_cdf, int(self.rng.integers(2, 4))))
        return "".join(self._draw(self.cjk_words, self.cjk_cdf, int(self.rng.integers(1, 3))))


def percentiles(samples: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return p50 * 1000.0, p99 * 1000.0


def timed(fn: Callable[[str], object], queries: Sequence[str]) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    smoke_option(parser, argv, sizes=[300])
    args = parser.parse_args(argv)

    gen = Corpus(SEED)
    largest = max(args.sizes)
    facts = [gen.fact() for _ in range(largest)]
    queries = [gen.query() for _ in range(QUERIES)]
    query_tokens = [tokenize(q) for q in queries]
    tokenized = [tokenize(f) for f in facts]

    results: dict[int, dict[str, float]] = {}
    print("ours: 2nd pass over the queries (1st pass = cold, right after the build); times in ms")
    print(
        f"{'docs':>8} {'build s':>8} {'cold p99':>9} {'ours p50':>9} {'ours p99':>9} "
        f"{'bm25 build s':>12} {'bm25 p50':>9} {'bm25 p99':>9} {'bm25 n':>6} {'p50 x':>7}"
    )
    index: LexicalIndex | None = None
    for size in sorted(args.sizes):
        t0 = time.perf_counter()
        index = LexicalIndex()
        for i in range(size):
            index.add(f"f{i}", facts[i])
        build = time.perf_counter() - t0
        built = index
        cold = timed(lambda q, built=built: built.search(q, TOP_K), queries)
        ours = timed(lambda q, built=built: built.search(q, TOP_K), queries)

        t0 = time.perf_counter()
        baseline = BM25Okapi(tokenized[:size])
        base_build = time.perf_counter() - t0
        n_base = BASELINE_QUERIES.get(size, QUERIES)

        def base_query(i_str: str, baseline: BM25Okapi = baseline) -> object:
            scores = baseline.get_scores(query_tokens[int(i_str)])
            top = np.argpartition(-scores, TOP_K)[:TOP_K]
            return top[np.argsort(-scores[top])]

        base = timed(base_query, [str(i) for i in range(n_base)])
        o50, o99 = percentiles(ours)
        c50, c99 = percentiles(cold)
        b50, b99 = percentiles(base)
        results[size] = {"o50": o50, "o99": o99, "b50": b50, "b99": b99}
        print(
            f"{size:>8} {build:>8.2f} {c99:>9.3f} {o50:>9.3f} {o99:>9.3f} {base_build:>12.2f} {b50:>9.3f} "
            f"{b99:>9.3f} {n_base:>6} {b50 / o50:>7.1f}"
        )

    smallest = min(results)
    print()
    print(
        f"ours {largest} / ours {smallest}: p50 x{results[largest]['o50'] / results[smallest]['o50']:.1f}, "
        f"p99 x{results[largest]['o99'] / results[smallest]['o99']:.1f}"
    )
    for size, r in sorted(results.items()):
        print(f"baseline / ours at {size}: p50 x{r['b50'] / r['o50']:.1f}, p99 x{r['b99'] / r['o99']:.1f}")

    assert index is not None
    new_facts = [gen.fact() for _ in range(WRITES)]
    write_times = []
    for text in new_facts:
        doc_id = f"f{int(gen.rng.integers(largest))}"
        t0 = time.perf_counter()
        index.update(doc_id, text)
        write_times.append(time.perf_counter() - t0)
    w50, w99 = percentiles(write_times)
    after = timed(lambda q: index.search(q, TOP_K), queries)  # type: ignore[union-attr]
    a50, a99 = percentiles(after)
    print(f"\nupdate at {largest}: p50 {w50:.3f} ms, p99 {w99:.3f} ms; queries after {WRITES} updates: p50 {a50:.3f} ms, p99 {a99:.3f} ms")


if __name__ == "__main__":
    main()
