"""Public knowledge packs on a real server (issue 34): the reference's import -> query
round trip in Chinese, Japanese and English, a disabled entry no longer returned, the
chat server's tool appearing and disappearing as its client sees it, durable jobs across a
restart, erasure by byte search, and bad input."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from nekomem.stores.layout import InvalidName, validate_name
from tests.support.knowledge_client import NO_RESULT, TOOL_NAME, MainServerStandIn
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

K = "/internal/knowledge"


def pack(pack_id: str = "world-notes", entries: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "pack_id": pack_id,
        "material_type": "knowledge",
        "source": {"name": "World notes", "homepage": "https://example.org/notes", "license": "CC0-1.0"},
        "entries": entries if entries is not None else ENTRIES,
        **extra,
    }


ENTRIES: list[dict[str, Any]] = [
    {
        "title": "Kotatsu",
        "summary": "A heated table.",
        "content": "A kotatsu is a low wooden table covered by a heavy blanket, with a heater underneath.",
    },
    {"title": "Shinkansen", "summary": "The bullet train.", "content": "The Shinkansen is Japan's network of high-speed railway lines."},
    {
        "title": "兰州拉面",
        "summary": "西北的牛肉面。",
        "content": "兰州拉面是一种清汤牛肉面，以一清二白三红四绿五黄著称。",
        "terms": {"alias": ["牛肉面"]},
    },
    {"title": "长城", "summary": "古代的防御工事。", "content": "长城是中国古代修建的军事防御工程，绵延上万里。"},
    {
        "title": "たこ焼き",
        "summary": "大阪の名物。",
        "content": "たこ焼きは小麦粉の生地にタコを入れて丸く焼いた大阪の料理です。",
        "tags": ["food"],
    },
    {"title": "富士山", "summary": "日本一高い山。", "content": "富士山は静岡県と山梨県にまたがる活火山で、標高は3776メートルです。"},
]


def post_pack(srv: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = srv.post(f"{K}/packs/import", json=body).json()
    return answer


def wait_job(srv: LiveServer, job_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        for job in srv.get(f"{K}/packs/jobs").json()["jobs"]:
            if job["job_id"] == job_id and job["state"] not in ("queued", "building"):
                return dict(job)
        return None

    result: dict[str, Any] = wait_for(finished, timeout=60, what="the import job")
    return result


def ask(srv: LiveServer, query: str, **fields: Any) -> dict[str, Any]:
    answer: dict[str, Any] = srv.post(f"{K}/query", json={"query": query, **fields}).json()
    return answer


def titles(answer: dict[str, Any]) -> list[str]:
    return [hit["title"] for hit in answer["hits"]]


def holders(root: Path, needle: str) -> list[str]:
    raw = needle.encode("utf-8")
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def ready(srv: LiveServer) -> None:
    wait_for(lambda: srv.get(f"{K}/availability").json()["ready"], timeout=30, what="knowledge ready")


def test_round_trip_in_three_languages_and_a_disabled_entry(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        assert srv.get(f"{K}/availability").json() == {"ok": True, "ready": True, "enabled": True, "tool_available": False}
        queued = post_pack(srv, pack())
        assert queued["ok"] is True and queued["state"] == "queued" and queued["entries_total"] == len(ENTRIES)
        job = wait_job(srv, queued["job_id"])
        assert job["state"] == "active" and job["entries_indexed"] == len(ENTRIES)
        assert srv.get(f"{K}/availability").json()["tool_available"] is True

        zh = ask(srv, "兰州拉面有什么特点？", language="zh")
        assert zh["result"] == "matched" and titles(zh)[0] == "兰州拉面"
        assert "兰州拉面" in zh["context"] and "来源: World notes" in zh["context"] and zh["tool_available"] is True
        assert titles(ask(srv, "牛肉面"))[0] == "兰州拉面"  # an alias
        ja = ask(srv, "たこ焼きはどこの料理ですか", language="ja")
        assert ja["result"] == "matched" and titles(ja)[0] == "たこ焼き" and "出典: World notes" in ja["context"]
        en = ask(srv, "what is a kotatsu?", language="en")
        assert en["result"] == "matched" and titles(en)[0] == "Kotatsu" and "heated table" in en["context"]
        assert en["card_ids"][0] == "world-notes/kotatsu" and en["retrieval_mode"] == "bm25"
        assert ask(srv, "quantum chromodynamics")["result"] == "miss"
        assert titles(ask(srv, "food", mode="sample")) == ["たこ焼き"]

        disabled = srv.post(f"{K}/entry/disabled", json={"pack_id": "world-notes", "title": "kotatsu", "disabled": True}).json()
        assert disabled["ok"] is True and disabled["disabled_entries"] == 1
        assert "Kotatsu" not in titles(ask(srv, "kotatsu heated table"))
        listed = srv.get(f"{K}/entries", params={"query": "kotatsu"}).json()["items"]
        assert [(item["title"], item["disabled"]) for item in listed] == [("Kotatsu", True)]
        entry = srv.get(f"{K}/entry", params={"pack_id": "world-notes", "title": "Kotatsu"}).json()["entry"]
        assert entry["content"].startswith("A kotatsu") and entry["disabled"] is True

        status = srv.get(f"{K}/status").json()["status"]
        assert (status["packs"], status["entries"], status["disabled_entries"]) == (1, len(ENTRIES), 1)
        page = srv.get(f"{K}/entries", params={"limit": 4, "offset": 4}).json()
        assert (page["total"], len(page["items"]), page["has_more"]) == (len(ENTRIES), 2, False)

    # A restart rebuilds the index from the files: the pack and the disabled entry persist.
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        assert titles(ask(srv, "长城"))[0] == "长城"
        assert "Kotatsu" not in titles(ask(srv, "kotatsu"))
        srv.post(f"{K}/entry/disabled", json={"pack_id": "world-notes", "title": "Kotatsu", "disabled": False})
        assert titles(ask(srv, "kotatsu"))[0] == "Kotatsu"


def test_policies_and_the_global_switch(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "memory")) as srv:
        ready(srv)
        wait_job(srv, post_pack(srv, pack())["job_id"])
        assert post_pack(srv, pack()) == {
            "ok": True, "pack_id": "world-notes", "unchanged": True, "state": "active", "ready": True, "enabled": True, "tool_available": True
        }  # fmt: skip
        auto = srv.post(f"{K}/packs/auto-context", json={"pack_id": "world-notes", "enabled": True}).json()
        assert auto["auto_context"] is True
        policy = srv.post(f"{K}/packs/index-policy", json={"pack_id": "world-notes", "local_embedding_enabled": False}).json()
        assert policy["local_embedding"] is False
        kind = srv.post(f"{K}/packs/material-type", json={"pack_id": "world-notes", "material_type": "corpus"}).json()
        assert (kind["material_type_override"], kind["effective_material_type"]) == ("corpus", "corpus")
        assert ask(srv, "kotatsu", material_type="knowledge")["result"] == "miss"
        assert ask(srv, "kotatsu", material_type="corpus")["result"] == "matched"
        (listed,) = srv.get(f"{K}/packs").json()["packs"]
        assert (listed["auto_context"], listed["local_embedding"], listed["vector_state"]) == (True, False, "off")
        off = srv.post(f"{K}/settings", json={"enabled": False}).json()
        assert off["enabled"] is False and off["tool_available"] is False
        assert ask(srv, "kotatsu")["result"] == "disabled"
        srv.post(f"{K}/settings", json={"enabled": True})
        assert ask(srv, "kotatsu")["result"] == "matched"
        # Re-importing a changed version keeps the user's choices.
        changed = pack(entries=[*ENTRIES[:2], {"title": "Onsen", "content": "An onsen is a hot spring."}])
        wait_job(srv, post_pack(srv, changed)["job_id"])
        (listed,) = srv.get(f"{K}/packs").json()["packs"]
        assert (listed["entries"], listed["auto_context"], listed["effective_material_type"]) == (3, True, "corpus")
        missing = srv.post(f"{K}/packs/auto-context", json={"pack_id": "nope-pack", "enabled": True}).json()
        assert (missing["ok"], missing["reason"]) == (False, "not_found")


def test_the_chat_servers_tool_appears_and_disappears(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "memory")) as srv:
        ready(srv)

        async def scenario() -> None:
            main = MainServerStandIn(srv.url, ttl=0.05, retry=0.05)
            main.start()
            try:
                await wait_async(lambda: main.polls >= 2, "two polls")
                assert TOOL_NAME not in main.tools
                assert await main.call_tool({"query": "kotatsu"}, "en") == NO_RESULT
                job = (await main._http.post(f"{K}/packs/import", json=pack())).json()
                await wait_async(lambda: TOOL_NAME in main.tools, "the tool to appear")
                assert (await main._http.get(f"{K}/packs/jobs")).json()["jobs"][0]["job_id"] == job["job_id"]
                answer = await main.call_tool({"query": "  kotatsu ", "limit": 9, "material_type": "bogus"}, "en")
                assert answer.startswith("[Public knowledge reference: begin]") and "Kotatsu" in answer
                zh = await main.call_tool({"query": "长城"}, "zh")
                assert "长城" in zh and zh.startswith("[公共知识参考·开始]")
                await main._http.post(f"{K}/packs/remove", json={"pack_id": "world-notes"})
                await wait_async(lambda: TOOL_NAME not in main.tools, "the tool to disappear")
                assert await main.call_tool({"query": "kotatsu"}, "en") == NO_RESULT
                assert main.changes == [True, False]
            finally:
                await main.close()

        asyncio.run(scenario())


async def wait_async(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_removing_a_pack_leaves_no_byte_of_its_text(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    secret = [{"title": "Zorblax QX7", "summary": "Vemtrik summary", "content": "Plonquist harbour ledger 88421."}]
    kept = [{"title": "Kotatsu", "content": "A kotatsu is a heated table."}]
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        wait_job(srv, post_pack(srv, pack("secret-pack", secret))["job_id"])
        wait_job(srv, post_pack(srv, pack("kept-pack", kept))["job_id"])
        assert holders(root, "Plonquist") and holders(root, "Vemtrik")
        assert ask(srv, "Plonquist harbour")["result"] == "matched"
        removed = srv.post(f"{K}/packs/remove", json={"pack_id": "secret-pack"}).json()
        assert removed["ok"] is True and removed["removed_entries"] == 1
        for needle in ("Plonquist", "Vemtrik", "Zorblax", "88421"):
            assert holders(root, needle) == [], needle
        assert ask(srv, "Plonquist harbour")["result"] == "miss"
        assert holders(root, "heated table") and ask(srv, "kotatsu")["result"] == "matched"
        # A new version without an entry leaves nothing of that entry either.
        wait_job(srv, post_pack(srv, pack("kept-pack", [{"title": "Onsen", "content": "An onsen is a hot spring."}]))["job_id"])
        assert holders(root, "heated table") == [] and holders(root, "hot spring")


def test_unfinished_jobs_resume_or_fail_after_a_restart(tmp_path: Path) -> None:
    """A process that ended mid-import: a building job whose staged pack is there runs again
    at the next start; one whose stage is gone fails as interrupted; a cancel asked for
    before the end stays a cancel."""
    root = tmp_path / "memory"
    folder = root / ".nekomem-knowledge"
    (folder / "staging").mkdir(parents=True)
    (folder / "staging" / "job-resumed.json").write_text(json.dumps(pack()), encoding="utf-8")
    (folder / "staging" / "job-cancelled.json").write_text(json.dumps(pack("other-pack")), encoding="utf-8")
    stamp = "2026-01-01T00:00:00+00:00"

    def job(job_id: str, pack_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "pack_id": pack_id,
            "state": "building",
            "created_at": stamp,
            "updated_at": stamp,
            "entries_total": 6,
            "entries_indexed": 3,
            **extra,
        }

    jobs = [job("job-resumed", "world-notes"), job("job-lost", "lost-pack"), job("job-cancelled", "other-pack", cancel_requested=True)]
    (folder / "jobs.json").write_text(json.dumps({"jobs": jobs}), encoding="utf-8")
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        assert wait_job(srv, "job-resumed")["state"] == "active"
        states = {j["job_id"]: (j["state"], j["reason"]) for j in srv.get(f"{K}/packs/jobs").json()["jobs"]}
        assert states == {"job-resumed": ("active", ""), "job-lost": ("failed", "interrupted"), "job-cancelled": ("cancelled", "")}
        assert titles(ask(srv, "kotatsu")) == ["Kotatsu"]
        assert not (folder / "staging" / "job-cancelled.json").exists() and not (folder / "staging" / "job-resumed.json").exists()
        # Finished jobs can be discarded, not cancelled; running or unknown ones the other way round.
        assert srv.post(f"{K}/packs/jobs/cancel", json={"job_id": "job-resumed"}).json()["ok"] is False
        for job_id in ("job-lost", "job-resumed"):
            discarded = srv.post(f"{K}/packs/jobs/discard", json={"job_id": job_id}).json()
            assert (discarded["ok"], discarded["job_id"]) == (True, job_id)
        assert srv.post(f"{K}/packs/jobs/discard", json={"job_id": "job-lost"}).json()["ok"] is False
        assert [j["job_id"] for j in srv.get(f"{K}/packs/jobs").json()["jobs"]] == ["job-cancelled"]
    with LiveServer(make_settings(root)) as srv:  # the discards were written down
        ready(srv)
        assert [j["job_id"] for j in srv.get(f"{K}/packs/jobs").json()["jobs"]] == ["job-cancelled"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (pack(extra_field=1), "unexpected_pack_field"),
        (pack("Bad ID"), "invalid_pack_id"),
        (pack(entries=[]), "invalid_entries"),
        (pack(entries=[{"title": "A", "content": "x"}, {"title": " a ", "content": "y"}]), "duplicate_title"),
        (pack(entries=[{"title": "A", "content": "x", "vector": [1.0]}]), "unexpected_entry_field"),
        ({**pack(), "schema_version": 2}, "unsupported_schema_version"),
    ],
)
def test_a_refused_pack_names_its_reason_and_changes_nothing(tmp_path: Path, body: dict[str, Any], reason: str) -> None:
    with LiveServer(make_settings(tmp_path / "memory")) as srv:
        ready(srv)
        answer = post_pack(srv, body)
        assert (answer["ok"], answer["reason"]) == (False, reason)
        assert srv.get(f"{K}/packs/jobs").json()["jobs"] == []


def test_bad_requests_and_the_guard(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "memory")) as srv:
        ready(srv)
        not_object = srv.post(f"{K}/query", content=b"[1]", headers={"Content-Type": "application/json"})
        assert not_object.status_code == 400
        assert not_object.json() | {"message": ""} == {
            "status": "error",
            "error_code": "invalid_request",
            "message": "",
            "ok": False,
            "reason": "invalid_request",
        }
        assert srv.post(f"{K}/settings", json={"enabled": "yes"}).status_code == 400
        assert srv.get(f"{K}/entries", params={"limit": 0}).status_code == 400
        assert srv.get(f"{K}/entry", params={"pack_id": "x"}).status_code == 400
        plain = srv.post(f"{K}/settings", content=b'{"enabled": false}', headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415 and srv.get(f"{K}/availability").json()["enabled"] is True
        foreign = srv.post(
            f"{K}/packs/import",
            files={"pack": ("p.json", json.dumps(pack()).encode(), "application/json")},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
        too_big = srv.post(
            f"{K}/packs/import", content=b" " * (10 * 1024 * 1024 + 64 * 1024 + 1), headers={"Content-Type": "application/json"}
        )
        assert too_big.status_code == 413 and too_big.json()["reason"] == "pack_too_large"
        two_files = srv.post(f"{K}/packs/import", files={"a": ("a", b"1"), "b": ("b", b"2")})
        assert two_files.status_code == 400
        # The chat server's proxy forwards the browser's upload as multipart.
        uploaded = srv.post(f"{K}/packs/import", files={"pack": ("p.json", json.dumps(pack()).encode(), "application/json")}).json()
        assert uploaded["ok"] is True and uploaded["pack_id"] == "world-notes"
        assert wait_job(srv, uploaded["job_id"])["state"] == "active"
        long_query = srv.get(f"{K}/entries", params={"query": "kotatsu " * 300})
        assert long_query.status_code == 200 and long_query.json()["items"][0]["title"] == "Kotatsu"
        srv.runtime.startup_block = "test"
        try:
            blocked = srv.post(f"{K}/query", json={"query": "x"})
            assert blocked.status_code == 409 and blocked.json()["error_code"] == "storage_startup_blocked"
        finally:
            srv.runtime.startup_block = None


def test_a_token_guards_the_knowledge_routes(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "memory", api_token="s3cret")) as srv:
        assert httpx.get(f"{srv.url}{K}/availability").status_code == 401
        answer = httpx.get(f"{srv.url}{K}/availability", headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and answer.json()["ok"] is True


def test_the_knowledge_folder_is_no_character_name() -> None:
    with pytest.raises(InvalidName):
        validate_name(".nekomem-knowledge")
    with pytest.raises(InvalidName):
        validate_name(".NEKOMEM-Knowledge")


def test_vectors_make_a_lookup_hybrid(tmp_path: Path, embedding_service: Any) -> None:
    with LiveServer(make_settings(tmp_path / "memory"), embeddings=embedding_service) as srv:
        ready(srv)
        wait_job(srv, post_pack(srv, pack())["job_id"])
        wait_for(lambda: srv.get(f"{K}/status").json()["status"]["chunks_ready"] == len(ENTRIES), timeout=120, what="vectors")
        (listed,) = srv.get(f"{K}/packs").json()["packs"]
        assert listed["vector_state"] == "complete"
        answer = ask(srv, "high-speed trains in Japan", budget_ms=5000)
        assert answer["retrieval_mode"] == "hybrid" and titles(answer)[0] == "Shinkansen"
        assert ask(srv, "quantum chromodynamics", budget_ms=5000)["result"] == "miss"  # the vector leg has a threshold
        # Vectors off: keyword-only again.
        srv.post(f"{K}/packs/index-policy", json={"pack_id": "world-notes", "local_embedding_enabled": False})
        assert srv.get(f"{K}/packs").json()["packs"][0]["vector_state"] == "off"
        assert ask(srv, "Shinkansen")["retrieval_mode"] == "bm25"


def test_cancel_a_queued_and_a_building_import(tmp_path: Path) -> None:
    """The service with real files and its real worker thread; holding its lock is the
    barrier: the worker cannot start (or continue) a job while the test holds it."""
    from nekomem.runtime.knowledge import KnowledgeService
    from nekomem.stores.knowledge import KnowledgeFiles

    root = tmp_path / "memory"
    service = KnowledgeService(KnowledgeFiles(root), lambda: "2026-01-01T00:00:00+00:00")
    service.start()
    try:
        assert service.wait_ready(30)
        staging = root / ".nekomem-knowledge" / "staging"
        # Long entries (about 4 MB in all) keep the build busy for many batches, so the
        # poll below finds it building even on a fast, quiet machine.
        filler = " ".join(f"word{k}" for k in range(120))
        big = pack(
            "big-pack",
            [{"title": f"Card {i}", "content": f"Content number {i} of the cancelled pack. {filler}"} for i in range(5000)],
        )
        with service.st.lock:  # the worker waits at the job's first step
            queued = service.import_pack(json.dumps(pack()).encode())
            assert service.cancel_job(queued["job_id"]) is True
            assert not (staging / f"{queued['job_id']}.json").exists()
            building = service.import_pack(json.dumps(big).encode())

        def caught_building() -> bool:
            with service.st.lock:  # between two batches of the build: cancel before the next one
                job = next(j for j in service.list_jobs() if j["job_id"] == building["job_id"])
                assert job["state"] in ("queued", "building"), job
                if job["state"] != "building":
                    return False
                assert job["entries_indexed"] < job["entries_total"]
                return service.cancel_job(building["job_id"])

        wait_for(caught_building, timeout=60, what="the import building")

        def finished(job_id: str) -> dict[str, Any] | None:
            job = next(j for j in service.list_jobs() if j["job_id"] == job_id)
            return job if job["state"] not in ("queued", "building") else None

        assert wait_for(lambda: finished(building["job_id"]), what="the cancel")["state"] == "cancelled"
        assert finished(queued["job_id"])["state"] == "cancelled"  # type: ignore[index]
        assert len(service.st.index) == 0 and service.availability()["tool_available"] is False
        assert list(staging.iterdir()) == [] and list((root / ".nekomem-knowledge" / "packs").iterdir()) == []
        assert holders(root, "cancelled pack") == []
        assert service.cancel_job(building["job_id"]) is False and service.discard_job(building["job_id"]) is True
    finally:
        service.stop()
