"""The background refinement pass through the real runtime: LiveServer, the scripted LLM
server for refine_cluster, the real local embedding model for the vectors, and a manual
clock: advancing it fires the timers that came due."""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from nekomem.models.embeddings import EmbeddingService
from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import Reply, last_user_text
from tests.support.live import ROOT, LiveServer, make_settings
from tests.support.waiting import quiesce

MODEL = ROOT / "models" / "use-multilingual-v3" / "model.onnx"
NAME = "Lan"
DELAY = 60.0
INTERVAL = 1800.0
TEA = "Master loves green tea every morning"
TEA_2 = "Master loves drinking green tea in the morning"
JOB = "Master is a software engineer"
FACT_TEXTS = [
    "Master brewed sencha at dawn",
    "A kettle whistles in Master's kitchen",
    "Master bought a new teapot",
    "Master said warm drinks calm him",
    "Master visited a tea farm in Shizuoka",
    "Master sips matcha before work",
    "Master keeps a jar of gyokuro leaves",
    "Master prefers cups without handles",
    "Master read a book about tea ceremonies",
    "Master refills his flask at noon",
    "Master fixed a bug in the payment service",
    "Master reviews code on Fridays",
    "Master writes Python at his job",
    "Master's team ships a release every month",
    "Master mentors two junior developers",
]


@pytest.fixture(scope="module")
def embeddings(embedding_service: EmbeddingService) -> EmbeddingService:
    """The shared real model (tests/conftest.py)."""
    return embedding_service


def settings_for(tmp_path: Path, fake_llm: Any, **extra: Any) -> Any:
    return make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        llm_max_retries=0,
        longterm_refine_reflection_initial_delay_seconds=DELAY,
        longterm_refine_persona_initial_delay_seconds=DELAY,
        longterm_refine_interval_seconds=INTERVAL,
        passivate_idle_seconds=1e9,  # the manual clock jumps by days; keep the actors alive
        **extra,
    )


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def entry_ids(request: dict[str, Any]) -> list[str]:
    return re.findall(r"^\[([^\]]+)\] ", last_user_text(request), flags=re.M)


def reflections(srv: LiveServer) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in srv.get(f"/api/characters/{NAME}/reflections", params={"limit": 100}).json()["items"]}


def make_reflection(srv: LiveServer, batch: int) -> str:
    facts = [{"text": text, "importance": 7} for text in FACT_TEXTS[batch * 5 : batch * 5 + 5]]
    r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts})
    assert r.status_code == 200 and len(r.json()["added"]) == 5, r.text
    body = srv.post(f"/reflect/{NAME}").json()
    assert body["reflection"] is not None, body
    return body["reflection"]["id"]


def wait_vectors(srv: LiveServer) -> None:
    srv.post(f"/query_memory/{NAME}", json={"query": "sync"})
    wait_for(lambda: srv.get("/health").json()["embeddings"]["pending"] == 0, "vectors")


def run_pass(srv: LiveServer, clock: ManualClock, seconds: float, **delta: float) -> None:
    clock.advance(seconds, **delta)  # posts every timer that came due
    quiesce(srv.runtime, NAME)


def test_reflection_clusters_are_refined_and_revisited(tmp_path: Path, fake_llm: Any, embeddings: EmbeddingService) -> None:
    texts = iter([TEA, TEA_2, JOB])
    fake_llm.on(
        "synthesize_reflection",
        lambda req: {
            "reflection": {"text": next(texts), "entity": "master", "time_scope": "pattern", "event_start_at": None, "event_end_at": None}
        },
    )
    fake_llm.on("refine_cluster", lambda req: {"actions": [{"op": "keep", "ids": entry_ids(req), "texts": []}]})
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    with LiveServer(settings_for(tmp_path, fake_llm), clock=clock, embeddings=embeddings) as srv:
        tea = make_reflection(srv, 0)
        tea2 = make_reflection(srv, 1)
        job = make_reflection(srv, 2)
        wait_vectors(srv)

        # First pass: one cluster of the two tea reflections; "keep" only stamps them.
        run_pass(srv, clock, DELAY + 1)
        wait_for(lambda: fake_llm.calls("refine_cluster"), "refine_cluster")
        call = fake_llm.calls("refine_cluster")[0]
        assert call["headers"]["x-nekomem-task"] == "refine_cluster"
        assert sorted(entry_ids(call["body"])) == sorted([tea, tea2])
        stamped = wait_for(lambda: (lambda rs: rs if rs[tea]["last_refine_cluster_hash"] else None)(reflections(srv)), "stamps")
        assert stamped[tea]["last_refine_cluster_hash"] == stamped[tea2]["last_refine_cluster_hash"]
        assert stamped[job]["last_refine_cluster_hash"] is None
        assert stamped[tea]["text"] == TEA and stamped[tea]["status"] == "pending"

        # Next pass: the same cluster was refined less than 30 days ago, nothing is sent.
        run_pass(srv, clock, INTERVAL + 1)
        assert len(fake_llm.calls("refine_cluster")) == 1

        # A failure counts an attempt and changes nothing else.
        fake_llm.queue("refine_cluster", Reply.status(500, "boom"))
        run_pass(srv, clock, 0, days=31)
        wait_for(lambda: reflections(srv)[tea]["refine_attempts"] == 1, "failure recorded")
        assert reflections(srv)[tea2]["refine_attempts"] == 1 and reflections(srv)[tea]["text"] == TEA

        # Garbage ids and an id from outside the cluster are ignored; the merge applies.
        def merge(req: dict[str, Any]) -> dict[str, Any]:
            ids = entry_ids(req)
            return {
                "actions": [
                    {"op": "modify", "ids": [job], "texts": ["hijacked"]},
                    {"op": "merge", "ids": [*ids, "ref_0000000000000000"], "texts": ["Master drinks green tea every morning"]},
                ]
            }

        fake_llm.on("refine_cluster", merge)
        run_pass(srv, clock, INTERVAL + 1)
        merged = wait_for(
            lambda: (lambda rs: rs if "merged" in {rs[tea]["status"], rs[tea2]["status"]} else None)(reflections(srv)), "merge"
        )
        survivor, gone = (merged[tea], merged[tea2]) if merged[tea2]["status"] == "merged" else (merged[tea2], merged[tea])
        assert survivor["text"] == "Master drinks green tea every morning" and survivor["status"] == "pending"
        assert gone["absorbed_into"] == survivor["id"]
        assert set(survivor["source_fact_ids"]) >= set(gone["source_fact_ids"]) and len(survivor["source_fact_ids"]) == 10
        assert survivor["modification_history"][-1]["reason"] == "refine_merge"
        assert survivor["refine_attempts"] == 0
        assert merged[job]["text"] == JOB and merged[job]["status"] == "pending"
        # The merged one leaves what the character sees; the survivor is there once.
        dialog = srv.get(f"/new_dialog/{NAME}").text
        assert "Master drinks green tea every morning" in dialog and gone["text"] not in dialog

    # The transitions were journaled: a restart reads the same state.
    with LiveServer(settings_for(tmp_path, fake_llm), clock=clock, embeddings=embeddings) as srv:
        again = reflections(srv)
        assert again[gone["id"]]["status"] == "merged" and again[survivor["id"]]["text"] == survivor["text"]


def write_persona(root: Path) -> None:
    folder = root / NAME
    folder.mkdir(parents=True)
    persona = {
        "master": {
            "facts": [
                {"id": "card_0000aaaa", "text": "Master loves green tea", "source": "character_card", "protected": True},
                {
                    "id": "manual_20260301000000_00000001",
                    "text": TEA,
                    "source": "manual",
                    "reinforcement": 0.5,
                    "rein_last_signal_at": "2026-03-01T09:00:00+00:00",
                },
                {
                    "id": "manual_20260301000000_00000002",
                    "text": TEA_2,
                    "source": "reflection",
                    "source_id": "ref_00000000000000aa",
                    "reinforcement": 1.5,
                    "rein_last_signal_at": "2026-03-01T09:00:00+00:00",
                },
                {"id": "manual_20260301000000_00000003", "text": JOB, "source": "manual"},
            ]
        },
        "neko": {"facts": []},
        "relationship": {"facts": []},
    }
    (folder / "persona.json").write_text(json.dumps(persona), encoding="utf-8")


def persona_items(srv: LiveServer) -> list[dict[str, Any]]:
    return srv.get(f"/api/characters/{NAME}/persona", params={"limit": 100}).json()["items"]


def test_persona_entries_are_embedded_and_merged_without_touching_protected(
    tmp_path: Path, fake_llm: Any, embeddings: EmbeddingService
) -> None:
    write_persona(tmp_path)

    def merge_all(req: dict[str, Any]) -> dict[str, Any]:
        ids = entry_ids(req)
        return {
            "actions": [
                {"op": "merge", "ids": ids, "texts": ["Master drinks green tea each morning"]},
                {"op": "discard", "ids": ["card_0000aaaa"], "texts": []},
            ]
        }

    fake_llm.on("refine_cluster", merge_all)
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    with LiveServer(settings_for(tmp_path, fake_llm), clock=clock, embeddings=embeddings) as srv:
        before = persona_items(srv)
        card = [e for e in before if e["protected"]]
        run_pass(srv, clock, DELAY + 1)
        wait_for(lambda: fake_llm.calls("refine_cluster"), "refine_cluster")
        assert sorted(entry_ids(fake_llm.calls("refine_cluster")[0]["body"])) == [
            "manual_20260301000000_00000001",
            "manual_20260301000000_00000002",
        ]
        items = wait_for(lambda: (lambda xs: xs if len(xs) == 3 else None)(persona_items(srv)), "the merge")
        assert [e for e in items if e["protected"]] == card
        survivor = [e for e in items if e["id"] == "manual_20260301000000_00000002"][0]
        assert survivor["text"] == "Master drinks green tea each morning"
        assert survivor["merged_from_ids"] == ["manual_20260301000000_00000001"]
        assert survivor["version_history"][-1]["text"] == TEA_2 and survivor["version_history"][-1]["reason"] == "refine_merge"
        assert survivor["reinforcement"] > 1.0
        assert JOB in [e["text"] for e in items]
        srv.runtime.registry.ask_sync(
            NAME, "persona", lambda reply: __import__("nekomem.actors.messages", fromlist=["Flush"]).Flush(reply=reply)
        )
        on_disk = json.loads((tmp_path / NAME / "persona.json").read_text(encoding="utf-8"))
        job_entry = [e for e in on_disk["master"]["facts"] if e["text"] == JOB][0]
        assert job_entry["embedding"] and job_entry["embedding_model_id"] == embeddings.model_id  # cached, reused next pass
        assert [e for e in on_disk["master"]["facts"] if e["protected"]][0].get("embedding") is None


def test_without_embeddings_the_pass_does_nothing_and_says_so_once(tmp_path: Path, fake_llm: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nekomem.actors")
    write_persona(tmp_path)
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    with LiveServer(settings_for(tmp_path, fake_llm, embedding_enabled=False), clock=clock) as srv:
        assert len(persona_items(srv)) == 4
        for _ in range(3):
            run_pass(srv, clock, INTERVAL + 1)
        wait_for(lambda: sum("refinement is off" in r.getMessage() for r in caplog.records) >= 2, "the INFO notes")
        quiesce(srv.runtime, NAME)
        notes = [r.getMessage() for r in caplog.records if "refinement is off" in r.getMessage()]
        assert sorted(notes) == ["persona refinement is off: no embedding model", "reflection refinement is off: no embedding model"]
        assert fake_llm.calls("refine_cluster") == []
        assert len(persona_items(srv)) == 4
