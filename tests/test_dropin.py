"""nekomem swapped in for the reference memory server: its launcher, its chat server's
client calls, its QQ plugin's group memory, its memory browser (all over real HTTP)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import Reply
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
GROUP = {"subject_kind": "group_chat", "subject_id": "qq:123456"}
MEMBER = {"subject_kind": "group_participant", "subject_id": "qq:123456:777"}
PERSON = {"subject_kind": "participant", "subject_id": "qq:777"}
PRIVATE_FACTS = ["Master's bank PIN hint is the cat's birthday", "Master is afraid of thunder", "Master loves green tea"]


def turn(role: str, text: str) -> dict:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def launcher_probe(port: int) -> dict | None:
    """The reference launcher's /health probe, byte for byte: a raw socket, HTTP/1.1,
    ``Connection: close``, the body split off and de-chunked, accepted only with its app name."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while True:
            try:
                data = sock.recv(4096)
            except TimeoutError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        sock.close()
    raw = b"".join(chunks).decode("utf-8", errors="replace")
    if "\r\n\r\n" not in raw:
        return None
    body = raw.split("\r\n\r\n", 1)[1].strip()
    if body and "\r\n" in body:
        size_line, rest = body.split("\r\n", 1)
        try:
            int(size_line.split(";", 1)[0].strip(), 16)
            body = rest.rsplit("\r\n0", 1)[0] if "\r\n0" in rest else rest
        except ValueError:
            pass
    payload = json.loads(body)
    return payload if isinstance(payload, dict) and payload.get("app") == "N.E.K.O" else None


def port_of(srv: LiveServer) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def journal_texts(root: Path, name: str) -> list[str]:
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        rows = [json.loads(m) for (m,) in db.execute("SELECT message FROM time_indexed_original ORDER BY id")]
    finally:
        db.close()
    return [r["data"]["content"] for r in rows]


def recent_texts(root: Path, name: str) -> list[str]:
    return [item["data"]["content"] for item in json.loads((root / name / "recent.json").read_text(encoding="utf-8"))]


def test_launcher_probe_recognises_the_memory_server(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, instance_id="launch-42")) as srv:
        health = launcher_probe(port_of(srv))
        assert health is not None, "the launcher would treat the port as taken by another program"
        # What the launcher's attach check reads, and nekomem's own identity beside it.
        assert health["service"] == "memory" and health["instance_id"] == "launch-42" and health["status"] == "ok"
        assert health["server"] == "nekomem" and health["version"]
        for key in ("limited_mode", "active_characters", "llm", "embeddings", "model_jobs"):
            assert key in health


def test_the_chat_servers_calls_replayed(tmp_path: Path) -> None:
    """The reference client's sequence (neko-server.md §2): per-turn /cache with the
    double-encoded history, hot-swap /renew then /settle with the whole history, the context
    fetch, the recall tool, proactive chat, the memory browser, session end."""
    with LiveServer(make_settings(tmp_path)) as srv:
        assert launcher_probe(port_of(srv)) is not None
        # Before anything is stored: reads answer the reference's empty answers and create nothing.
        assert srv.get(f"/new_dialog/{NAME}").text == ""
        assert srv.get(f"/last_conversation_gap/{NAME}").json() == {"gap_seconds": -1}
        assert srv.post(f"/query_memory/{NAME}", json={"query": "tea", "language": "zh-CN"}).json()["results"] == []
        assert srv.get(f"/followup_topics/{NAME}").json() == {"topics": []}
        assert srv.post(f"/cancel_correction/{NAME}").json() == {"status": "no_task"}
        assert not (tmp_path / NAME).exists()

        history = [turn("user", "我最近在学做拿铁"), turn("assistant", "[20261201 Tue 09:59] 喵～好厉害")]
        r = srv.post(f"/cache/{NAME}", json={"input_history": json.dumps(history, indent=2, ensure_ascii=False)})
        assert r.json() == {"status": "cached", "count": 2}
        history += [turn("user", "明天想去咖啡店"), turn("assistant", "[20261201 Tue 10:01] 一起去吧")]
        assert srv.post(f"/renew/{NAME}", json={"input_history": json.dumps(history[2:], ensure_ascii=False)}).json() == {
            "status": "processed"
        }
        # Nothing left to sync: the client sends the whole, already cached history to /settle.
        assert srv.post(f"/settle/{NAME}", json={"input_history": json.dumps(history, ensure_ascii=False)}).json() == {"status": "settled"}
        assert journal_texts(tmp_path, NAME).count("明天想去咖啡店") == 1

        context = srv.get(f"/new_dialog/{NAME}", params={"language": "zh", "master_name": "主人"}).text
        # No long-term memory yet: no empty long-term heading.
        assert "======Lan的长期记忆======" not in context and "======以下是Lan的内心活动======" in context
        assert "开始聊天前，Lan又在脑海内整理了近期发生的事情" in context
        assert "主人 | 我最近在学做拿铁" in context and "Lan | 喵～好厉害" in context and "20261201" not in context
        r = srv.post(f"/query_memory/{NAME}", json={"query": "拿铁", "language": "zh"})
        assert r.status_code == 200 and "results" in r.json()
        assert srv.post(f"/query_memory/{NAME}", json={"query": "", "language": "zh"}).json()["results"] == []
        assert srv.get(f"/last_conversation_gap/{NAME}").json()["gap_seconds"] >= 0
        assert "topics" in srv.get(f"/followup_topics/{NAME}").json()
        assert srv.post(f"/record_surfaced/{NAME}", json={}).json()["ok"] is True
        assert srv.post(f"/record_surfaced/{NAME}", json={"reflection_ids": []}).status_code == 200
        assert srv.post(f"/cancel_correction/{NAME}").json()["status"] in ("cancelled", "no_task")
        assert "我最近在学做拿铁" in srv.get(f"/get_recent_history/{NAME}", params={"language": "zh"}).text
        assert srv.post(f"/process/{NAME}", json={"input_history": json.dumps([turn("user", "晚安")])}).json() == {"status": "processed"}
        assert journal_texts(tmp_path, NAME)[-1] == "晚安"
        # Another unknown name is still not created by reads.
        assert srv.get("/new_dialog/Nobody").text == "" and not (tmp_path / "Nobody").exists()
        assert srv.get("/api/characters/Nobody/facts").status_code == 404 and not (tmp_path / "Nobody").exists()


def test_new_dialog_languages_and_master_name(tmp_path: Path) -> None:
    clock = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    with LiveServer(make_settings(tmp_path, display_timezone="UTC", master_name="Alex"), clock=clock) as srv:
        srv.post(f"/cache/{NAME}", json={"input_history": [turn("user", "see you")]})
        card = {"entries": [{"entity": "master", "text": "likes rain"}, {"entity": "neko", "text": "a grey cat"}]}
        assert srv.post(f"/api/characters/{NAME}/card", json=card).status_code == 200
        clock.advance(hours=6, minutes=5)
        expected = {
            "zh": (
                "======Lan的长期记忆======",
                "## 关于主人\n- likes rain",
                "## 关于Lan\n- a grey cat",
                "距离上次与主人聊天已经过去了6小时5分钟。",
                "现在的时间是2026-05-01 18:05。",
            ),
            "ja": (
                "======Lanの長期記憶======",
                "## 主人について",
                "主人との最後の会話から6時間5分が経過しました。",
                "現在の時刻は2026-05-01 18:05です。",
            ),
            "ko": (
                "======Lan의 장기 기억======",
                "## 主人에 대하여",
                "主人와의 마지막 대화로부터 6시간 5분이 지났습니다.",
                "현재 시각은 2026-05-01 18:05입니다.",
            ),
            "en": (
                "======Lan's Long-term Memory======",
                "## About 主人",
                "It has been 6 hours and 5 minutes since the last conversation with 主人.",
                "The current time is 2026-05-01 18:05.",
            ),
        }
        # render_language is the fallback while no language is stored; the master's name
        # comes from the setting without a parameter.
        text = srv.get(f"/new_dialog/{NAME}", params={"render_language": "ja-JP"}).text
        assert "Alexとの最後の会話から" in text and "Alex | see you" in text
        for language, pieces in expected.items():
            text = srv.get(f"/new_dialog/{NAME}", params={"language": language, "master_name": "主人"}).text
            for piece in pieces:
                assert piece in text, (language, piece, text)
        # An explicit language is kept as the character's (the last one, English), as the
        # reference keeps it: it now wins over render_language.
        text = srv.get(f"/new_dialog/{NAME}", params={"render_language": "ja-JP"}).text
        assert "since the last conversation with Alex" in text


def seed(srv: LiveServer) -> None:
    r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in PRIVATE_FACTS]})
    assert r.status_code == 200 and len(r.json()["added"]) == 3, r.text
    r = srv.post(
        f"/internal/memory/{NAME}/scoped_facts",
        json={
            "subject": GROUP,
            "facts": [{"text": "The group plans a thunder photo contest"}, {"text": "The group likes green tea memes"}],
        },
    )
    assert r.status_code == 200 and r.json()["status"] == "stored" and r.json()["created"] == 2, r.text
    assert r.json()["subject"] == {**GROUP, "scope": "group_chat:qq:123456"}
    r = srv.post(
        f"/internal/memory/{NAME}/scoped_facts", json={"subject": MEMBER, "facts": [{"text": "Member 777 is afraid of thunder too"}]}
    )
    assert r.json()["created"] == 1


def test_subject_scoped_recall_never_returns_private_rows(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        seed(srv)
        for query in ("thunder", "green tea", "bank PIN", "Master", "cat birthday"):
            for subjects in ([GROUP], [MEMBER], [PERSON], [GROUP, MEMBER, PERSON], [{**GROUP, "scope": "custom"}]):
                rows = srv.post(f"/query_memory/{NAME}", json={"query": query, "subjects": subjects}).json()["results"]
                assert not [r for r in rows if r["text"] in PRIVATE_FACTS], (query, subjects, rows)
                assert all(r["scope"] != "legacy_private" and r["subject_kind"] in ("group_chat", "group_participant") for r in rows)
            rows = srv.post(f"/query_memory/{NAME}", json={"query": query, "time": "2026"}).json()["results"]
            assert all(r["scope"] == "legacy_private" and r["subject_kind"] is None for r in rows)
        group_rows = srv.post(f"/query_memory/{NAME}", json={"query": "thunder", "subjects": [GROUP]}).json()["results"]
        assert [r["text"] for r in group_rows] == ["The group plans a thunder photo contest"]
        assert group_rows[0]["subject_id"] == "qq:123456" and group_rows[0]["scope"] == "group_chat:qq:123456"
        # Time-only reads are scoped too.
        today = datetime.now().astimezone().strftime("%Y")
        rows = srv.post(f"/query_memory/{NAME}", json={"time": today, "subjects": [MEMBER]}).json()["results"]
        assert [r["text"] for r in rows] == ["Member 777 is afraid of thunder too"]
        # The private read (no subjects) never sees group rows.
        private = srv.post(f"/query_memory/{NAME}", json={"query": "thunder"}).json()["results"]
        assert [r["text"] for r in private] == ["Master is afraid of thunder"]
        # Fail closed: an empty list, too many or malformed subjects are refused.
        for bad in (
            [],
            [GROUP] * 0 + [{"subject_kind": "group_chat", "subject_id": f"qq:{i}"} for i in range(9)],
            [{"subject_kind": "owner", "subject_id": "x"}],
            [{"subject_kind": "group_chat", "subject_id": ""}],
            [{**GROUP, "scope": "legacy_private"}],
            "group",
        ):
            r = srv.post(f"/query_memory/{NAME}", json={"query": "thunder", "subjects": bad})
            assert r.status_code == 422 and r.json()["error_code"] == "bad_subjects", (bad, r.text)
        # /new_dialog (private) carries no group memory.
        assert "photo contest" not in srv.get(f"/new_dialog/{NAME}").text
        # The two corpora dedup separately: the same text is kept in each.
        r = srv.post(f"/internal/memory/{NAME}/scoped_facts", json={"subject": GROUP, "facts": [{"text": "Master loves green tea"}]})
        assert r.json()["created"] == 1
        assert (
            srv.post(
                f"/internal/memory/{NAME}/scoped_facts", json={"subject": GROUP, "facts": [{"text": "Master loves green tea"}]}
            ).json()["created"]
            == 0
        )
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "The group plans a thunder photo contest"}]})
        assert len(r.json()["added"]) == 1
    # After a restart (views and indexes rebuilt from disk) the boundary holds the same way.
    with LiveServer(make_settings(tmp_path)) as srv:
        # The index is rebuilt from the owners' stores at activation: wait until it is fed.
        rows = wait_for(
            lambda: srv.post(f"/query_memory/{NAME}", json={"query": "thunder photo contest"}).json()["results"], what="the rebuilt index"
        )
        assert "The group plans a thunder photo contest" in [r["text"] for r in rows]
        assert {r["scope"] for r in rows} == {"legacy_private"}
        rows = srv.post(f"/query_memory/{NAME}", json={"query": "bank PIN thunder green tea", "subjects": [GROUP, MEMBER]}).json()[
            "results"
        ]
        assert rows and not [r for r in rows if r["scope"] == "legacy_private"]


def test_scoped_routes_round_trip(tmp_path: Path, fake_llm) -> None:
    fake_llm.on("extract_facts", {"facts": [{"text": "Member 777 collects vinyl records", "importance": 7, "entity": "master"}]})
    # A reference persona.json with a private section and a scoped section (the section carries the subject).
    folder = tmp_path / NAME
    folder.mkdir()
    persona = {
        "master": {"facts": [{"id": "manual_1", "text": "Master's secret diary is in the drawer", "source": "manual"}]},
        "@subject/group_chat:qq:123456": {
            **GROUP,
            "scope": "group_chat:qq:123456",
            "entity": "group_chat",
            "facts": [{"id": "manual_2", "text": "This group calls the cat Boss", "source": "manual"}],
        },
    }
    (folder / "persona.json").write_text(json.dumps(persona, ensure_ascii=False), encoding="utf-8")
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        seed(srv)
        url = f"/internal/memory/{NAME}"
        context = srv.post(f"{url}/scoped_context", json={"subjects": [GROUP], "language": "zh"})
        assert context.status_code == 200 and context.headers["content-type"].startswith("text/plain")
        assert "This group calls the cat Boss" in context.text and "thunder photo contest" in context.text
        for secret in ("secret diary", *PRIVATE_FACTS, "Member 777"):
            assert secret not in context.text
        private = srv.get(f"/new_dialog/{NAME}").text
        assert "secret diary" in private and "Boss" not in private
        assert srv.post(f"{url}/scoped_context", json={"subjects": []}).status_code == 422

        r = srv.post(
            f"{url}/scoped_history",
            json={"subject": MEMBER, "input_history": json.dumps([turn("user", "I collect vinyl")]), "speaker_label": "777"},
        )
        assert r.status_code == 200 and r.json()["status"] == "processed" and r.json()["created"] == 1, r.text
        assert r.json()["trust"]["persisted"] is None
        rows = srv.post(f"/query_memory/{NAME}", json={"query": "vinyl records", "subjects": [MEMBER]}).json()["results"]
        assert [r["text"] for r in rows] == ["Member 777 collects vinyl records"]
        assert srv.post(f"/query_memory/{NAME}", json={"query": "vinyl records"}).json()["results"] == []

        r = srv.post(f"{url}/scoped_mentions", json={"response_text": "Boss says hi to the group", "subjects": [GROUP]})
        assert r.json() == {"status": "recorded", "mentioned": 1}
        assert srv.post(f"{url}/scoped_mentions", json={"response_text": "  ", "subjects": [GROUP]}).json()["status"] == "skipped"

        subjects = srv.get(f"{url}/scoped_subjects", params={"platform": "qq"}).json()["subjects"]
        assert {s["subject_id"] for s in subjects} == {"qq:123456", "qq:123456:777"}

        r = srv.post(f"{url}/scoped_forget", json={"subject": GROUP})
        assert r.json()["status"] == "forgotten" and r.json()["removed"] == {"facts": 2, "reflections": 0, "persona": 1}
        assert srv.post(f"/query_memory/{NAME}", json={"query": "thunder", "subjects": [GROUP]}).json()["results"] == []
        assert srv.post(f"{url}/scoped_context", json={"subjects": [GROUP]}).text == ""
        # The member and the private corpus are untouched.
        assert srv.post(f"/query_memory/{NAME}", json={"query": "thunder", "subjects": [MEMBER]}).json()["results"]
        assert [r["text"] for r in srv.post(f"/query_memory/{NAME}", json={"query": "thunder"}).json()["results"]] == [
            "Master is afraid of thunder"
        ]

        # The batched shape: one result per segment, in request order.
        fake_llm.on("extract_facts", {"facts": [{"text": "Member 888 plays the violin", "importance": 6, "entity": "master"}]})
        other = {"subject_kind": "group_participant", "subject_id": "qq:123456:888"}
        r = srv.post(
            f"{url}/scoped_history",
            json={
                "segments": [
                    {"subject": other, "input_history": json.dumps([turn("user", "I play the violin")]), "speaker_label": "888"},
                ]
            },
        )
        assert r.status_code == 200, r.text
        assert [(s["status"], s["created"], s["subject"]["subject_id"]) for s in r.json()["segments"]] == [("ok", 1, "qq:123456:888")]
        assert srv.post(f"/query_memory/{NAME}", json={"query": "violin"}).json()["results"] == []
        bad = srv.post(f"{url}/scoped_history", json={"segments": [], "subject": other})
        assert bad.status_code == 422

        fake_llm.on("extract_facts", Reply.status(500, "down"))
        r = srv.post(f"{url}/scoped_history", json={"subject": MEMBER, "input_history": json.dumps([turn("user", "hello")])})
        assert r.status_code == 502, r.text


def test_outside_edit_of_recent_json_survives_the_next_cache(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        sent = [turn("user", f"message {i}") if i % 2 == 0 else turn("assistant", f"reply {i}") for i in range(6)]
        assert srv.post(f"/cache/{NAME}", json={"input_history": sent}).status_code == 200
        path = tmp_path / NAME / "recent.json"
        items = json.loads(path.read_text(encoding="utf-8"))
        # The memory browser: one message edited, three deleted, file rewritten in place.
        items[0]["data"]["content"] = "message 0 (edited by the user)"
        del items[3:6]
        path.write_text(json.dumps(items, ensure_ascii=False, indent=2), encoding="utf-8")
        assert srv.post(f"/cancel_correction/{NAME}").json() == {"status": "no_task"}
        path.write_text(json.dumps(items[:2], ensure_ascii=False), encoding="utf-8")  # a second edit, no notice
        assert srv.post(f"/cache/{NAME}", json={"input_history": [turn("user", "after the edit")]}).status_code == 200
        assert recent_texts(tmp_path, NAME) == ["message 0 (edited by the user)", "reply 1", "after the edit"]
        # The raw journal still holds every message ever sent.
        assert journal_texts(tmp_path, NAME) == [f"message {i}" if i % 2 == 0 else f"reply {i}" for i in range(6)] + ["after the edit"]
        # And each adoption is journaled with the window it replaced.
        records = [json.loads(line) for line in (tmp_path / NAME / "recent_edits.ndjson").read_text(encoding="utf-8").splitlines()]
        assert [r["reason"] for r in records] == ["cancel_correction", "write"]
        assert [m["data"]["content"] for m in records[0]["replaced"]] == [f"message {i}" if i % 2 == 0 else f"reply {i}" for i in range(6)]
        assert [m["data"]["content"] for m in records[1]["adopted"]] == ["message 0 (edited by the user)", "reply 1"]
        assert "Master | message 0\nLan | reply 1\nMaster | after the edit\n" in srv.get(f"/new_dialog/{NAME}").text


def open_paths_under(folder: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


def test_release_character_frees_every_file_handle(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post(f"/cache/{NAME}", json={"input_history": [turn("user", "hello"), turn("assistant", "hi")]})
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master loves green tea"}]})
        folder = tmp_path / NAME
        assert open_paths_under(folder), "the active character holds its database open"
        r = srv.post(f"/release_character/{NAME}?derived_task_claim_token=t&derived_task_claim_generation=0")
        assert r.status_code == 200 and r.json()["status"] == "success" and r.json()["character_name"] == NAME
        assert open_paths_under(folder) == []
        assert NAME not in srv.runtime.registry.active_names()
        folder.rename(tmp_path / "Lan2")
        assert not folder.exists()
        # The renamed folder serves under its new name; the old name is not recreated by reads.
        assert "hello" in srv.get("/get_recent_history/Lan2").text
        assert srv.get(f"/new_dialog/{NAME}").text == "" and not folder.exists()
        assert srv.post("/reload").json()["status"] == "success"
        assert "hello" in srv.get("/get_recent_history/Lan2").text


def test_core_config_location_is_a_setting_reread_on_every_use(tmp_path: Path) -> None:
    config_dir = tmp_path / "chat-server" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / "core_config.json").write_text(json.dumps({"powerful_memory_enabled": False, "other": 1}), encoding="utf-8")
    with LiveServer(make_settings(tmp_path / "memory", core_config_path=str(config_dir))) as srv:
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": False}
        (config_dir / "core_config.json").write_text(json.dumps({"powerful_memory_enabled": True, "other": 1}), encoding="utf-8")
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": True}
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).json()["success"] is True
        stored = json.loads((config_dir / "core_config.json").read_text(encoding="utf-8"))
        assert stored == {"powerful_memory_enabled": False, "other": 1}
        assert not (tmp_path / "memory" / "core_config.json").exists()


def test_recall_rows_show_the_local_date(tmp_path: Path) -> None:
    # 20:30 UTC on 1 May is already 2 May in Tokyo; the client cuts [:10] of the time.
    clock = ManualClock(datetime(2026, 5, 1, 20, 30, tzinfo=timezone.utc))
    with LiveServer(make_settings(tmp_path, display_timezone="Asia/Tokyo"), clock=clock) as srv:
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master loves green tea"}]})
        rows = srv.post(f"/query_memory/{NAME}", json={"query": "green tea"}).json()["results"]
        assert rows and rows[0]["created_at"][:10] == "2026-05-02" and rows[0]["event_start_at"][:10] == "2026-05-02"
        assert rows[0]["created_at"].endswith("+09:00")


def test_no_read_route_creates_anything_on_disk(tmp_path: Path) -> None:
    """Every GET route of the app, and the POST reads, for a character that does not exist."""
    from starlette.routing import Route

    with LiveServer(make_settings(tmp_path)) as srv:
        before = sorted(p.name for p in tmp_path.iterdir())
        # /mcp is the MCP event stream (a GET needs Accept: text/event-stream; tests/test_mcp.py).
        gets = [r.path for r in srv.app.routes if isinstance(r, Route) and "GET" in (r.methods or ()) and r.path != "/mcp"]
        assert "/new_dialog/{name:str}" in gets and "/internal/memory/{name:str}/scoped_subjects" in gets
        for path in gets:
            url = path.replace("{name:str}", "Ghost").replace("{layer:str}", "facts")
            params = {
                "/internal/trust/profile": {"account_id": "qq:1"},
                "/internal/knowledge/entry": {"pack_id": "ghost-pack", "title": "Ghost"},
            }.get(path)
            r = srv.get(url, params=params)
            assert r.status_code in (200, 404), (url, r.status_code, r.text)
        reads = {
            "/query_memory/Ghost": {"query": "tea"},
            "/internal/memory/Ghost/scoped_context": {"subjects": [GROUP]},
            "/internal/memory/Ghost/scoped_mentions": {"response_text": "hi", "subjects": [GROUP]},
            "/internal/memory/Ghost/scoped_forget": {"subject": GROUP},
            "/record_surfaced/Ghost": {"reflection_ids": ["ref_x"]},
            "/cancel_correction/Ghost": {},
            "/release_character/Ghost?derived_task_claim_token=t&derived_task_claim_generation=0": {},
        }
        for url, body in reads.items():
            r = srv.post(url, json=body)
            assert r.status_code == 200, (url, r.text)
        assert srv.get("/new_dialog/Ghost").text == ""
        assert srv.get("/get_recent_history/Ghost").text == "No recent conversation with Ghost."
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        assert "Ghost" not in srv.runtime.registry.active_names()


def test_long_term_labels_follow_the_language() -> None:
    from datetime import timedelta

    from nekomem.domain.locale.context import format_elapsed, normalise_language
    from nekomem.domain.render_longterm import past_block_open, relative_label

    now = datetime(2026, 5, 20, 12, 0)
    assert [relative_label(now - timedelta(days=d), now, "zh") for d in (0, 3, 14, 65)] == ["当下", "3 天前", "2 周前", "2 月前"]
    assert relative_label(now - timedelta(days=3), now, "ja") == "3 日前"
    assert relative_label(now - timedelta(days=3), now, "ko") == "3일 전"
    assert relative_label(now - timedelta(days=3), now, "en") == "3 days ago"
    assert "除非主人先主动提起" in past_block_open("主人", "Lan", "zh")
    assert [normalise_language(x) for x in ("zh-CN", "zh_TW", "ja-JP", "KO", "pt-BR", "fr", None)] == [
        "zh",
        "zh-TW",
        "ja",
        "ko",
        "pt",
        "en",
        "en",
    ]
    assert format_elapsed(2 * 86400 + 60, "zh") == "2天1分钟" and format_elapsed(3 * 3600, "en") == "3 hours"
