"""POST /query_memory and GET /api/tools/recall_memory over real HTTP (LiveServer), with the
real default embedding model where its file exists. Memories are created through the API
routes (fact import, /reflect with the scripted LLM, feedback, /cache, card import)."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nekomem.domain.subjects import LEGACY_PRIVATE_SCOPE
from nekomem.http.schemas import RecallAnswer, RecallResult
from nekomem.models.embeddings import EmbeddingService
from nekomem.runtime.clock import ManualClock
from tests.support.live import ROOT, LiveServer, make_settings

MODEL = ROOT / "models" / "use-multilingual-v3" / "model.onnx"
NAME = "Lan"

FACTS = [
    "Master loves drinking green tea every morning",
    "Master works as a software engineer at a bank in Osaka",
    "Master is allergic to peanuts",
    "Master's younger sister lives in Canada",
    "Master plays the piano badly but is proud of it",
    "Master dislikes rainy days",
    "Master bought a red bicycle last spring",
    "Master's favourite film is an old samurai movie",
    "ご主人様は毎週土曜日にプールで泳いでいる",
    "ご主人様は辛いラーメンが大好きだ",
    "ご主人様は来月引っ越す予定だ",
    "ご主人様は古いカメラを集めている",
    "主人养了一只叫小白的猫",
    "主人最近在学习弹吉他",
    "主人下个月要去北京出差",
    "主人每天晚上都会看一集动画",
]
# A paraphrase in other words (and, for some, another language) -> the fact it must find.
PARAPHRASES = [
    ("what beverage does the user enjoy", "Master loves drinking green tea every morning"),
    ("food the user cannot eat", "Master is allergic to peanuts"),
    ("family living abroad", "Master's younger sister lives in Canada"),
    ("ご主人様の運動の習慣は？", "ご主人様は毎週土曜日にプールで泳いでいる"),
    ("ご主人様の好きな食べ物", "ご主人様は辛いラーメンが大好きだ"),
    ("主人有宠物吗", "主人养了一只叫小白的猫"),
    ("主人在学什么乐器", "主人最近在学习弹吉他"),
    ("主人的出差计划", "主人下个月要去北京出差"),
    ("user's favourite drink", "Master loves drinking green tea every morning"),
    ("does master have a pet?", "主人养了一只叫小白的猫"),
]


@pytest.fixture(scope="module")
def embeddings(embedding_service: EmbeddingService) -> EmbeddingService:
    """The shared real model (tests/conftest.py)."""
    return embedding_service


def ask(srv: LiveServer, **body: Any) -> dict[str, Any]:
    r = srv.post(f"/query_memory/{NAME}", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert "error_code" not in data, data
    return data


def texts(body: dict[str, Any]) -> list[str]:
    return [r["text"] for r in body["results"]]


def import_facts(srv: LiveServer, facts: list[dict[str, Any]]) -> list[str]:
    r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts})
    assert r.status_code == 200, r.text
    return r.json()["added"]


def wait_vectors(srv: LiveServer, timeout: float = 60.0) -> None:
    srv.wait_vectors(NAME, timeout)


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_paraphrases_in_three_languages(tmp_path: Path, embeddings: EmbeddingService) -> None:
    with LiveServer(make_settings(tmp_path), embeddings=embeddings) as srv:
        import_facts(srv, [{"text": t} for t in FACTS])
        wait_vectors(srv)
        assert srv.get("/health").json()["embeddings"]["state"] == "ready"
        for query, expected in PARAPHRASES:
            body = ask(srv, query=query)
            assert expected in texts(body)[:3], (query, texts(body))
            row = body["results"][texts(body).index(expected)]
            assert set(row) == {
                "id",
                "text",
                "tier",
                "entity",
                "score",
                "created_at",
                "event_start_at",
                "event_end_at",
                "subject_kind",
                "subject_id",
                "scope",
            }
            assert row["tier"] == "fact" and row["entity"] == "master" and row["score"] > 0
            assert body["query"] == query and body["candidates_total"] == len(FACTS) and body["elapsed_ms"] >= 0


def test_no_shared_word_is_found_by_the_vector_leg_only(tmp_path: Path, embeddings: EmbeddingService) -> None:
    facts = [{"text": t} for t in FACTS]
    query, expected = "what beverage does the user enjoy", "Master loves drinking green tea every morning"
    with LiveServer(make_settings(tmp_path / "hybrid"), embeddings=embeddings) as srv:
        import_facts(srv, facts)
        wait_vectors(srv)
        assert expected in texts(ask(srv, query=query))
    settings = make_settings(tmp_path / "bm25", embedding_enabled=False)
    with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
        import_facts(srv, facts)
        assert expected not in texts(ask(srv, query=query))


def test_named_query_blend_and_hub_correction_over_http(tmp_path: Path, embeddings: EmbeddingService) -> None:
    """A query naming someone, with the hubness correction on: the playground's vector leg
    is the hub-ranked search of the blended query vector, and /query_memory answers the
    playground's fused list."""
    people = ["Melanie", "Caroline", "Joanna"]
    topics = [
        "painted a lake sunrise",
        "goes swimming with her kids",
        "values her family",
        "is learning the violin",
        "reads poetry at night",
    ]
    facts = [f"{p} {t}" for p in people for t in topics]
    settings = make_settings(tmp_path, recall_vector_hub_min_vectors=len(facts), recall_budget_each=4)
    with LiveServer(settings, embeddings=embeddings) as srv:
        ids_by_text = dict(zip(facts, import_facts(srv, [{"text": t} for t in facts]), strict=True))
        wait_vectors(srv)
        query = "What did Melanie paint?"
        plain = ask(srv, query=query)
        explained = srv.post(f"/api/browse/{NAME}/recall_explain", json={"query": query}).json()
        assert [r["id"] for r in explained["fused"]] == [r["id"] for r in plain["results"]]
        assert explained["thresholds"]["vector_hub_weight"] == 1.0 and explained["thresholds"]["query_unnamed_weight"] == 0.5

        # The same leg computed here from the model: blend, then rank against the centroid.
        from nekomem.recall.names import blend_query_vectors, query_vector_texts
        from nekomem.recall.vectors import VectorIndex

        index = VectorIndex(embeddings.dim or 0)
        for text, row in zip(facts, embeddings.embed(facts), strict=True):
            index.upsert(ids_by_text[text], row)
        qvec = blend_query_vectors(embeddings.embed(query_vector_texts(query, 0.5), "query"), 0.5)
        expected = [i for i, _ in index.search(qvec, 4, min_score=settings.recall.recall_cosine_threshold, hub=1.0)]
        (leg,) = explained["vector_legs"]  # one model: one leg over all its columns
        assert leg["model"] == embeddings.model_id and leg["columns"] == [0, embeddings.dim]
        assert leg["threshold"] == settings.recall.recall_cosine_threshold
        assert [r["id"] for r in leg["hits"] if r["removed"] is None] == expected
        assert [r["vector_ranks"] for r in explained["fused"]] == [
            [expected.index(r["id"]) + 1 if r["id"] in expected else None] for r in explained["fused"]
        ]
        assert expected != [i for i, _ in index.search(qvec, 4, min_score=settings.recall.recall_cosine_threshold)]


def test_bm25_alone_when_embeddings_are_disabled(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, embedding_enabled=False, display_timezone="UTC")
    clock = ManualClock(datetime(2026, 3, 10, 12, tzinfo=timezone.utc))
    with LiveServer(settings, clock=clock, embeddings=EmbeddingService(settings.embeddings)) as srv:
        import_facts(
            srv,
            [{"text": t, "event_start_at": "2026-03-09T10:00:00+00:00"} for t in FACTS[:8]]
            + [{"text": t, "event_start_at": "2026-02-01T10:00:00+00:00"} for t in FACTS[8:]],
        )
        health = srv.get("/health").json()["embeddings"]
        assert health["state"] == "disabled" and health["pending"] == 0
        assert texts(ask(srv, query="green tea"))[0] == "Master loves drinking green tea every morning"
        assert texts(ask(srv, query="ラーメン"))[0] == "ご主人様は辛いラーメンが大好きだ"
        assert texts(ask(srv, query="吉他"))[0] == "主人最近在学习弹吉他"
        assert texts(ask(srv, query="bicycles"))[0] == "Master bought a red bicycle last spring"  # plural folded
        assert set(texts(ask(srv, time="yesterday"))) == set(FACTS[:8])
        assert texts(ask(srv, query="ラーメン", time="yesterday")) == []
    # No embedding service at all: the same.
    with LiveServer(make_settings(tmp_path / "none")) as srv:
        import_facts(srv, [{"text": t} for t in FACTS])
        assert srv.get("/health").json()["embeddings"]["state"] == "disabled"
        assert texts(ask(srv, query="peanuts")) == ["Master is allergic to peanuts"]


def test_thousands_of_facts_in_one_import(tmp_path: Path, embeddings: EmbeddingService) -> None:
    rng = random.Random(7)
    words = [
        "river",
        "garden",
        "violin",
        "mountain",
        "bakery",
        "library",
        "subway",
        "festival",
        "harbor",
        "museum",
        "lantern",
        "meadow",
        "glacier",
        "orchard",
        "canyon",
        "pottery",
        "ferry",
        "temple",
        "market",
        "stadium",
    ]
    verbs = ["visited", "painted", "described", "photographed", "remembered", "sketched", "mentioned", "praised"]
    facts = [
        {"text": f"Master {rng.choice(verbs)} the {rng.choice(words)} near {rng.choice(words)} on trip {i} code{i:05d}"}
        for i in range(3000)
    ]
    facts[1234] = {"text": "Master once saw a purple giraffe at the zoo in Sapporo"}
    with LiveServer(make_settings(tmp_path), embeddings=embeddings) as srv:
        added = import_facts(srv, facts)
        assert len(added) == 3000
        body = ask(srv, query="purple giraffe")
        assert body["candidates_total"] == 3000
        assert texts(body)[0] == "Master once saw a purple giraffe at the zoo in Sapporo"
        assert texts(ask(srv, query="code02999"))[0].endswith("code02999")
        # 3,000 passages: minutes on a loaded 2-core machine, under a minute on a quiet one.
        wait_vectors(srv, timeout=300)
        for query in ("zoo animal sighting", "動物園でキリンを見た", "长颈鹿"):  # found by the vector leg
            assert "Master once saw a purple giraffe at the zoo in Sapporo" in texts(ask(srv, query=query))[:2], query


def reflection_for(texts_by_call: list[str]) -> Any:
    calls = iter(texts_by_call)

    def handler(request: dict[str, Any]) -> dict[str, Any]:
        return {
            "reflection": {"text": next(calls), "entity": "master", "time_scope": "pattern", "event_start_at": None, "event_end_at": None}
        }

    return handler


def make_reflection(srv: LiveServer, facts: list[str]) -> str:
    import_facts(srv, [{"text": t, "importance": 7} for t in facts])
    body = srv.post(f"/reflect/{NAME}").json()
    assert body["reflection"] is not None, body
    return body["reflection"]["id"]


def test_hard_filters_and_persona(tmp_path: Path, fake_llm: Any, embeddings: EmbeddingService) -> None:
    fake_llm.on(
        "synthesize_reflection",
        reflection_for(
            [
                "Master adores oolong tea with honey",
                "Master jogs along the river on weekends",
                "Master collects vintage postage stamps",
            ]
        ),
    )
    # Post-turn records finish at the next extraction; no idle wait keeps the test short.
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", fact_extract_idle_seconds=0)
    with LiveServer(settings, embeddings=embeddings) as srv:
        srv.post(
            f"/api/characters/{NAME}/card", json={"entries": [{"entity": "neko", "text": "Lan is a cat girl who adores sardines"}]}
        ).raise_for_status()
        denied = make_reflection(
            srv,
            [
                "Master brewed oolong tea at dawn",
                "A honey jar sits next to Master's teapot",
                "Master ordered oolong in a cafe",
                "Master said tea calms the nerves",
                "Master gifted a tea set to a friend",
            ],
        )
        ignored = make_reflection(
            srv,
            [
                "Master ran five kilometres on Saturday",
                "Master bought new running shoes",
                "The riverside path is Master's favourite route",
                "Master stretched after the run",
                "Master timed a personal best on Sunday",
            ],
        )
        suppressed = make_reflection(
            srv,
            [
                "Master showed me an album of old stamps",
                "A stamp from 1950 is Master's treasure",
                "Master visited a philately fair",
                "Master traded stamps with a pen pal",
                "Master keeps stamps in a leather binder",
            ],
        )
        wait_vectors(srv)
        found = ask(srv, query="oolong tea honey")
        assert denied in [r["id"] for r in found["results"]]
        assert [r["tier"] for r in found["results"] if r["id"] == denied] == ["reflection"]
        assert ignored in [r["id"] for r in ask(srv, query="jogs river weekends")["results"]]
        assert suppressed in [r["id"] for r in ask(srv, query="vintage postage stamps")["results"]]

        for rid, feedback in ((denied, "denied"), (ignored, "ignored"), (suppressed, "confirmed")):
            r = srv.post(f"/api/characters/{NAME}/reflections/{rid}/feedback", json={"feedback": feedback})
            assert r.status_code == 200, r.text
        assert denied not in [r["id"] for r in ask(srv, query="oolong tea honey")["results"]]  # denied
        assert ignored not in [r["id"] for r in ask(srv, query="jogs river weekends")["results"]]  # score < 0
        assert suppressed in [r["id"] for r in ask(srv, query="vintage postage stamps")["results"]]  # confirmed: still there
        # The character keeps bringing the stamps up: mentioned too often -> suppressed.
        for _ in range(3):
            history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Shall we look at your vintage postage stamps?"}]
            assert srv.post(f"/cache/{NAME}", json={"input_history": history}).status_code == 200
        wait_for(lambda: suppressed not in [r["id"] for r in ask(srv, query="vintage postage stamps")["results"]], "suppression")
        # The facts those reflections came from are still facts; persona never appears.
        assert any(r["tier"] == "fact" for r in ask(srv, query="oolong tea")["results"])
        for query in ("sardines", "cat girl who adores sardines", "Lan"):
            assert all("sardines" not in r["text"] for r in ask(srv, query=query)["results"])


def test_render_markdown_and_tool_schema(tmp_path: Path) -> None:
    clock = ManualClock(datetime(2026, 3, 10, 12, tzinfo=timezone.utc))
    with LiveServer(make_settings(tmp_path, display_timezone="UTC"), clock=clock) as srv:
        import_facts(
            srv,
            [
                {"text": "Master loves drinking green tea every morning", "event_start_at": "2026-03-07T08:00:00+00:00"},
                {"text": "Master drank green tea in Kyoto", "event_start_at": "2026-01-20T08:00:00+00:00"},
            ],
        )
        body = srv.post(f"/query_memory/{NAME}", json={"query": "green tea", "render": "markdown"}).json()
        lines = body["markdown"].split("\n")
        assert lines[0] == "Found 2 relevant memories:"
        assert [line[:3] for line in lines[1:]] == ["1. ", "2. "]
        assert {line[3:] for line in lines[1:]} == {
            "[fact/about the user] Master loves drinking green tea every morning  (2026-03-07, 3d ago)",
            "[fact/about the user] Master drank green tea in Kyoto  (2026-01-20, 1mo ago)",
        }
        body = srv.post(f"/query_memory/{NAME}", json={"query": "green tea", "render": "markdown", "language": "ja-JP"}).json()
        assert body["markdown"].startswith("関連する記憶を 2 件見つけました：\n1. [事実/ユーザーについて] ") and "3日前" in body["markdown"]
        body = srv.post(f"/query_memory/{NAME}", json={"query": "green tea", "render": "markdown", "language": "zh"}).json()
        assert body["markdown"].startswith("找到 2 条相关记忆：\n1. [事实/关于用户] ")
        body = srv.post(f"/query_memory/{NAME}", json={"query": "green tea", "time": "2025", "render": "markdown"}).json()
        assert body["results"] == [] and body["markdown"].startswith('No memory matched "green tea" within that time range.')
        body = srv.post(f"/query_memory/{NAME}", json={"query": "volcano", "render": "markdown"}).json()
        assert body["markdown"] == "No relevant memory found."
        long_text = "tea " * 3000
        import_facts(srv, [{"text": "Master wrote a long essay about tea " + long_text}])
        body = srv.post(f"/query_memory/{NAME}", json={"query": "essay", "render": "markdown"}).json()
        assert len(body["markdown"]) < len(long_text) // 2 and body["markdown"].startswith("Found 1 relevant memories:")

        tool = srv.get("/api/tools/recall_memory").json()
        assert tool["name"] == "recall_memory" and tool["parameters"]["required"] == []
        assert set(tool["parameters"]["properties"]) == {"query", "time"}
        assert all(p["type"] == "string" for p in tool["parameters"]["properties"].values())
        assert srv.get("/api/tools/recall_memory", params={"language": "zh-CN"}).json()["description"].startswith("回忆")


def test_bad_bodies(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        import_facts(srv, [{"text": "Master loves green tea"}])
        for body in (
            {"query": 3},
            {"time": ["2026"]},
            {"query": "tea", "render": "html"},
            {"query": "tea", "language": 5},
            {"query": "tea", "subjects": []},
        ):
            r = srv.post(f"/query_memory/{NAME}", json=body)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["status"] == "error" and r.json()["error_code"]
        # Neither query nor time: the reference's no-op, 200 with no rows.
        for body in ({}, {"query": "  ", "time": ""}):
            r = srv.post(f"/query_memory/{NAME}", json=body)
            assert r.status_code == 200 and r.json()["results"] == [], (body, r.text)
        # (Content-Type must be JSON since issue 10: without it the guard answers 415.)
        assert srv.post(f"/query_memory/{NAME}", content=b"not json", headers={"content-type": "application/json"}).status_code == 400
        assert srv.post("/query_memory/..", json={"query": "tea"}).status_code in (400, 404)
        # An unparsable time is ignored: the query is answered as if alone.
        body = ask(srv, query="green tea", time="when pigs fly")
        assert texts(body) == ["Master loves green tea"]
        assert ask(srv, time="when pigs fly") == {"results": [], "query": "", "candidates_total": 0, "elapsed_ms": 0.0}


def test_merged_reflection_leaves_the_pool(tmp_path: Path, fake_llm: Any) -> None:
    fake_llm.on("synthesize_reflection", reflection_for(["Master grows basil on the balcony", "Master waters balcony herbs daily"]))
    target: dict[str, str] = {}

    def judge(request: dict[str, Any]) -> dict[str, Any]:
        if not target:
            return {"action": "promote", "target_id": None, "text": None, "reason": None}
        return {"action": "merge", "target_id": target["id"], "text": "Master tends balcony herbs", "reason": None}

    fake_llm.on("judge_promotion", judge)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv:
        first = make_reflection(
            srv,
            [
                "Master planted basil seeds",
                "The basil pot is on the balcony",
                "Master picked basil for pasta",
                "Master bought potting soil",
                "Basil smells great, Master said",
            ],
        )
        for _ in range(2):
            srv.post(f"/api/characters/{NAME}/reflections/{first}/feedback", json={"feedback": "confirmed"}).raise_for_status()
        srv.post(f"/reflect/{NAME}").raise_for_status()
        persona = srv.get(f"/api/characters/{NAME}/persona").json()["items"]
        target["id"] = next(e["id"] for e in persona if e.get("source_id") == first)
        second = make_reflection(
            srv,
            [
                "Master watered the mint",
                "Master moved the thyme into the sun",
                "A rosemary pot arrived",
                "Master trimmed the parsley",
                "Master checks the herbs every evening",
            ],
        )
        assert second in [r["id"] for r in ask(srv, query="waters balcony herbs daily")["results"]]
        for _ in range(2):
            srv.post(f"/api/characters/{NAME}/reflections/{second}/feedback", json={"feedback": "confirmed"}).raise_for_status()
        body = srv.post(f"/reflect/{NAME}").json()
        assert any(p["reflection_id"] == second and p["kind"] == "merged" for p in body["promotion"]), body
        # The persona answers /reflect before the reflection layer has applied the merge.
        wait_for(lambda: second not in [r["id"] for r in ask(srv, query="waters balcony herbs daily")["results"]], "merge")
        refs = {r["id"]: r["status"] for r in srv.get(f"/api/characters/{NAME}/reflections").json()["items"]}
        assert refs[second] == "merged" and refs[first] == "promoted"
        # A promoted reflection stays searchable (only denied/archived/merged/promote_blocked leave).
        assert first in [r["id"] for r in ask(srv, query="basil balcony")["results"]]


def test_the_recall_answer_schema_declares_every_key_sent(tmp_path: Path) -> None:
    """The published RecallAnswer/RecallResult (http/schemas.py, /openapi.json) name every
    key /query_memory sends, for a recall by query and one by time alone."""
    answer_keys = {f.name for f in msgspec.structs.fields(RecallAnswer)}
    row_keys = {f.name for f in msgspec.structs.fields(RecallResult)}
    assert {f.name: f.default for f in msgspec.structs.fields(RecallResult)}["scope"] == LEGACY_PRIVATE_SCOPE
    clock = ManualClock(datetime(2026, 3, 10, 12, tzinfo=timezone.utc))
    with LiveServer(make_settings(tmp_path, display_timezone="UTC"), clock=clock) as srv:
        import_facts(srv, [{"text": "Master loves drinking green tea every morning", "event_start_at": "2026-03-07T08:00:00+00:00"}])
        by_query = srv.post(f"/query_memory/{NAME}", json={"query": "green tea"}).json()
        by_time = srv.post(f"/query_memory/{NAME}", json={"time": "2026"}).json()
        schema = srv.get("/openapi.json").json()["components"]["schemas"]
    for body in (by_query, by_time):
        assert body["results"], body
        assert set(body) <= answer_keys
        assert all(set(row) <= row_keys for row in body["results"])
        msgspec.convert(body, RecallAnswer)  # and the values have the declared types
    assert "time" in by_time and {"subject_kind", "subject_id", "scope"} <= set(by_query["results"][0])
    assert {"subject_kind", "subject_id", "scope"} <= set(schema["RecallResult"]["properties"])
    assert "time" in schema["RecallAnswer"]["properties"]
