"""RecallActor through a real Runtime (real actors, real model pool, real embedding model
where its file exists): the index feed, vector caching, maintenance recall, timeouts and
the failure answer. HTTP-level behaviour is in test_http_recall.py."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nekomem.actors.host import ACTORS
from nekomem.actors.messages import IndexEntry, IndexRemove, IndexUpsert, ListEntries, QueryMemory, RankForStage2, RelatedFacts
from nekomem.domain import vector_codec
from nekomem.domain.layers import RECALL
from nekomem.models.embeddings import EmbeddingService, text_sha256
from nekomem.recall.names import blend_query_vectors, query_vector_texts
from nekomem.recall.query_text import lexical_text, light_stem, query_time_hint
from nekomem.runtime.runtime import Runtime
from tests.support.live import ROOT, make_settings

MODEL = ROOT / "models" / "use-multilingual-v3" / "model.onnx"
NAME = "Lan"


@pytest.fixture(scope="module")
def real_embeddings(tmp_path_factory: pytest.TempPathFactory) -> EmbeddingService:
    if not MODEL.is_file():
        pytest.skip(f"embedding model not installed at {MODEL} (run scripts/fetch_model.py)")
    service = EmbeddingService(make_settings(tmp_path_factory.mktemp("emb")).embeddings)
    service.start()
    if not service.wait_ready(60):
        pytest.skip(f"embedding model did not load: {service.reason}")
    return service


class Spy:
    """The real service, counting what it embeds (and optionally slow for queries)."""

    def __init__(self, inner: EmbeddingService, query_delay: float = 0.0, broken_model_id: bool = False) -> None:
        self.inner = inner
        self.query_delay = query_delay
        self.broken = broken_model_id
        self.lock = threading.Lock()
        self.embedded: dict[str, int] = {"query": 0, "passage": 0}

    state = property(lambda self: self.inner.state)
    is_ready = property(lambda self: self.inner.is_ready)
    dim = property(lambda self: self.inner.dim)
    reason = property(lambda self: self.inner.reason)

    @property
    def model_id(self) -> str | None:
        if self.broken:
            raise RuntimeError("a broken embedding component")
        return self.inner.model_id

    def start(self) -> None:
        pass

    def embed(self, texts: list[str], kind: str = "passage") -> Any:
        if kind == "query" and self.query_delay:
            time.sleep(self.query_delay)
        with self.lock:
            self.embedded[kind] += len(texts)
        return self.inner.embed(texts, kind)

    def embed_for_user(self, texts: list[str], on_done: Any, expires: float | None = None) -> None:
        """The user-query path: counted, delayed like embed (on a thread of its own, as the
        real call does not hold its caller), then the real service's."""

        def run() -> None:
            if self.query_delay:
                time.sleep(self.query_delay)
            with self.lock:
                self.embedded["query"] += len(texts)
            self.inner.embed_for_user(texts, on_done, expires=expires)

        threading.Thread(target=run, daemon=True).start()


def start_runtime(tmp_path: Path, embeddings: Any = None, **overrides: Any) -> Runtime:
    rt = Runtime(make_settings(tmp_path, **overrides), actors=ACTORS, embeddings=embeddings)
    rt.start(background=False)
    # Let the owners load (and send their own, empty, index feed) before the test feeds it.
    for owner in ("facts", "reflections"):
        rt.registry.ask_sync(NAME, owner, lambda reply: ListEntries(reply=reply))
    return rt


def feed(rt: Runtime, entries: list[IndexEntry], replace_tier: str | None = None) -> None:
    rt.registry.tell(NAME, "recall", IndexUpsert(entries=entries, replace_tier=replace_tier))


def query(rt: Runtime, text: str = "", when: str = "", now: datetime | None = None) -> dict[str, Any]:
    answer = rt.registry.ask_sync(NAME, RECALL, lambda reply: QueryMemory(query=text, time=when, now=now, reply=reply))
    body: dict[str, Any] = msgspec.to_builtins(answer)  # the answer as the wire has it
    return body


def ids(body: dict[str, Any]) -> list[str]:
    return [r["id"] for r in body["results"]]


def wait_vectors(rt: Runtime, timeout: float = 30.0) -> None:
    query(rt, "sync")  # queued after every feed sent so far
    deadline = time.monotonic() + timeout
    while rt.services.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rt.services.pending() == 0


def entry(id: str, text: str, tier: str = "fact", **kw: Any) -> IndexEntry:
    return IndexEntry(id=id, tier=tier, text=text, entity="master", created_at="2026-01-01T00:00:00+00:00", **kw)


def test_feed_replace_family_filters_and_remove(tmp_path: Path) -> None:
    rt = start_runtime(tmp_path)
    try:
        feed(
            rt,
            [
                entry("f1", "green tea in the morning"),
                entry("f2", "green tea after dinner"),
                entry("a1", "green tea long ago", tier="fact_archive"),
                entry("r1", "loves green tea", tier="reflection"),
            ],
        )
        assert set(ids(query(rt, "green tea"))) == {"f1", "f2", "a1", "r1"}
        tiers = {r["id"]: r["tier"] for r in query(rt, "green tea")["results"]}
        assert tiers == {"f1": "fact", "f2": "fact", "a1": "fact_archive", "r1": "reflection"}
        # "fact" replaces the active facts and the archive; reflections are another family.
        feed(rt, [entry("f1", "green tea in the morning")], replace_tier="fact")
        assert set(ids(query(rt, "green tea"))) == {"f1", "r1"}
        # The hard filter: not searchable, negative score, empty text, unknown tiers (persona).
        feed(
            rt,
            [
                entry("r1", "loves green tea", tier="reflection", searchable=False),
                entry("r2", "green tea is denied", tier="reflection", score=-0.2),
                entry("f3", "   "),
                entry("p1", "green tea persona", tier="persona"),
            ],
        )
        assert ids(query(rt, "green tea")) == ["f1"]
        rt.registry.tell(NAME, "recall", IndexRemove(ids=["f1"]))
        body = query(rt, "green tea")
        assert body["results"] == [] and body["candidates_total"] == 0 and "error_code" not in body
    finally:
        rt.stop()


def test_time_only_uses_created_at_and_skips_untimed(tmp_path: Path) -> None:
    rt = start_runtime(tmp_path)
    try:
        feed(
            rt,
            [
                IndexEntry(id="e1", tier="fact", text="event on the tenth", event_start_at="2026-02-10T09:00:00+00:00"),
                IndexEntry(id="c1", tier="reflection", text="only a creation time", created_at="2026-02-10T20:00:00+00:00"),
                IndexEntry(id="n1", tier="fact", text="no time at all"),
                IndexEntry(
                    id="x1",
                    tier="fact",
                    text="a week later",
                    event_start_at="2026-02-17T09:00:00+00:00",
                    event_end_at="2026-02-18T09:00:00+00:00",
                ),
            ],
        )
        body = query(rt, when="2026-02-10", now=datetime(2026, 3, 1, tzinfo=timezone.utc))
        assert ids(body) == ["c1", "e1", "x1"]  # inside first (later start first), then nearest
        assert all(r["score"] is None for r in body["results"]) and body["time"] == "2026-02-10"
    finally:
        rt.stop()


def test_vectors_are_computed_on_the_pool_cached_and_reused(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    spy = Spy(real_embeddings)
    rt = start_runtime(tmp_path, embeddings=spy)
    try:
        feed(
            rt,
            [entry(f"f{i}", f"memory number {i} about tea") for i in range(5)] + [entry("a1", "archived tea memory", tier="fact_archive")],
        )
        wait_vectors(rt)
        assert spy.embedded["passage"] == 5  # archive entries get no vector
        model = real_embeddings.model_id
        vec = vector_codec.encode(real_embeddings.embed(["Master adores jasmine tea"])[0])
        sha = text_sha256("Master adores jasmine tea")
        feed(
            rt,
            [
                entry("c1", "Master adores jasmine tea", vector=vec, vector_model=model, text_sha256=sha),
                entry("c2", "Master adores oolong tea", vector=vec, vector_model=model, text_sha256="stale"),
            ],
        )
        wait_vectors(rt)
        assert spy.embedded["passage"] == 5 + 1  # c1 reused; c2 (stale sha) recomputed
    finally:
        rt.stop()


def test_vectors_reach_the_owner(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    from nekomem.actors.messages import Flush, ImportFacts

    rt = start_runtime(tmp_path, embeddings=real_embeddings)
    try:
        rt.registry.ask_sync(NAME, "facts", lambda reply: ImportFacts(facts=[{"text": "Master loves sardines"}], reply=reply))
        wait_vectors(rt)
        rt.registry.ask_sync(NAME, "facts", lambda reply: Flush(reply=reply))
        import json

        stored = json.loads((rt.memory_root / NAME / "facts.json").read_text(encoding="utf-8"))
        assert stored[0]["embedding_model_id"] == real_embeddings.model_id
        assert vector_codec.try_decode(stored[0]["embedding"], real_embeddings.dim) is not None
    finally:
        rt.stop()


def test_maintenance_recall_without_vectors(tmp_path: Path) -> None:
    rt = start_runtime(tmp_path)
    try:
        feed(rt, [entry("r1", "loves tea", tier="reflection"), entry("r2", "hates rain", tier="reflection")])
        order = [f"c{i}" for i in range(10)]
        got = rt.registry.ask_sync(
            NAME, "recall", lambda reply: RankForStage2(query_texts=["tea"], candidate_ids=order, budget=2, reply=reply)
        )
        assert got == order[:6]  # evidence order kept, cut to 3 x budget
        got = rt.registry.ask_sync(NAME, "recall", lambda reply: RelatedFacts(query_texts=["tea"], per_query_k=3, cap=20, reply=reply))
        assert got == []
    finally:
        rt.stop()


def test_maintenance_recall_with_vectors(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    rt = start_runtime(tmp_path, embeddings=real_embeddings)
    try:
        feed(
            rt,
            [
                entry("r_tea", "Master drinks green tea every morning", tier="reflection"),
                entry("r_cat", "Master has a white cat named Snow", tier="reflection"),
                entry("r_job", "Master works as a nurse at night", tier="reflection"),
                entry("f_tea", "Master bought matcha powder", tier="fact"),
                entry("f_cat", "The cat sleeps on Master's bed", tier="fact"),
                entry("f_job", "Master had a long night shift at the hospital", tier="fact"),
            ],
        )
        wait_vectors(rt)
        candidates = ["r_job", "r_cat", "r_tea", "persona_1"]
        got = rt.registry.ask_sync(
            NAME, "recall", lambda reply: RankForStage2(query_texts=["I had a cup of tea"], candidate_ids=candidates, budget=1, reply=reply)
        )
        assert got[0] == "r_tea" and "persona_1" in got and len(got) == 3  # a reserved slot for the unembedded
        got = rt.registry.ask_sync(
            NAME,
            "recall",
            lambda reply: RankForStage2(
                query_texts=["my kitten"],
                candidate_ids=candidates,
                budget=2,
                reply=reply,
                candidate_texts={"persona_1": "Master adores kittens and cats"},
            ),
        )
        assert set(got[:2]) == {"r_cat", "persona_1"}
        got = rt.registry.ask_sync(
            NAME,
            "recall",
            lambda reply: RelatedFacts(query_texts=["tea time", "my pet cat"], per_query_k=2, cap=3, exclude_ids=["f_job"], reply=reply),
        )
        # Round-robin: each query's best before anyone's second; capped; the excluded id never.
        assert got[0] in {"r_tea", "f_tea"} and got[1] in {"r_cat", "f_cat"} and len(got) == 3 and "f_job" not in got
        got = rt.registry.ask_sync(
            NAME, "recall", lambda reply: RelatedFacts(query_texts=["green tea powder"], per_query_k=5, cap=20, tiers=["fact"], reply=reply)
        )
        assert got[0] == "f_tea" and set(got) == {"f_tea", "f_cat", "f_job"}
    finally:
        rt.stop()


def test_slow_query_embedding_answers_from_bm25(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    spy = Spy(real_embeddings, query_delay=1.5)
    rt = start_runtime(tmp_path, embeddings=spy, recall_query_embed_timeout_seconds=0.2)
    try:
        feed(rt, [entry("f1", "Master loves green tea"), entry("f2", "Master drinks coffee")])
        wait_vectors(rt)
        body = query(rt, "green tea")
        assert ids(body) == ["f1"] and "error_code" not in body
    finally:
        rt.stop()


def test_a_failing_component_answers_hybrid_recall_failed(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    rt = start_runtime(tmp_path, embeddings=Spy(real_embeddings, broken_model_id=True))
    try:
        body = query(rt, "anything")
        assert body == {"results": [], "query": "anything", "candidates_total": 0, "elapsed_ms": 0.0, "error_code": "hybrid_recall_failed"}
    finally:
        rt.stop()


def test_text_analysis_helpers() -> None:
    assert {light_stem(w) for w in ("research", "researched", "researching")} == {"research"}
    assert light_stem("stories") == "story" and light_stem("stopped") == "stop" and light_stem("bus") == "bus"
    assert lexical_text("What did Lan paint?", ("lan",), 2, stem=True, query_stopwords=True).split() == ["paint?"]
    assert lexical_text("昨日ラーメンを食べた", (), 2, stem=True) == "昨日ラーメンを食べた"
    now = datetime(2026, 3, 10, 12, tzinfo=timezone.utc)
    window, rest = query_time_hint("what did we eat on 8 December 2025?", now, 6, 200)
    assert window is not None and window.start == datetime(2025, 12, 8, tzinfo=timezone.utc) and rest == "what did we eat"
    window, rest = query_time_hint("昨日何を食べた", now, 6, 200)
    assert window is not None and window.start.day == 9 and rest == "何を食べた"
    assert query_time_hint("I may go to the sun", now, 6, 200) == (None, "I may go to the sun")


def test_a_query_naming_someone_is_embedded_twice_and_blended(tmp_path: Path, real_embeddings: EmbeddingService) -> None:
    spy = Spy(real_embeddings)
    rt = start_runtime(tmp_path, embeddings=spy, recall_legs="vector", recall_budget_each=3, recall_budget_total=3)
    texts = {
        "f1": "Melanie painted a lake sunrise last year",
        "f2": "Melanie values her family and friends",
        "f3": "Caroline is researching adoption agencies",
        "f4": "Melanie goes swimming with her kids",
        "f5": "Caroline painted a portrait of her grandmother",
    }
    try:
        feed(rt, [entry(i, t) for i, t in texts.items()])
        wait_vectors(rt)
        asked = spy.embedded["query"]
        body = query(rt, "What did Melanie paint?")
        assert spy.embedded["query"] == asked + 2  # as asked and without the name
        # The order is the cosine to the blended vector (too few vectors for the hub correction).
        rows = real_embeddings.embed(query_vector_texts("What did Melanie paint?", 0.5), "query")
        blended = blend_query_vectors(rows, 0.5)
        docs = real_embeddings.embed(list(texts.values()))
        cosines = {i: float(v @ blended) for i, v in zip(texts, docs, strict=True)}
        assert ids(body) == sorted((i for i in texts if cosines[i] >= 0.15), key=lambda i: -cosines[i])[:3]
        query(rt, "what did I paint?")
        assert spy.embedded["query"] == asked + 3  # no name: one text
    finally:
        rt.stop()
