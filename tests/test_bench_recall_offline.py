"""The offline recall bench answers every question with the same rows as a real server, and
its vector cache and headroom table do what they say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.locomo_quality import RankedAnswer, bench_settings, load_conversation, run_conversation
from bench.recall_experiments import EXPERIMENTS, ExperimentIndex
from bench.recall_offline import Answer, VectorCache, cache_path, depth_rows
from bench.recall_offline import run_conversation as run_offline
from nekomem.models.embeddings import EmbeddingService, EmbeddingsUnavailable

SESSIONS = [
    (
        "1:56 pm on 8 May, 2023",
        {
            "Caroline": [
                ["Caroline went to an LGBTQ support group and found it powerful.", "D1:3"],
                ["Caroline is researching adoption agencies to build her own family.", "D1:5"],
                ["Caroline is researching adoption agencies to build her family.", "D1:6"],  # near duplicate: dropped on import
            ],
            "Melanie": [
                ["Melanie painted a lake sunrise last year.", "D1:8"],
                ["Melanie runs every morning to clear her head.", "D1:10"],
            ],
        },
    ),
    (
        "10:37 am on 27 June, 2023",
        {
            "Caroline": [["Caroline gave a talk at a school about her transition.", "D2:2"]],
            "Melanie": [
                ["Melanie took her kids camping in the mountains.", "D2:5"],
                ["Melanie is learning to play the violin.", "D2:7"],
                ["Melanie signed up for a pottery class.", "D2:9"],
            ],
        },
    ),
    (
        "8:18 pm on 14 August, 2023",
        {
            "Caroline": [
                ["Caroline passed the adoption agency interviews.", "D3:1"],
                ["Caroline started learning the piano.", "D3:4"],
            ],
            "Melanie": [["Melanie and her family watched a meteor shower while camping.", "D3:6; D3:7"]],
        },
    ),
]
QUESTIONS = [
    ("What is Caroline researching?", ["D1:5"], 4),
    ("What activities does Melanie partake in?", ["D1:10", "D2:7", "D2:9"], 1),
    ("When did Melanie go camping in the mountains?", ["D2:5"], 2),
    ("What did Caroline do in August 2023?", ["D3:1", "D3:4"], 2),
    ("Would Melanie enjoy a trip to a national park?", ["D2:5", "D3:6"], 3),
]


def write_conversation(folder: Path) -> Path:
    data: dict[str, object] = {}
    for number, (when, observations) in enumerate(SESSIONS, start=1):
        data[f"session_{number}_date_time"] = when
        data[f"session_{number}_observation"] = observations
    data["qa"] = [{"question": q, "evidence": ev, "category": cat, "answer": "-"} for q, ev, cat in QUESTIONS]
    path = folder / "conv-test.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("overrides", [{}, {"embedding_enabled": False}], ids=["hybrid", "bm25"])
def test_every_question_gets_the_same_rows_offline_as_over_http(
    tmp_path: Path, embedding_service: EmbeddingService, overrides: dict[str, object]
) -> None:
    facts, questions = load_conversation(write_conversation(tmp_path), "none")
    ranked: list[RankedAnswer] = []
    scores, _ = run_conversation(tmp_path / "http", overrides, embedding_service, facts, questions, ranked=ranked)
    settings = bench_settings(tmp_path / "offline", **overrides)
    vectors = VectorCache(embedding_service, None) if settings.embeddings.embedding_enabled else None
    answers, legs = run_offline(settings, vectors, facts, questions)

    assert [a.texts for a in answers] == [r.texts for r in ranked]
    assert [a.rows for a in answers] == [r.cited for r in ranked]
    assert [a.score() for a in answers] == [s for _, s in scores]
    assert sum(bool(a.texts) for a in answers) >= 3
    # The near duplicate was dropped on both paths, so it is never a row.
    assert not any("build her family." in t for a in answers for t in a.texts)
    assert legs[0] == "bm25" and len(legs) >= 2


def test_the_vector_cache_is_read_back_without_the_model_and_a_missing_text_needs_it(
    tmp_path: Path, embedding_service: EmbeddingService
) -> None:
    path = cache_path(tmp_path, embedding_service)
    cache = VectorCache(embedding_service, path)
    rows = cache.embed(["Melanie runs every morning.", "Caroline plays the piano."], "passage")
    query = cache.embed(["Who runs?"], "query")
    cache.save()
    assert path.is_file()

    disabled = EmbeddingService(bench_settings(tmp_path, embedding_enabled=False).embeddings)
    again = VectorCache(disabled, path)
    assert (again.embed(["Caroline plays the piano.", "Melanie runs every morning."], "passage") == rows[::-1]).all()
    assert (again.embed(["Who runs?"], "query") == query).all()
    with pytest.raises(EmbeddingsUnavailable):
        again.embed(["Who runs?"], "passage")  # same text, other kind: not cached
    assert cache_path(tmp_path, disabled) != path  # another model (here: none) never reads these rows


def test_the_headroom_table_scores_each_leg_their_union_and_the_fused_rows() -> None:
    hit, miss = frozenset({"e1"}), frozenset()
    answer = Answer(
        category=1,
        evidence=frozenset({"e1", "e2"}),
        texts=("a", "b"),
        rows=(hit, miss),
        legs=((hit, miss), (miss, frozenset({"e2"})), (frozenset({"e2"}),)),  # the third leg is not a base leg
    )
    table = dict(depth_rows([answer], ["bm25", "use"], 1))
    assert table["bm25 top 1"] == [(1, 0.5)]
    assert table["use top 1"] == [(1, 0.0)]
    assert dict(depth_rows([answer], ["bm25", "use"], 2))["union of legs' top 2"] == [(1, 1.0)]
    assert table["union of legs' top 1"] == [(1, 0.5)]
    assert table["fused top 1"] == [(1, 0.5)]


def test_an_experiment_that_keeps_the_base_legs_changes_nothing_and_each_experiment_runs(
    tmp_path: Path, embedding_service: EmbeddingService, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts, questions = load_conversation(write_conversation(tmp_path), "none")
    settings = bench_settings(tmp_path)
    vectors = VectorCache(embedding_service, None)
    plain, _ = run_offline(settings, vectors, facts, questions)

    def base_legs(index: ExperimentIndex, base: list[list[str]], *rest: object) -> list[list[str]]:
        return base

    monkeypatch.setitem(EXPERIMENTS, "unchanged", base_legs)
    same, _ = run_offline(settings, vectors, facts, questions, "unchanged")
    assert [a.texts for a in same] == [a.texts for a in plain]
    for name in sorted(set(EXPERIMENTS) - {"unchanged"}):
        answers, _ = run_offline(settings, vectors, facts, questions, name)
        assert all(0 < len(a.texts) <= settings.recall.recall_budget_total for a in answers), name
    # char-ngrams adds a leg of its own: every search fuses more legs than without it.
    with_ngrams, _ = run_offline(settings, vectors, facts, questions, "char-ngrams")
    assert all(len(a.legs) > len(b.legs) for a, b in zip(with_ngrams, plain, strict=True))
