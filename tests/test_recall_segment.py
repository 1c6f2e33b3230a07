"""The facts' recall index persisted as a segment (recall_segment.bin, issue 40): a wake
loads it instead of re-tokenising; it answers exactly as an index built fact by fact; it
holds no memory text; a stale, damaged or erased-from segment is never trusted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import timezone
from pathlib import Path

import pytest

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.layers.recall import persist as recall_persist
from nekomem.models.embeddings import EmbeddingService
from nekomem.recall.index import RecallIndex
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.segment import SegmentError, decode_segment, encode_segment
from nekomem.stores.layout import CharacterPaths
from tests.support.live import ROOT, LiveServer, make_settings

TEXTS = [
    "Master plays the cello every Sunday morning",
    "Master likes jasmine tea more than coffee",
    "Master's sister lives in Osaka near the river",
    "Master went to Kyoto in spring and saw the cherry blossoms",
    "ご主人様は毎朝ジャスミン茶を飲む",
    "主人喜欢在周末去公园散步",
    "Master has a cat named Mochi who sleeps on the piano",
    "Master plays chess with his brother on rainy evenings",
]
QUERIES = ["cello", "tea coffee", "Osaka river sister", "ジャスミン茶", "公园散步", "piano cat", "rainy chess brother", "nothing here"]


def _built(texts: dict[str, str]) -> LexicalIndex:
    index = LexicalIndex(RecallSettings())
    for doc_id, text in texts.items():
        index.add(doc_id, text)
    return index


def test_a_loaded_base_scores_exactly_as_an_index_built_document_by_document() -> None:
    texts = {f"f{i}": t for i, t in enumerate(TEXTS)}
    built = _built(texts)
    loaded = LexicalIndex(RecallSettings())
    loaded.load_base(list(texts), built.export(list(texts)))
    for query in QUERIES:
        assert loaded.search(query, 5) == built.search(query, 5), query
    # Changes after the load: a base document removed and replaced, a new one added.
    for index in (built, loaded):
        index.remove("f1")
        index.update("f2", "Master's sister moved from Osaka to Kobe")
        index.add("n1", "Master drinks jasmine tea in Kobe")
    for query in [*QUERIES, "Kobe", "jasmine"]:
        assert loaded.search(query, 5) == built.search(query, 5), query
    # What it exports again is the same index.
    ids = list(loaded.ids())
    again = LexicalIndex(RecallSettings())
    again.load_base(ids, loaded.export(ids))
    for query in [*QUERIES, "Kobe", "jasmine"]:
        assert again.search(query, 5) == built.search(query, 5), query


def test_a_damaged_or_foreign_segment_is_refused() -> None:
    texts = {f"f{i}": t for i, t in enumerate(TEXTS)}
    arrays = _built(texts).export(list(texts))
    data = encode_segment({"rows": len(texts)}, {"rows": arrays.rows, "tfs": arrays.tfs, "term_hash": arrays.term_hash})
    header, decoded = decode_segment(data)
    assert header["rows"] == len(texts) and (decoded["rows"] == arrays.rows).all()
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    for bad in (bytes(flipped), data[: len(data) // 2], b"not a segment", data.replace(b'"version": 1', b'"version": 9')):
        with pytest.raises(SegmentError):
            decode_segment(bad)


def test_a_feed_of_another_tier_finds_only_its_own_rows_among_a_segments(tmp_path: Path) -> None:
    """The reflections' complete feed over a loaded segment drops only reflections: none of
    the segment's fact rows is looked at, but a row given a reflection's document is."""
    paths = CharacterPaths(tmp_path, "Lan")
    paths.folder.mkdir(parents=True)
    paths.facts.write_text(json.dumps([{"id": f"fact_{i}", "text": t, "importance": 5} for i, t in enumerate(TEXTS)]))
    settings = make_settings(tmp_path, embedding_enabled=False)
    assert recall_persist.build_offline(paths, settings, "Lan", timezone.utc)
    index = RecallIndex(settings.recall, timezone.utc, recall_persist.analyzer_for(settings, "Lan"))
    loaded = recall_persist.load(paths, settings, index.analyzer)
    assert loaded is not None
    try:
        index.load_base(loaded.base)
        index.upsert([IndexEntry(id="r1", tier="reflection", text="Master is a calm musician")], replace_tier="reflection")
        assert index.docs.ids_in_tiers(["reflection"]) == ["r1"]
        index.upsert([IndexEntry(id="fact_3", tier="reflection", text="Master loves spring in Kyoto")])  # an id reused across tiers
        assert index.docs.ids_in_tiers(["reflection"]) == ["fact_3", "r1"]
        index.upsert([IndexEntry(id="r2", tier="reflection", text="Master keeps a cat")], replace_tier="reflection")
        assert index.docs.ids_in_tiers(["reflection"]) == ["r2"] and "fact_3" not in index.docs
        assert len(index.docs.ids_in_tiers(["fact", "fact_archive"])) == len(TEXTS) - 1
    finally:
        loaded.rows.close()


def _found(srv: LiveServer, query: str) -> list[str]:
    r = srv.post("/query_memory/Lan", json={"query": query})
    assert r.status_code == 200, r.text
    return [row["text"] for row in r.json()["results"]]


def _segment_loaded(caplog: pytest.LogCaptureFixture) -> bool:
    return any("loaded from their segment" in r.getMessage() for r in caplog.records)


def _serve(tmp_path: Path) -> LiveServer:
    settings = make_settings(tmp_path, embedding_enabled=False)
    return LiveServer(settings, embeddings=EmbeddingService(settings.embeddings))


def test_a_stopped_character_wakes_from_its_segment_with_the_same_answers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nekomem.actors")
    paths = CharacterPaths(tmp_path, "Lan")
    with _serve(tmp_path) as srv:
        r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]})
        assert r.status_code == 200, r.text
        before = {q: _found(srv, q) for q in QUERIES}
    segment = paths.recall_segment.read_bytes()
    for text in TEXTS:  # token hashes, ids and offsets: no memory text
        for word in text.split():
            if len(word) > 3:
                assert word.encode() not in segment
    caplog.clear()
    with _serve(tmp_path) as srv:
        assert {q: _found(srv, q) for q in QUERIES} == before
        assert _segment_loaded(caplog)
        # A change while awake is in the segment written at stop.
        r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master bought a red kite in Kobe"}]})
        assert r.status_code == 200, r.text
    caplog.clear()
    with _serve(tmp_path) as srv:
        assert _found(srv, "red kite") == ["Master bought a red kite in Kobe"]
        assert _segment_loaded(caplog)


def test_a_stale_or_damaged_segment_is_ignored_and_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nekomem.actors")
    paths = CharacterPaths(tmp_path, "Lan")
    with _serve(tmp_path) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]}).status_code == 200
    # facts.json edited while the server was down: the segment no longer describes it.
    facts = json.loads(paths.facts.read_bytes())
    facts[0]["text"] = "Master plays the bassoon every Sunday morning"
    paths.facts.write_text(json.dumps(facts))
    caplog.clear()
    with _serve(tmp_path) as srv:
        assert _found(srv, "bassoon") == ["Master plays the bassoon every Sunday morning"]
        assert _found(srv, "cello") == []
        assert not _segment_loaded(caplog)
    assert _segment_loaded_next(tmp_path, caplog, "bassoon")
    # A damaged segment: ignored, rebuilt, and written whole again at stop.
    data = bytearray(paths.recall_segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    paths.recall_segment.write_bytes(bytes(data))
    caplog.clear()
    with _serve(tmp_path) as srv:
        assert _found(srv, "bassoon") == ["Master plays the bassoon every Sunday morning"]
        assert not _segment_loaded(caplog)
    decode_segment(paths.recall_segment.read_bytes())  # whole again


def _segment_loaded_next(tmp_path: Path, caplog: pytest.LogCaptureFixture, query: str) -> bool:
    caplog.clear()
    with _serve(tmp_path) as srv:
        assert _found(srv, query)
        return _segment_loaded(caplog)


def test_a_forgotten_fact_leaves_the_segment(tmp_path: Path) -> None:
    paths = CharacterPaths(tmp_path, "Lan")
    with _serve(tmp_path) as srv:
        r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]})
        assert r.status_code == 200, r.text
    with _serve(tmp_path) as srv:
        rows = srv.get("/api/characters/Lan/facts").json()["items"]
        cello = next(f["id"] for f in rows if "cello" in f["text"])
        assert _found(srv, "cello")
        r = srv.delete(f"/api/characters/Lan/facts/{cello}")
        assert r.status_code in (200, 204), r.text
        assert _found(srv, "cello") == []
    assert cello.encode() not in paths.recall_segment.read_bytes()
    with _serve(tmp_path) as srv:
        assert _found(srv, "cello") == []


def test_the_offline_import_writes_the_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nekomem.actors")
    export = tmp_path / "export.json"
    facts = [{"id": f"fact_{i}", "text": t, "created_at": "2026-01-02T10:00:00+00:00"} for i, t in enumerate(TEXTS)]
    character = {"format": "nekomem-character", "version": 1, "name": "Lan", "files": {"facts.json": facts}, "logs": {}}
    character["journal"] = {"rows": [], "cursors": {}, "sequence": 0}
    export.write_text(
        json.dumps({"format": "nekomem-export", "version": 1, "exported_at": "2026-12-06T00:00:00+00:00", "characters": [character]})
    )
    root = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    done = subprocess.run(
        [sys.executable, "-m", "nekomem", "import", str(export), "--memory-root", str(root)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    paths = CharacterPaths(root, "Lan")
    settings = make_settings(root, embedding_enabled=False)
    loaded = recall_persist.load(paths, settings, recall_persist.analyzer_for(settings, "Lan"))
    assert loaded is not None and sorted(loaded.base.ids) == sorted(f["id"] for f in facts)
    assert loaded.base.decode(loaded.base.ids.index("fact_1")).text == TEXTS[1]
    loaded.rows.close()
    with _serve(root) as srv:
        assert _found(srv, "cello") == [TEXTS[0]]
        assert _segment_loaded(caplog)


def test_with_vectors_a_wake_from_the_segment_keeps_the_cached_vectors(
    tmp_path: Path, embedding_service: EmbeddingService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nekomem.actors")
    settings = make_settings(tmp_path)
    query = "what beverage does the user enjoy"  # shares no word with the tea fact: the vector leg finds it
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]}).status_code == 200
        srv.wait_vectors("Lan")
        before = _found(srv, query)
    assert "Master likes jasmine tea more than coffee" in before
    caplog.clear()
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert _found(srv, query) == before
        assert srv.get("/health").json()["embeddings"]["pending"] == 0  # cached vectors taken, none recomputed
        assert _segment_loaded(caplog)


def _answers(srv: LiveServer, query: str) -> list[tuple[str, float]]:
    r = srv.post("/query_memory/Lan", json={"query": query})
    assert r.status_code == 200, r.text
    return [(row["id"], row["score"]) for row in r.json()["results"]]


def test_with_vectors_a_wake_takes_the_cached_vectors_from_their_block_without_reading_the_facts(
    tmp_path: Path, embedding_service: EmbeddingService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With embeddings on, the facts' cached vectors are kept beside the segment
    (recall_vectors.bin): a wake takes them from there, the fact layer decodes nothing, no
    vector is recomputed, and every answer and score is the one a wake through the facts'
    feed gives (the block deleted). A forgotten fact takes its vector off the disk at once."""
    from nekomem.layers.facts import state as fact_state

    settings = make_settings(tmp_path)
    paths = CharacterPaths(tmp_path, "Lan")
    queries = ["what beverage does the user enjoy", "a pet animal", "cello", "family in another city"]
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]}).status_code == 200
        srv.wait_vectors("Lan")
    with LiveServer(settings, embeddings=embedding_service) as srv:  # the views now hold every vector
        assert _found(srv, "cello")
    header = recall_persist.read_header(paths.recall_vectors)
    assert header["rows"] == len(TEXTS) and header["model"] == embedding_service.model_id
    block = paths.recall_vectors.read_bytes()
    for text in TEXTS:
        assert text.split()[-1].encode() not in block  # ids and float16 rows: no memory text

    reads: list[str] = []
    real = fact_state.read_records

    def spy(path: Path, *args: object, **kwargs: object) -> object:
        reads.append(path.name)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fact_state, "read_records", spy)
    with LiveServer(settings, embeddings=embedding_service) as srv:
        from_block = {q: _answers(srv, q) for q in queries}
        assert reads == []  # the vectors came from the block, not from the facts' feed
        assert srv.get("/health").json()["embeddings"]["pending"] == 0
    assert all(from_block.values())

    paths.recall_vectors.unlink()  # the same wake through the facts' feed, as before the block
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert {q: _answers(srv, q) for q in queries} == from_block
        assert reads[:1] == ["facts.json"]
    assert paths.recall_vectors.exists()  # written again at stop

    with LiveServer(settings, embeddings=embedding_service) as srv:
        rows = srv.get("/api/characters/Lan/facts").json()["items"]
        cello = next(f["id"] for f in rows if "cello" in f["text"])
        assert srv.delete(f"/api/characters/Lan/facts/{cello}").status_code in (200, 204)
        assert not paths.recall_vectors.exists()  # its vector went with it, before the stop
    assert cello.encode() not in paths.recall_vectors.read_bytes()
    assert recall_persist.read_header(paths.recall_vectors)["rows"] == len(TEXTS) - 1


def test_an_erasure_is_answered_only_once_the_recall_files_holding_the_entry_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fact actor tells RecallActor to drop the row, and the erasure's relay passes
    through RecallActor before the outbox answers: so the DELETE's answer comes after the
    segment that held the fact's token hashes is off the disk, however late the recall
    mailbox gets to it (here held back on purpose)."""
    import threading

    settings = make_settings(tmp_path)
    paths = CharacterPaths(tmp_path, "Lan")
    with LiveServer(settings) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]}).status_code == 200
    assert paths.recall_segment.exists()

    order: list[str] = []
    never = threading.Event()
    real = recall_persist.discard

    def late_discard(p: CharacterPaths) -> None:
        never.wait(0.5)  # widens the window a reply would slip through; the order is asserted, not the time
        real(p)
        order.append("segment gone")

    monkeypatch.setattr(recall_persist, "discard", late_discard)
    with LiveServer(settings) as srv:
        rows = srv.get("/api/characters/Lan/facts").json()["items"]
        cello = next(f["id"] for f in rows if "cello" in f["text"])
        assert srv.delete(f"/api/characters/Lan/facts/{cello}").status_code in (200, 204)
        order.append("answered")
        assert not paths.recall_segment.exists()
    assert order == ["segment gone", "answered"]


def test_a_damaged_stale_or_foreign_vector_block_is_ignored_and_the_feed_brings_the_vectors(
    tmp_path: Path, embedding_service: EmbeddingService
) -> None:
    settings = make_settings(tmp_path)
    paths = CharacterPaths(tmp_path, "Lan")
    query = "what beverage does the user enjoy"
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": t} for t in TEXTS]}).status_code == 200
        srv.wait_vectors("Lan")
    with LiveServer(settings, embeddings=embedding_service) as srv:
        before = _answers(srv, query)
    good = paths.recall_vectors.read_bytes()
    header, arrays = decode_segment(good)
    wire = arrays["wire"].copy()
    wire[:8] = 0xFF  # float16 NaNs in the first vector: what a wrong block would look like
    foreign = encode_segment(
        {**{k: v for k, v in header.items() if k not in ("version", "arrays", "crc32")}, "model": "another-model"}, arrays
    )
    poisoned = encode_segment({k: v for k, v in header.items() if k not in ("version", "arrays", "crc32")}, {**arrays, "wire": wire})
    torn = bytearray(good)
    torn[len(torn) // 2] ^= 0xFF
    assert recall_persist.load_vectors(paths) is not None
    for bad in (bytes(torn), good[: len(good) // 2], foreign):
        paths.recall_vectors.write_bytes(bad)
        with LiveServer(settings, embeddings=embedding_service) as srv:
            assert _answers(srv, query) == before
            assert srv.get("/health").json()["embeddings"]["pending"] == 0
    # A block no longer tied to the views (a fact edited while the server was down) is not
    # trusted either, however whole: its rows are not read.
    paths.recall_vectors.write_bytes(poisoned)
    assert recall_persist.load_vectors(paths) is not None
    facts = json.loads(paths.facts.read_bytes())
    paths.facts.write_text(json.dumps(facts))  # same content, a new file
    assert recall_persist.load_vectors(paths) is None
    with LiveServer(settings, embeddings=embedding_service) as srv:
        assert _answers(srv, query) == before


def test_the_records_byte_ranges_are_found_in_the_servers_layout_and_in_any_other(tmp_path: Path) -> None:
    """A stop writes the segment from each fact record's byte range in facts.json: the
    server's own compact layout is walked record after record, any other layout (an edit
    by hand) is found by each record's address; both give every record's exact bytes, and
    a file that is not a list of records gives none."""
    from nekomem.stores.atomic import encode_json

    records = [{"id": f"f{i}", "text": f"text {i} \u732b", "n": i, "nested": {"a": [i, "]"]}} for i in range(300)]
    path = tmp_path / "facts.json"
    layouts = {
        "server": encode_json(records),
        "indented": json.dumps(records, indent=2, ensure_ascii=False).encode(),
        "one record spaced": encode_json(records[:150])[:-2] + b", " + encode_json(records[150:])[1:],
    }
    for layout, data in layouts.items():
        path.write_bytes(data)
        ranges = recall_persist._record_ranges(path)
        assert ranges is not None, layout
        assert list(ranges) == [r["id"] for r in records], layout
        for record in records:
            start, end = ranges[record["id"]]
            assert json.loads(data[start:end]) == record, layout
    path.write_bytes(b'{"id": "f0"}')
    assert recall_persist._record_ranges(path) is None
    path.unlink()
    assert recall_persist._record_ranges(path) == {}
