"""RecallIndex and the query plan without any actor: the feed, the vector side (cached
vectors, backfill bookkeeping), hybrid search, time windows and maintenance ranking. Real
settings, real BM25 and vector indexes; vectors are small hand-made unit vectors."""

from __future__ import annotations

import base64
from datetime import datetime, timezone

import msgspec
import numpy as np
import pytest

from nekomem.config.settings import load_settings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import vector_tiers
from nekomem.models.embeddings import VectorLeg, text_sha256
from nekomem.recall.index import RecallIndex, StoredVectors
from nekomem.recall.query_plan import plan_query
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for
from nekomem.recall.response import empty_response, query_response
from nekomem.recall.vectors import VectorIndex

UTC = timezone.utc
MODEL = "test-model"


def settings():
    return load_settings(None, env={}, overrides={}).recall


def make_index() -> RecallIndex:
    s = settings()
    return RecallIndex(s, UTC, LexicalAnalyzer(s, stop_names_for(["Master", "Lan"])))


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def entry(id: str, text: str, tier: str = "fact", vec: np.ndarray | None = None, **kw) -> IndexEntry:
    cached = {}
    if vec is not None:
        cached = {"vector": vector_codec.encode(vec), "vector_model": MODEL, "text_sha256": text_sha256(text)}
    return IndexEntry(id=id, tier=tier, text=text, entity="master", created_at="2026-01-01T00:00:00+00:00", **cached, **kw)


def test_a_wake_adopts_every_cached_vector_at_once_with_the_bits_of_one_by_one_adoption():
    """attach_model decodes and stores a wake's cached vectors in one pass (issue 40: 50,000
    of them took seconds one by one). The rows, their order, the running sum and the
    entries left waiting for a vector must be what adopting each one by one gives: bad
    base64, a wrong length, a zero vector, values float16 cannot hold, another model, a
    changed text and a legacy list of floats all mixed in."""
    dim = 24
    rng = np.random.default_rng(40)
    entries = []
    for i in range(300):
        text = f"Master note {i} about tea and trains"
        vec = rng.standard_normal(dim).astype(np.float32) * rng.uniform(0.01, 50)
        e = entry(f"f{i}", text, tier="fact" if i % 3 else "fact_archive", vec=vec)
        kind = i % 23
        if kind == 1:
            e = IndexEntry(**{**_fields(e), "vector": "not base64!"})
        elif kind == 2:
            e = IndexEntry(**{**_fields(e), "vector": vector_codec.encode(np.ones(dim + 1, dtype=np.float32))})
        elif kind == 3:
            e = IndexEntry(**{**_fields(e), "vector": vector_codec.encode(np.zeros(dim, dtype=np.float32))})
        elif kind == 4:
            wire = np.full(dim, np.inf, dtype="<f2")
            e = IndexEntry(**{**_fields(e), "vector": base64.b64encode(wire.tobytes()).decode()})
        elif kind == 5:
            e = IndexEntry(**{**_fields(e), "vector_model": "another-model"})
        elif kind == 6:
            e = IndexEntry(**{**_fields(e), "text": text + " (edited)"})
        elif kind == 7:
            e = IndexEntry(**{**_fields(e), "vector": [float(x) for x in vec]})
        elif kind == 8:
            e = IndexEntry(**{**_fields(e), "vector": None})
        entries.append(e)
    entries.append(entry("r1", "Master is musical", tier="reflection", vec=unit(*([1.0] * dim))))
    index = make_index()
    index.upsert(entries)
    legs = (VectorLeg("a", 0, 10, 0.7, None), VectorLeg("b", 10, dim, 0.7, None))  # two column blocks
    assert index.attach_model(MODEL, dim, legs) is True

    # One by one, as before: every vector-tier entry in index order, adopted or listed.
    reference = make_index()
    reference.upsert(entries)
    reference.vectors = VectorIndex(dim, reference.s, blocks=[10])
    reference.vector_model = MODEL
    for doc_id, doc in reference.docs.items():
        if doc.tier in vector_tiers() and not reference._adopt_cached(doc.entry, doc.sha):
            reference.need[doc_id] = doc.sha

    assert 0 < len(index.vectors) == len(reference.vectors) < len(entries)
    _assert_same_vector_side(index, reference, rng.standard_normal(dim).astype(np.float32), 20)


def test_a_feed_adopts_its_cached_vectors_in_runs_with_the_bits_of_one_by_one_adoption():
    """An owner's feed over an attached vector side (a wake whose segment could not serve)
    stores its new documents' cached vectors in runs: rows, their order, the running sum
    (already holding other vectors), the waiting list and its order must be those of taking
    the entries one by one, whatever is mixed in (no vector, another model, bad base64, a
    zero vector, a repeated id, a replaced text, a tier without vectors, a retired entry)."""
    dim = 16
    rng = np.random.default_rng(39)

    def vec() -> np.ndarray:
        return rng.standard_normal(dim).astype(np.float32) * np.float32(rng.uniform(0.1, 9))

    before = [entry(f"r{i}", f"Master seems fond of item {i}", tier="reflection", vec=vec()) for i in range(7)]
    feed: list[IndexEntry] = []
    for i in range(400):
        text = f"Master fact {i} about kites and rain"
        e = entry(f"f{i % 370}", text, tier="fact" if i % 50 else "fact_archive", vec=vec())
        kind = i % 29
        if kind == 1:
            e = IndexEntry(**{**_fields(e), "vector": None})
        elif kind == 2:
            e = IndexEntry(**{**_fields(e), "vector_model": "other"})
        elif kind == 3:
            e = IndexEntry(**{**_fields(e), "vector": "@@@"})
        elif kind == 4:
            e = IndexEntry(**{**_fields(e), "vector": vector_codec.encode(np.zeros(dim, dtype=np.float32))})
        elif kind == 5:
            e = IndexEntry(**{**_fields(e), "tier": "turn"})
        elif kind == 6:
            e = IndexEntry(**{**_fields(e), "searchable": False})
        elif kind == 7:
            e = IndexEntry(**{**_fields(e), "text": "", "text_sha256": text_sha256("")})
        feed.append(e)
        if i % 61 == 10:  # the same id again at once, another text: the first is stored first
            feed.append(entry(e.id, text + " (again)", vec=vec()))
    feed.append(entry("r3", "Master seems fond of item 3 now", tier="reflection", vec=vec()))

    batched, single = make_index(), make_index()
    for index in (batched, single):
        index.attach_model(MODEL, dim)
        index.upsert(before)
    batched.upsert(feed, replace_tier="fact")
    # The same feed one entry at a time through the one-by-one path (no batch).
    family = {e.id for e in feed}
    for doc_id in [i for i in single.docs.ids_in_tiers(("fact", "fact_archive")) if i not in family]:
        single._drop(doc_id)
    for e in feed:
        single._put(e)

    assert len(batched.vectors) > 200
    _assert_same_vector_side(batched, single, rng.standard_normal(dim).astype(np.float32), 30)


def test_a_vector_block_gives_the_rows_the_entries_caches_give_across_its_slices():
    """A wake from a current vector block (StoredVectors: the float16 bytes the entries'
    base64 holds) stores, slice after slice, exactly what adopting the entries' cached
    vectors one by one stores, bad rows (not finite, zero) left waiting as there."""
    dim = 8
    rng = np.random.default_rng(41)
    n = 20_000  # more than one slice
    wire = (rng.standard_normal((n, dim)) * rng.uniform(0.01, 30, (n, 1))).astype("<f2")
    wire[77] = np.inf
    wire[9000] = 0
    entries = [
        IndexEntry(
            id=f"f{i}",
            tier="fact",
            text=f"note {i}",
            entity="master",
            created_at="2026-01-01T00:00:00+00:00",
            vector=base64.b64encode(wire[i].tobytes()).decode(),
            vector_model=MODEL,
            text_sha256=text_sha256(f"note {i}"),
        )
        for i in range(n)
    ]
    from_block, reference = make_index(), make_index()
    for index in (from_block, reference):
        index.upsert(entries)
    stored = StoredVectors(model=MODEL, ids=[e.id for e in entries], wire=wire)
    assert from_block.attach_model(MODEL, dim, stored=stored) is True
    reference.vectors = VectorIndex(dim, reference.s)
    reference.vector_model = MODEL
    for doc_id, doc in reference.docs.items():
        if not reference._adopt_cached(doc.entry, doc.sha):
            reference.need[doc_id] = doc.sha
    assert list(from_block.need) == list(reference.need) == ["f77", "f9000"]
    assert list(from_block.vectors.ids()) == list(reference.vectors.ids())
    assert from_block.vectors._blocks[0][: n - 2].tobytes() == reference.vectors._blocks[0][: n - 2].tobytes()
    assert from_block.vectors.centroid().tobytes() == reference.vectors.centroid().tobytes()


def _assert_same_vector_side(index: RecallIndex, reference: RecallIndex, query: np.ndarray, k: int) -> None:
    """``index``'s vector side holds, bit for bit, what ``reference``'s does: the waiting
    list and its order, the rows and their order, every vector, the running sum, and the
    answer to ``query``."""
    assert index.vectors is not None and reference.vectors is not None
    assert list(index.need.items()) == list(reference.need.items())
    assert list(index.vectors.ids()) == list(reference.vectors.ids())
    for doc_id in reference.vectors.ids():
        assert index.vectors.get(doc_id).tobytes() == reference.vectors.get(doc_id).tobytes(), doc_id
    assert index.vectors.centroid().tobytes() == reference.vectors.centroid().tobytes()
    assert index.vectors.search(query, k) == reference.vectors.search(query, k)


def _fields(e: IndexEntry) -> dict:
    return {f.name: getattr(e, f.name) for f in msgspec.structs.fields(e)}


def test_feed_replace_and_remove():
    index = make_index()
    index.upsert([entry("f1", "Master plays the violin"), entry("a1", "Master sold the old bike", tier="fact_archive")])
    index.upsert([entry("r1", "Master is musical", tier="reflection")])
    assert set(index.docs) == {"f1", "a1", "r1"}
    # "fact" names the family of the fact owner: the archive entry not resent goes too.
    index.upsert([entry("f2", "Master bakes bread")], replace_tier="fact")
    assert set(index.docs) == {"f2", "r1"}
    index.upsert([entry("r1", "Master is musical", tier="reflection", searchable=False)])
    index.remove(["f2", "unknown"])
    assert index.docs == {}


def test_lexical_search_stems_and_ignores_names_and_function_words():
    index = make_index()
    index.upsert([entry("f1", "Master researched old maps"), entry("f2", "Lan likes green tea")])
    hits, legs = index.search("What did Master research?", None, None, None)
    assert [e.id for e, _ in hits] == ["f1"] and legs[1] == []
    assert query_response(hits, "q", 2, 1.0).results[0].id == "f1"
    assert empty_response("q", error=True).error_code == "hybrid_recall_failed"


def test_cached_vectors_are_adopted_and_missing_ones_wait_for_backfill():
    index = make_index()
    index.upsert([entry("f1", "Master rides a bicycle", vec=unit(1, 0, 0)), entry("f2", "Master paints at night")])
    assert index.attach_model(MODEL, 3) is True and index.attach_model(MODEL, 3) is False
    assert "f1" in index.vectors and index.need == {"f2": text_sha256("Master paints at night")}
    items, texts = index.take_backfill(10)
    assert texts == ["Master paints at night"] and index.need  # taken, not yet committed
    index.commit_backfill(items)
    assert not index.need
    index.restore_backfill(items)  # the batch failed
    assert list(index.need) == ["f2"]
    index.commit_backfill(items)
    computed = index.store_backfill(items, np.stack([unit(0, 1, 0)]))
    encoded, model, sha = computed["facts"]["f2"]
    assert model == MODEL and sha == text_sha256("Master paints at night")
    assert np.allclose(vector_codec.decode(encoded, 3), unit(0, 1, 0), atol=1e-3)
    # A rewritten text invalidates the cached vector; removal drops it everywhere.
    index.upsert([entry("f1", "Master rides a motorbike")])
    assert "f1" not in index.vectors and "f1" in index.need
    index.detach_model()
    assert index.vectors is None and not index.need


def test_vector_leg_finds_what_bm25_cannot():
    index = make_index()
    index.upsert([entry("f1", "Master drinks green tea", vec=unit(1, 0.1, 0)), entry("f2", "Master owns a red car", vec=unit(0, 0, 1))])
    index.attach_model(MODEL, 3)
    hits, legs = index.search("favourite beverage", unit(1, 0, 0), None, None)
    assert legs[0] == [] and legs[1] == ["f1"] and hits[0][0].id == "f1"


def test_time_windows_and_the_query_plan():
    index = make_index()
    index.upsert(
        [
            entry("d8", "dinner at the harbour", event_start_at="2025-12-08T19:00:00+00:00"),
            entry("d1", "lunch in the park", event_start_at="2025-12-01T12:00:00+00:00"),
        ]
    )
    now = datetime(2025, 12, 10, 12, tzinfo=UTC)
    plan = plan_query("what did we eat on 8 December 2025", "", now, index, settings(), 0.0)
    assert plan.hinted == {"d8"} and "December" not in plan.search and plan.allowed is None
    plan = plan_query("", "2025-12-01", now, index, settings(), 0.0)
    assert plan.allowed == {"d1"} and plan.window is not None
    nearest, dated, inside = index.nearest_in_time(plan.window, 5)
    assert [e.id for e in nearest] == ["d1", "d8"] and (dated, inside) == (2, 1)


def test_maintenance_ranking():
    index = make_index()
    index.upsert(
        [
            entry("r1", "Master likes cats", tier="reflection", vec=unit(1, 0, 0)),
            entry("r2", "Master likes dogs", tier="reflection", vec=unit(0, 1, 0)),
            entry("f1", "Master adopted a kitten", vec=unit(0.9, 0.1, 0)),
        ]
    )
    index.attach_model(MODEL, 3)
    queries = np.stack([unit(1, 0, 0)])
    assert index.coarse_rank(["r2", "r1"], 2, queries, 1, []) == ["r1", "r2"]
    # A candidate without a vector keeps a reserved place; no vectors: the given order.
    assert "p1" in index.coarse_rank(["r2", "r1", "p1"], 2, queries, 1, [])
    assert index.coarse_rank(["r2", "r1"], 1, None, 1, []) == ["r2"]
    assert index.related(queries, 2, 5, ["fact"], []) == ["f1"]
    assert index.related(queries, 2, 5, ["fact", "reflection"], ["r1"]) == ["f1", "r2"]
    assert index.related(queries, 2, 1, ["fact", "reflection"], []) == ["r1"]  # the cap


@pytest.mark.parametrize("bad", [entry("e", "  "), entry("e", "x", tier="persona"), entry("e", "x", score=-0.5)])
def test_entries_the_hard_filter_excludes_are_not_indexed(bad):
    index = make_index()
    index.upsert([bad])
    assert index.docs == {}


def test_a_visibility_filter_restricts_every_path():
    index = make_index()
    index.upsert(
        [
            entry("d8", "dinner at the harbour", event_start_at="2025-12-08T19:00:00+00:00"),
            entry("d1", "dinner in the park", event_start_at="2025-12-01T12:00:00+00:00"),
        ]
    )
    now = datetime(2025, 12, 10, 12, tzinfo=UTC)
    plan = plan_query("dinner", "", now, index, settings(), 0.0, visible={"d1"})
    assert plan.allowed == {"d1"}
    hits, _ = index.search(plan.search, None, plan.allowed, plan.hinted)
    assert [e.id for e, _ in hits] == ["d1"]
    plan = plan_query("what did we eat on 8 December 2025", "", now, index, settings(), 0.0, visible={"d1"})
    assert plan.hinted is None  # the hinted window holds nothing visible
    window = plan_query("", "2025-12", now, index, settings(), 0.0).window
    assert [e.id for e in index.nearest_in_time(window, 5, visible={"d8"})[0]] == ["d8"]


def test_hub_correction_starts_at_the_minimum_vector_count():
    s = load_settings(None, env={}, overrides={"recall_vector_hub_min_vectors": 22}).recall
    index = RecallIndex(s, UTC, LexicalAnalyzer(s, ()))
    # Twenty generic memories along x, one (g) leaning towards them, one (s) apart.
    generic = [entry(f"x{i:02d}", f"generic memory {i}", vec=unit(1.0, 0.01 * i, 0.0)) for i in range(20)]
    index.upsert([*generic, entry("g", "gadget", vec=unit(0.9, 0.436, 0.0))])
    index.attach_model(MODEL, 3)
    q = unit(0.6, 0.8, 0.0)
    assert index.hub_weight() == 0.0 and index.legs("", q, None)[1][0] == "g"  # 21 vectors: plain cosine
    index.upsert([entry("s", "sundial", vec=unit(0.0, 0.6, 0.8))])
    assert index.hub_weight() == s.recall_vector_hub_weight == 1.0
    hits, legs = index.search("nothing lexical", q, None, None)
    assert legs[1][:2] == ["s", "g"] and hits[0][0].id == "s"


def test_the_plan_lists_the_texts_to_embed():
    index = make_index()
    now = datetime(2025, 12, 10, 12, tzinfo=UTC)
    plan = plan_query("What did Melanie eat on 8 December 2025?", "", now, index, settings(), 0.0)
    assert plan.vector_texts == (plan.search, "What did eat") and "December" not in plan.search
    assert plan_query("what did we eat", "", now, index, settings(), 0.0).vector_texts == ("what did we eat",)
    off = load_settings(None, env={}, overrides={"recall_query_unnamed_weight": 0.0}).recall
    assert plan_query("What did Melanie eat?", "", now, index, off, 0.0).vector_texts == ("What did Melanie eat?",)
    assert plan_query("", "2025-12-08", now, index, settings(), 0.0).vector_texts == ()
