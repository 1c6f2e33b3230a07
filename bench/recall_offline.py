"""LoCoMo recall quality without a server: the same import, index, query plan and fusion as
``/query_memory``, in process, on embeddings kept on disk between runs.

Run from the project root::

    .venv/bin/python -m bench.recall_offline [--data ../shared/data/locomo-dev]
        [--configs both] [--experiments NAME,...] [--conversations conv-26,conv-30]
        [--halves] [--depths 8,16,32] [--cache-dir DIR | --no-cache] [--json out.json]

``bench.locomo_quality`` measures through real HTTP and takes minutes per configuration;
this takes seconds once the texts' vectors are cached, so a sweep or an idea can be tried
quickly and then confirmed over HTTP. It follows the server's path step by step: the facts
are normalised and deduplicated as ``POST /api/characters/{name}/facts`` does
(``normalize_fact``, ``DedupIndex``), indexed as FactActor describes them
(``fact_index_entry``) in a :class:`RecallIndex` built as RecallActor builds it (stop names,
display time zone, model attach and backfill), and each question is planned
(``plan_query``), embedded, blended and searched as ``RecallActor`` does. The test
``tests/test_bench_recall_offline.py`` checks that every question gets the same rows here as
over HTTP. Configurations are ``bench.locomo_quality``'s (``--configs`` takes the same names
and sets).

``--halves`` also prints conv-26/30 and conv-41/42/43 apart (an overfitting check: a change
that only helps one half is noise). ``--depths`` prints, for each depth d, the evidence held
by each leg's best d hits (thresholds kept), by the union of those legs, and by the first d
rows of the fusion of legs that deep: how much better ranking could still find.
``--experiments`` runs each configuration again with each named idea of
:mod:`bench.recall_experiments` (ideas measured and not shipped).

The cache (default: ``nekomem-recall-offline`` under the system temp folder) holds one
``.npz`` per embedding model id: the texts' vectors, keyed by kind and text. A changed model
gets a new id, so stale vectors are never reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench._common import smoke_option
from bench.locomo_quality import (
    CATEGORIES,
    NAME,
    Services,
    bench_settings,
    config_names,
    load_conversation,
    overrides_of,
    resolve_data,
    smoke_folder,
    summarise,
)
from bench.recall_experiments import EXPERIMENTS, ExperimentIndex
from nekomem.config import Settings
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.facts import normalize_fact
from nekomem.layers.facts.state import fact_index_entry
from nekomem.models.embeddings import EmbeddingService, EmbedKind
from nekomem.recall.entry import display_tz
from nekomem.recall.index import RecallIndex
from nekomem.recall.names import blend_query_vectors
from nekomem.recall.query_plan import plan_query
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for

Vectors = npt.NDArray[np.float32]
HALVES = {"conv-26/30": ("conv-26", "conv-30"), "conv-41/42/43": ("conv-41", "conv-42", "conv-43")}
EMBED_BATCH = 64


class VectorCache:
    """The vectors of one embedding service's texts, computed once and kept in ``path``
    (None: in memory only). Raises EmbeddingsUnavailable (from the service) when a text is
    missing and the service is not ready."""

    def __init__(self, service: EmbeddingService, path: Path | None) -> None:
        self.service = service
        self.path = path
        self.rows: dict[tuple[str, str], Vectors] = {}
        self.dirty = False
        if path is not None and path.is_file():
            with np.load(path, allow_pickle=False) as saved:
                keys = json.loads(str(saved["keys"]))
                for (kind, text), row in zip(keys, saved["vectors"], strict=True):
                    self.rows[(kind, text)] = row

    def embed(self, texts: Sequence[str], kind: EmbedKind) -> Vectors:
        """Unit rows for ``texts`` (same order), from the cache or the service."""
        missing = list(dict.fromkeys(t for t in texts if (kind, t) not in self.rows))
        for start in range(0, len(missing), EMBED_BATCH):
            chunk = missing[start : start + EMBED_BATCH]
            for text, row in zip(chunk, self.service.embed(chunk, kind), strict=True):
                self.rows[(kind, text)] = np.asarray(row, dtype=np.float32)
            self.dirty = True
        if not texts:
            return np.zeros((0, int(self.service.dim or 0)), dtype=np.float32)
        return np.stack([self.rows[(kind, t)] for t in texts])

    def save(self) -> None:
        """Write the cache file if anything was added (atomically: a temp file, then rename)."""
        if self.path is None or not self.dirty or not self.rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self.rows)
        partial = self.path.with_suffix(".partial.npz")
        np.savez(partial, keys=np.array(json.dumps(keys)), vectors=np.stack([self.rows[k] for k in keys]))
        partial.replace(self.path)
        self.dirty = False


def cache_path(folder: Path, service: EmbeddingService) -> Path:
    """The cache file of ``service``'s loaded model inside ``folder``."""
    model = service.model_id or "none"
    return folder / f"{hashlib.sha256(model.encode()).hexdigest()[:16]}.npz"


@dataclass(frozen=True)
class Answer:
    """One question's category and evidence; for each returned row (best first) its text and
    the evidence ids it cites; for each leg fused, the evidence ids each of its hits cites."""

    category: int
    evidence: frozenset[str]
    texts: tuple[str, ...]
    rows: tuple[frozenset[str], ...]
    legs: tuple[tuple[frozenset[str], ...], ...]

    def score(self, rows: Sequence[frozenset[str]] | None = None) -> float:
        """The share of the evidence cited by ``rows`` (default: the returned rows)."""
        cited = frozenset().union(*(self.rows if rows is None else rows))
        return len(self.evidence & cited) / len(self.evidence)


class OfflineCharacter:
    """One character's recall index built from imported facts, as the server builds it."""

    def __init__(
        self, settings: Settings, facts: list[dict[str, Any]], vectors: VectorCache | None, name: str = NAME, experiment: str = ""
    ) -> None:
        self.settings = settings
        self.s = settings.recall
        self.vectors = vectors
        names = [settings.recent.master_name, name, *self.s.recall_extra_stop_names]
        analyzer = LexicalAnalyzer(self.s, stop_names_for(names))
        tz = display_tz(settings.server.display_timezone)
        if experiment:
            index = ExperimentIndex(self.s, tz, analyzer)
            index.experiment = EXPERIMENTS[experiment]
            index.embed = self._embed
            self.index: RecallIndex = index
        else:
            self.index = RecallIndex(self.s, tz, analyzer)
        self.cites: dict[str, frozenset[str]] = {}
        self._import(facts)

    def _import(self, items: list[dict[str, Any]]) -> None:
        now = datetime.now(self.index.tz)
        longterm = self.settings.longterm
        new = []
        for item in items:
            fact = normalize_fact(item, now=now, source="user_observation", settings=longterm)
            if fact is None:
                raise ValueError(f"a fact has no usable text: {item!r}")
            new.append(fact)
            ref = item.get("source") or {}
            self.cites[fact.id] = frozenset(ref.get("dia_ids", [])) if isinstance(ref, dict) else frozenset()
        accepted = DedupIndex(longterm.fact_near_dup_jaccard_threshold, longterm.fact_near_dup_max_candidates).dedup(new).accepted
        self.index.upsert(fact_index_entry(f, "fact") for f in accepted)
        service = self.vectors.service if self.vectors is not None else None
        if service is None or not service.is_ready or self.s.recall_legs == "bm25":
            return
        assert self.vectors is not None
        self.index.attach_model(service.model_id or "", int(service.dim or 0), service.legs)
        pending, texts = self.index.take_backfill(len(self.index.docs) + 1)
        self.index.commit_backfill(pending)
        self.index.store_backfill(pending, self.vectors.embed(texts, "passage"))

    def _embed(self, texts: list[str], kind: EmbedKind) -> Vectors:
        if self.vectors is None:
            raise ValueError("this configuration has no embedding model")
        return self.vectors.embed(texts, kind)

    def ask(self, question: str) -> tuple[list[str], list[list[str]]]:
        """The ids ``/query_memory`` would return for ``question`` (best first) and the legs."""
        query = question.strip()[: self.s.recall_query_max_chars]
        plan = plan_query(query, "", datetime.now(self.index.tz), self.index, self.s, 0.0, None)
        if isinstance(self.index, ExperimentIndex):
            self.index.question = plan.search
        qvec = None
        wants_vector = self.s.recall_legs != "bm25" and self.index.vector_count() and (plan.allowed is None or plan.allowed)
        if wants_vector and self.vectors is not None and plan.vector_texts:
            qvec = blend_query_vectors(list(self.vectors.embed(list(plan.vector_texts), "query")), self.s.recall_query_unnamed_weight)
        hits, legs = self.index.search(plan.search, qvec, plan.allowed, plan.hinted)
        return [entry.id for entry, _ in hits], legs

    def leg_names(self) -> list[str]:
        """Names of the legs every search starts with: BM25, then one per vector model."""
        return ["bm25", *(leg.name for leg in self.index.vector_legs)] if self.index.vector_legs else ["bm25", "vector"]

    def cited(self, ids: Sequence[str], evidence: frozenset[str]) -> tuple[frozenset[str], ...]:
        """For each of ``ids``, the ids of ``evidence`` its fact cites."""
        return tuple(self.cites.get(doc_id, frozenset()) & evidence for doc_id in ids)


def run_conversation(
    settings: Settings, vectors: VectorCache | None, facts: list[dict[str, Any]], questions: list[dict[str, Any]], experiment: str = ""
) -> tuple[list[Answer], list[str]]:
    """Every question of one conversation asked of a fresh offline character (searching
    with ``experiment``'s legs when given); the answers and the names of the legs each
    search starts with."""
    character = OfflineCharacter(settings, facts, vectors, experiment=experiment)
    answers = []
    for q in questions:
        evidence = frozenset(q["evidence"])
        ids, legs = character.ask(q["question"])
        texts = tuple(character.index.docs[i].entry.text for i in ids)
        answers.append(
            Answer(q["category"], evidence, texts, character.cited(ids, evidence), tuple(character.cited(leg, evidence) for leg in legs))
        )
    return answers, character.leg_names()


class Runner:
    """Runs configurations over conversations, one cached embedding service per model."""

    def __init__(self, conversations: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], cache_dir: Path | None) -> None:
        self.conversations = conversations
        self.cache_dir = cache_dir
        self.services = Services()
        self.caches: dict[str, VectorCache] = {}

    def vectors(self, settings: Settings) -> VectorCache | None:
        if not settings.embeddings.embedding_enabled:
            return None
        service = self.services.get(settings.embeddings)
        if not service.is_ready:
            return None
        key = service.model_id or ""
        if key not in self.caches:
            self.caches[key] = VectorCache(service, cache_path(self.cache_dir, service) if self.cache_dir else None)
        return self.caches[key]

    def run(self, overrides: dict[str, Any], experiment: str = "") -> tuple[dict[str, list[Answer]], list[str]]:
        """Answers per conversation under ``overrides`` (and ``experiment``), and the names of the base legs."""
        settings = bench_settings(Path(tempfile.gettempdir()), **overrides)
        vectors = self.vectors(settings)
        out: dict[str, list[Answer]] = {}
        legs: list[str] = []
        for name, (facts, questions) in self.conversations.items():
            out[name], legs = run_conversation(settings, vectors, facts, questions, experiment)
        if vectors is not None:
            vectors.save()
        return out, legs

    def close(self) -> None:
        self.services.close()


def table_row(label: str, row: dict[str, float], extra: Sequence[str] = ()) -> str:
    cells = [f"{row.get(c, float('nan')):>11.3f}" for c in [*CATEGORIES.values(), "overall"]]
    return " | ".join([f"{label:<32}", *cells, *extra])


def category_scores(
    answers: Sequence[Answer], rows_of: Callable[[Answer], Sequence[frozenset[str]]] | None = None
) -> list[tuple[int, float]]:
    """(category, score) per answer; ``rows_of(answer)`` picks the rows scored (default: the returned ones)."""
    return [(a.category, a.score(None if rows_of is None else rows_of(a))) for a in answers]


def depth_rows(answers: Sequence[Answer], legs: Sequence[str], depth: int) -> list[tuple[str, list[tuple[int, float]]]]:
    """Per-leg, union and fused evidence at ``depth`` (answers searched with legs that deep)."""
    n = len(legs)

    def leg_top(i: int) -> Callable[[Answer], Sequence[frozenset[str]]]:
        return lambda a: a.legs[i][:depth]

    out = [(f"{name} top {depth}", category_scores(answers, leg_top(i))) for i, name in enumerate(legs)]
    out.append((f"union of legs' top {depth}", category_scores(answers, lambda a: [c for leg in a.legs[:n] for c in leg[:depth]])))
    out.append((f"fused top {depth}", category_scores(answers)))
    return out


def report(runner: Runner, name: str, experiment: str, args: argparse.Namespace, results: dict[str, dict[str, float]]) -> None:
    """Run configuration ``name`` (with ``experiment``), print its rows and add them to ``results``."""
    label = f"{name} / {experiment}" if experiment else name
    started = time.monotonic()
    by_conv, _ = runner.run(overrides_of(name), experiment)
    results[label] = summarise(category_scores([a for conv in by_conv.values() for a in conv]))
    print(table_row(label, results[label], [f"{time.monotonic() - started:>11.1f}"]), flush=True)
    if args.halves:
        for half, members in HALVES.items():
            part = [a for conv in members if conv in by_conv for a in by_conv[conv]]
            if part:
                results[f"{label} {half}"] = summarise(category_scores(part))
                print(table_row(f"  {half}", results[f"{label} {half}"]))
    for depth in [int(d) for d in args.depths.split(",") if d.strip()]:
        deep, legs = runner.run({**overrides_of(name), "recall_budget_each": depth, "recall_budget_total": depth}, experiment)
        for row, scores in depth_rows([a for conv in deep.values() for a in conv], legs, depth):
            results[f"{label} {row}"] = summarise(scores)
            print(table_row(f"  {row}", results[f"{label} {row}"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/data/locomo-dev")
    parser.add_argument("--configs", default="both", help="configuration names or sets of bench.locomo_quality (a+b merges two)")
    parser.add_argument(
        "--experiments", default="", help=f"also run each configuration with these (bench.recall_experiments: {', '.join(EXPERIMENTS)})"
    )
    parser.add_argument("--conversations", default="", help="comma list of file stems to keep")
    parser.add_argument("--halves", action="store_true", help="also print conv-26/30 and conv-41/42/43 apart")
    parser.add_argument("--depths", default="", help="comma list of depths for the ranking-headroom table (e.g. 8,16,32)")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "nekomem-recall-offline"))
    parser.add_argument("--no-cache", action="store_true", help="keep vectors in memory only")
    parser.add_argument("--json", help="also write the rows to this file")
    smoke = smoke_option(parser, argv, configs="use")
    args = parser.parse_args(argv)

    experiments = [e.strip() for e in args.experiments.split(",") if e.strip()]
    unknown = [e for e in experiments if e not in EXPERIMENTS]
    if unknown:
        raise SystemExit(f"unknown experiments: {', '.join(unknown)} (known: {', '.join(EXPERIMENTS)})")
    folder = resolve_data(args.data)
    files = sorted((smoke_folder(folder) if smoke else folder).glob("*.json"))
    if args.conversations:
        keep = {c.strip() for c in args.conversations.split(",") if c.strip()}
        files = [f for f in files if f.stem in keep]
    conversations = {f.stem: load_conversation(f, "none") for f in files}
    names = config_names(args.configs)
    runner = Runner(conversations, None if args.no_cache else Path(args.cache_dir))
    print(f"LoCoMo offline: {len(files)} conversations, {sum(len(q) for _, q in conversations.values())} questions")
    print(" | ".join([f"{'config':<32}", *(f"{h:>11}" for h in [*CATEGORIES.values(), "overall", "seconds"])]))
    results: dict[str, dict[str, float]] = {}
    try:
        for name in names:
            for experiment in ["", *experiments]:
                report(runner, name, experiment, args, results)
    finally:
        runner.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
