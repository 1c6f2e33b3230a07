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
    rows_before = index.capacity
    for i in range(50):
        index.upsert(f"n{i}", data[f"v{i + 101:03d}"])
    assert index.capacity == rows_before  # freed rows were reused
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


# -- column ranges: two models side by side, each unit vector scaled by 1/sqrt(2) ---------------
BLOCKS = ((0, 10), (10, 16))
W = float(1 / np.sqrt(2))


def two_model_data(n: int = 240, seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        parts = [rng.normal(size=stop - start) for start, stop in BLOCKS]
        out[f"p{i:03d}"] = np.concatenate([p / np.linalg.norm(p) * W for p in parts])
    return out


def brute_force_columns(
    data: dict[str, np.ndarray],
    q: np.ndarray,
    k: int,
    columns: tuple[int, int],
    hub: float,
    min_score: float,
    centroid: np.ndarray | None = None,
) -> list[tuple[str, float]]:
    """Each stored unit row's slice dotted with the query's normalised slice, ranked minus
    ``hub`` times the slice's dot with ``centroid`` (default: the mean row's slice)."""
    start, stop = columns
    units = {d: v / np.linalg.norm(v) for d, v in data.items()}
    mean = np.mean(list(units.values()), axis=0)[start:stop] if centroid is None else centroid
    qs = q[start:stop] / np.linalg.norm(q[start:stop])
    scored = [(d, float(u[start:stop] @ qs), float(u[start:stop] @ qs - hub * (u[start:stop] @ mean))) for d, u in units.items()]
    kept = sorted((s for s in scored if s[1] >= min_score), key=lambda s: (-s[2], s[0]))[:k]
    return [(d, score) for d, score, _ in kept]


@pytest.mark.parametrize("cuts", [(), (10,), (3, 10, 13)])  # one array; one per model; cuts inside the models
@pytest.mark.parametrize("columns", BLOCKS)
@pytest.mark.parametrize("hub", [0.0, 1.0])
def test_a_column_range_ranks_as_brute_force_and_as_a_masked_query(cuts: tuple[int, ...], columns: tuple[int, int], hub: float) -> None:
    data = two_model_data()
    index = VectorIndex(16, RecallSettings(recall_index_initial_capacity=8), blocks=cuts)  # also grows from 8 rows
    for doc_id, vec in data.items():
        index.upsert(doc_id, vec)
    start, stop = columns
    rng = np.random.default_rng(start + 1)
    allowed = {f"p{i:03d}" for i in range(0, 240, 4)}
    for _ in range(5):
        q = rng.normal(size=16)
        for min_score in (-1.0, 0.1 * W):
            hits = index.search(q, 12, min_score=min_score, hub=hub, columns=columns)
            expected = brute_force_columns(data, q, 12, columns, hub, min_score)
            assert [d for d, _ in hits] == [d for d, _ in expected]
            assert [s for _, s in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
            # The query zeroed outside the range, over every column, with the centroid zeroed
            # the same way (how the legs searched before column ranges): the same answer.
            masked = np.zeros(16)
            masked[start:stop] = q[start:stop]
            full_centroid = np.zeros(16, dtype=np.float32)
            full_centroid[start:stop] = index.centroid()[start:stop]
            old = index.search(masked, 12, min_score=min_score, hub=hub, centroid=full_centroid)
            assert [d for d, _ in hits] == [d for d, _ in old]
            assert [s for _, s in hits] == pytest.approx([s for _, s in old], abs=1e-6)
        # Inside an allowed set (few rows: copied out) and through a predicate (every row).
        expected = [d for d, _ in brute_force_columns(data, q, 240, columns, hub, -1.0) if d in allowed][:5]
        assert [d for d, _ in index.search(q, 5, allowed, hub=hub, columns=columns)] == expected
        assert [d for d, _ in index.search(q, 5, allowed.__contains__, hub=hub, columns=columns)] == expected
    # Writes move the centroid; the cached dots of this range follow.
    for i in range(30):
        index.remove(f"p{i:03d}")
        del data[f"p{i:03d}"]
    q = rng.normal(size=16)
    hits = index.search(q, 12, hub=hub, columns=columns)
    assert [d for d, _ in hits] == [d for d, _ in brute_force_columns(data, q, 12, columns, hub, -1.0)]


def test_the_hub_cache_is_kept_per_column_range() -> None:
    # Two blocks of equal width searched with the same explicit centroid: a cache keyed by the
    # centroid alone would hand the second block the first block's dots.
    rng = np.random.default_rng(5)
    data = {f"d{i:02d}": rng.normal(size=8) for i in range(60)}
    index = VectorIndex(8)
    for doc_id, vec in data.items():
        index.upsert(doc_id, vec)
    centroid = np.array([0.9, -0.4, 0.3, 0.2], dtype=np.float32)
    q = rng.normal(size=8)
    for columns in ((0, 4), (4, 8), (0, 4)):
        hits = index.search(q, 10, hub=2.0, centroid=centroid, columns=columns)
        expected = brute_force_columns(data, q, 10, columns, 2.0, -1.0, centroid)
        assert [d for d, _ in hits] == [d for d, _ in expected]
        assert [s for _, s in hits] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_bad_column_ranges_and_centroids_are_refused() -> None:
    index = VectorIndex(6)
    index.upsert("a", [1, 0, 0, 0, 0, 1])
    for bad in ((0, 0), (3, 2), (-1, 3), (2, 7)):
        with pytest.raises(ValueError, match="columns"):
            index.search(np.ones(6), 1, columns=bad)
    with pytest.raises(ValueError, match="centroid"):
        index.search(np.ones(6), 1, hub=1.0, centroid=np.zeros(6), columns=(0, 3))
    with pytest.raises(ValueError):
        index.search(np.ones(3), 1, columns=(0, 3))  # the query is always the full width
    # A query that is zero inside the range has no direction there: no hits.
    assert index.search([0, 0, 0, 1, 1, 1], 1, columns=(0, 3)) == []
    assert index.search([1, 1, 0, 0, 0, 0], 1, columns=(0, 3)) == [("a", pytest.approx(1 / np.sqrt(2) / np.sqrt(2), abs=1e-6))]


@pytest.mark.parametrize("cuts", [(10,), (3, 10, 13)])
def test_column_blocks_store_and_search_what_one_matrix_does(cuts: tuple[int, ...]) -> None:
    data = two_model_data(n=120)
    one = VectorIndex(16, RecallSettings(recall_index_initial_capacity=8))
    split = VectorIndex(16, RecallSettings(recall_index_initial_capacity=8), blocks=cuts)
    for index in (one, split):
        for doc_id, vec in data.items():
            index.upsert(doc_id, vec)
        index.upsert("p005", data["p006"])  # a replacement
        for i in range(10, 30):
            index.remove(f"p{i:03d}")  # freed rows, reused below
        for i in range(10):
            index.upsert(f"n{i}", data[f"p{i + 40:03d}"] + 0.1)
    assert one.capacity == split.capacity == 128
    assert sorted(one.ids()) == sorted(split.ids())
    for doc_id in one.ids():
        assert np.allclose(one.get(doc_id), split.get(doc_id), atol=1e-7)  # type: ignore[arg-type]
    assert np.allclose(one.centroid(), split.centroid(), atol=1e-7)
    q = np.cos(np.arange(16, dtype=np.float64))
    for columns in (None, (0, 10), (10, 16), (2, 14)):  # the last one crosses every cut
        for hub in (0.0, 1.0):
            a, b = one.search(q, 10, hub=hub, columns=columns), split.search(q, 10, hub=hub, columns=columns)
            assert [d for d, _ in a] == [d for d, _ in b]
            assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-6)
    a, b = one.neighbours("p050", 5), split.neighbours("p050", 5)
    assert [d for d, _ in a] == [d for d, _ in b] and [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-6)
    assert [d for d, _ in split.neighbours("p050", 5)] == brute_force_from(split, "p050", 5)
    with pytest.raises(ValueError, match="cuts"):
        VectorIndex(16, blocks=(16,))
    with pytest.raises(ValueError, match="cuts"):
        VectorIndex(16, blocks=(0,))


def brute_force_from(index: VectorIndex, doc_id: str, k: int) -> list[str]:
    vectors = {d: index.get(d) for d in index.ids()}
    return brute_force(vectors, vectors[doc_id], k, exclude=doc_id)  # type: ignore[arg-type]
