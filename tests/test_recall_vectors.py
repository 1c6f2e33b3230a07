"""Exact cosine index: normalisation, top-k against brute force, filters, free-list reuse."""

from __future__ import annotations

import numpy as np
import pytest

from nekomem.config.recall import RecallSettings
from nekomem.recall.vectors import VectorIndex

DIM = 16


def brute_force(vectors: dict[str, np.ndarray], q: np.ndarray, k: int, exclude: str | None = None) -> list[str]:
    qn = q / np.linalg.norm(q)
    sims = {d: float(v @ qn / np.linalg.norm(v)) for d, v in vectors.items() if d != exclude}
    return [d for d, _ in sorted(sims.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


@pytest.fixture()
def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {f"v{i:03d}": rng.normal(size=DIM) for i in range(200)}


def build(data: dict[str, np.ndarray], capacity: int = 8) -> VectorIndex:
    index = VectorIndex(DIM, RecallSettings(recall_index_initial_capacity=capacity))
    for doc_id, vec in data.items():
        index.upsert(doc_id, vec)
    return index


def test_rows_are_unit_vectors_and_scores_are_cosines(data: dict[str, np.ndarray]) -> None:
    index = build(data)  # also grows from 8 rows to 256
    assert len(index) == 200
    stored = index.get("v010")
    assert stored is not None and np.linalg.norm(stored) == pytest.approx(1.0, abs=1e-6)
    q = np.arange(DIM, dtype=np.float64) - 7.5
    hits = index.search(q * 3.0, 10)
    assert [d for d, _ in hits] == brute_force(data, q, 10)
    v = data[hits[0][0]]
    assert hits[0][1] == pytest.approx(float(v @ q / np.linalg.norm(v) / np.linalg.norm(q)), abs=1e-5)
    assert all(a[1] >= b[1] for a, b in zip(hits, hits[1:], strict=False))


def test_search_accepts_a_one_row_matrix_and_rejects_bad_shapes(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    q = data["v001"]
    assert index.search(q.reshape(1, DIM), 3) == index.search(q, 3)
    with pytest.raises(ValueError):
        index.search(np.ones(DIM + 1), 3)
    with pytest.raises(ValueError):
        index.upsert("bad", np.ones((2, DIM)))
    with pytest.raises(ValueError):
        index.upsert("bad", ["x"] * DIM)
    with pytest.raises(ValueError):
        index.upsert("zero", np.zeros(DIM))
    with pytest.raises(ValueError):
        index.upsert("nan", np.full(DIM, np.nan))
    with pytest.raises(ValueError):
        VectorIndex(0)
    assert index.search(np.zeros(DIM), 3) == []
    assert index.search(q, 0) == []
    assert VectorIndex(DIM).search(q, 3) == []


def test_allowed_set_and_predicate(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    q = data["v050"] + data["v051"]
    allowed = {f"v{i:03d}" for i in range(0, 200, 3)} | {"nope"}
    expected = brute_force({d: v for d, v in data.items() if d in allowed}, q, 5)
    assert [d for d, _ in index.search(q, 5, allowed=allowed)] == expected
    assert [d for d, _ in index.search(q, 5, allowed=lambda d: d in allowed)] == expected
    small = {"v001", "v002"}
    assert sorted(d for d, _ in index.search(q, 5, allowed=small)) == ["v001", "v002"]
    assert index.search(q, 5, allowed=set()) == []


def test_min_score_drops_weak_hits(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    hits = index.search(data["v007"], 200, min_score=0.3)
    assert hits and hits[0][0] == "v007" and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert all(score >= 0.3 for _, score in hits)
    assert len(hits) < 200


def test_upsert_replaces_and_remove_frees_rows_for_reuse(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    target = data["v100"]
    index.upsert("v000", target)  # replace
    assert {d for d, _ in index.search(target, 2)} == {"v000", "v100"}
    assert index.remove("v100") is True and index.remove("v100") is False
    assert "v100" not in index and len(index) == 199
    assert [d for d, _ in index.search(target, 1)] == ["v000"]
    for i in range(50):
        index.remove(f"v{i + 101:03d}")
    rows_before = index._matrix.shape[0]
    for i in range(50):
        index.upsert(f"n{i}", data[f"v{i + 101:03d}"])
    assert index._matrix.shape[0] == rows_before  # freed rows were reused
    remaining = {d: v for d, v in data.items() if d not in {f"v{i + 101:03d}" for i in range(50)} | {"v100"}}
    remaining["v000"] = target
    remaining.update({f"n{i}": data[f"v{i + 101:03d}"] for i in range(50)})
    q = data["v120"] - data["v003"]
    assert [d for d, _ in index.search(q, 10)] == brute_force(remaining, q, 10)


def test_neighbours_exclude_the_entry_itself(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    near = index.neighbours("v042", 5)
    assert [d for d, _ in near] == brute_force(data, data["v042"], 5, exclude="v042")
    assert index.neighbours("v042", 5, allowed={"v042", "v043"}) == [near_of(index, "v042", "v043")]
    with pytest.raises(KeyError):
        index.neighbours("missing", 3)


def near_of(index: VectorIndex, a: str, b: str) -> tuple[str, float]:
    va, vb = index.get(a), index.get(b)
    assert va is not None and vb is not None
    return (b, pytest.approx(float(va @ vb), abs=1e-5))  # type: ignore[return-value]


def test_centroid_follows_upserts_replacements_and_removals(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    units = {d: v / np.linalg.norm(v) for d, v in data.items()}
    assert np.allclose(index.centroid(), np.mean(list(units.values()), axis=0), atol=1e-5)
    index.upsert("v000", data["v001"])  # a replacement leaves one row for v000
    index.remove("v002")
    units["v000"] = units["v001"]
    del units["v002"]
    assert np.allclose(index.centroid(), np.mean(list(units.values()), axis=0), atol=1e-5)
    for doc_id in list(units):
        index.remove(doc_id)
    assert len(index) == 0 and np.allclose(index.centroid(), 0.0, atol=1e-5)


def brute_force_hub(data: dict[str, np.ndarray], q: np.ndarray, k: int, hub: float, min_cos: float) -> list[tuple[str, float]]:
    units = {d: v / np.linalg.norm(v) for d, v in data.items()}
    centroid = np.mean(list(units.values()), axis=0)
    qn = q / np.linalg.norm(q)
    scored = [(d, float(u @ qn), float(u @ qn - hub * (u @ centroid))) for d, u in units.items()]
    kept = sorted((s for s in scored if s[1] >= min_cos), key=lambda s: (-s[2], s[0]))[:k]
    return [(d, cos) for d, cos, _ in kept]


def test_hub_correction_ranks_against_the_centroid_and_returns_cosines(data: dict[str, np.ndarray]) -> None:
    index = build(data)
    q = np.sin(np.arange(DIM, dtype=np.float64))
    plain = index.search(q, 10)
    for hub, min_cos in ((1.0, 0.0), (0.5, 0.1), (2.0, -1.0)):
        hits = index.search(q, 10, min_score=min_cos, hub=hub)
        expected = brute_force_hub(data, q, 10, hub, min_cos)
        assert [d for d, _ in hits] == [d for d, _ in expected]
        assert [s for _, s in hits] == pytest.approx([s for _, s in expected], abs=1e-5)  # plain cosines
        assert all(s >= min_cos for _, s in hits)
    assert [d for d, _ in index.search(q, 10, hub=1.0)] != [d for d, _ in plain]  # it does reorder
    assert index.search(q, 10, hub=0.0) == plain
    # The allowed filters (a small set: the rows alone; a predicate: every row) agree.
    allowed = {f"v{i:03d}" for i in range(0, 200, 3)}
    by_set = index.search(q, 5, allowed, hub=1.0)
    by_predicate = index.search(q, 5, allowed.__contains__, hub=1.0)
    assert [d for d, _ in by_set] == [d for d, _ in by_predicate]
    assert [d for d, _ in by_set] == [d for d, _ in brute_force_hub(data, q, 200, 1.0, -1.0) if d in allowed][:5]
    # The cached dots with the centroid follow writes: add a crowd near q, remove a few rows.
    rng = np.random.default_rng(3)
    for i in range(60):
        data[f"w{i:03d}"] = q + rng.normal(scale=0.3, size=DIM)
        index.upsert(f"w{i:03d}", data[f"w{i:03d}"])
    for doc_id in ("v001", "v002", "w000"):
        index.remove(doc_id)
        del data[doc_id]
    hits = index.search(q, 10, min_score=0.1, hub=1.0)
    expected = brute_force_hub(data, q, 10, 1.0, 0.1)
    assert [d for d, _ in hits] == [d for d, _ in expected]
    assert [s for _, s in hits] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_a_hub_vector_loses_its_place_to_a_specific_one() -> None:
    # Most memories point along x ("generic"); g leans towards them, s does not.
    index = VectorIndex(3)
    for i in range(20):
        index.upsert(f"x{i:02d}", [1.0, 0.01 * i, 0.0])
    index.upsert("g", [0.9, 0.436, 0.0])
    index.upsert("s", [0.0, 0.6, 0.8])
    q = np.array([0.6, 0.8, 0.0])
    assert [d for d, _ in index.search(q, 2)] == ["g", "x19"]
    assert [d for d, _ in index.search(q, 2, hub=1.0)] == ["s", "g"]
    # An explicit centroid replaces the index's own (here: one that discounts nothing).
    assert [d for d, _ in index.search(q, 2, hub=1.0, centroid=np.zeros(3))] == ["g", "x19"]
    # With a fixed centroid, a replaced row is ranked with its new dot (the cache follows writes).
    along_x = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    assert [d for d, _ in index.search(q, 1, hub=1.0, centroid=along_x)] == ["s"]
    index.upsert("s", [1.0, 0.0, 0.0])  # now s is the most generic of all
    assert [d for d, _ in index.search(q, 1, hub=1.0, centroid=along_x)] == ["g"]
    with pytest.raises(ValueError):
        index.search(q, 2, hub=1.0, centroid=np.zeros(4))
