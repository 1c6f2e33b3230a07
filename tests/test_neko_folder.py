"""N.E.K.O.'s own memory folder served in place (``<data dir>/memory/``, docs/NEKO-FILES.md).

A reference folder (tests/support/neko_fixture.py) is laid out in a N.E.K.O. data
directory and served by a real server. What N.E.K.O.'s main process does on that folder is
done here by stand-ins that follow its code (Project-N-E-K-O/N.E.K.O):

- the memory browser (``main_routers/memory_router.py``: ``recent_file/save`` writes
  ``memory/<name>/recent.json`` with LangChain dicts and empty ``additional_kwargs``, then
  posts ``/cancel_correction/<name>``);
- rename and delete (``utils/character_memory.py``: the folder is moved whole, or removed,
  between ``/release_character`` with a claim token, generation and hold, and ``/reload``
  with ``release_derived_task_claims`` and ``resume_derived_task_names``;
  ``main_routers/characters_router/notify.py`` sends them);
- the facts-sync reader (``utils/facts_sync_worker``-style: every folder under ``memory/``,
  its ``facts.json`` as a list of dicts with ``hash``, ``text``, ``importance``).

Every file nekomem leaves in the shared folder is read with the reference's parsing rules
(tests/test_neko_export.py implements them independently of nekomem's code).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from nekomem.cli import main as cli
from nekomem.config import load_settings
from nekomem.importer import neko_folder
from nekomem.stores.layout import NEKO_FOLDER_MARKER, STATE_DIR, forget_neko_folder
from tests.support import neko_fixture
from tests.support.live import TEST_EMBEDDING_MODEL, LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_neko_export import ref_journal, ref_json_time, ref_message, ref_times

ZONE = "Asia/Tokyo"
MAIN = neko_fixture.MAIN
SECOND = neko_fixture.SECOND
REFERENCE_JSON = (
    "facts.json",
    "facts_archive.json",
    "reflections.json",
    "surfaced.json",
    "persona.json",
    "persona_corrections.json",
    "cursors.json",
    "recent_meta.json",
)


def data_dir(tmp_path: Path) -> tuple[Path, neko_fixture.NekoFixture]:
    data = tmp_path / "N.E.K.O"
    (data / "config").mkdir(parents=True)
    (data / "config" / "characters.json").write_text(json.dumps({"猫娘": {MAIN: {}, SECOND: {}}}), encoding="utf-8")
    return data, neko_fixture.build(data / "memory")


def neko_settings(data: Path, **overrides: Any) -> Any:
    """A test server's settings with the memory root left to its default from the data
    directory (what `nekomem neko` serves)."""
    forget_neko_folder()
    values = {"port": 0, "embedding_model": TEST_EMBEDDING_MODEL, "gc_full_collection_seconds": 0}
    settings = load_settings(None, env={}, overrides={**values, "neko_data_dir": str(data), "import_source_timezone": ZONE, **overrides})
    assert Path(settings.server.memory_root) == data / "memory"
    return settings


def fixture_texts(data: neko_fixture.CharacterData) -> list[str]:
    """The texts of a fixture character's reflections and persona entries (what /new_dialog shows)."""
    return [r["text"] for r in data.reflections] + [e["text"] for entries in data.persona.values() for e in entries]


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# -- the reference's readers -----------------------------------------------------------------
def facts_sync_candidates(memory: Path) -> dict[str, list[str]]:
    """The facts-sync worker's reading: every folder under memory/, its facts.json a list;
    a fact counts with a ``hash`` of 8+ characters, a ``text`` and a numeric importance."""
    out: dict[str, list[str]] = {}
    for folder in (d for d in memory.iterdir() if d.is_dir()):
        path = folder / "facts.json"
        if not path.exists():
            continue
        try:
            facts = read(path)
        except ValueError:
            continue  # _read_json: an unreadable file reads as the default (the fixture has a torn one)
        if not isinstance(facts, list):
            continue
        for fact in facts:
            assert isinstance(fact, dict)
            float(fact.get("importance") or 0.0)
            if isinstance(fact.get("hash"), str) and len(fact["hash"]) >= 8 and isinstance(fact.get("text"), str):
                out.setdefault(folder.name, []).append(fact["text"])
    return out


def memory_browser_list(memory: Path) -> list[str]:
    """``iter_recent_memory_files``: every folder of memory/ holding a recent.json."""
    return sorted(child.name for child in memory.iterdir() if child.is_dir() and (child / "recent.json").is_file())


def nekomem_wrote(home: Path, rel: str) -> bool:
    """Whether ``home/rel`` is not the reference's own file as adoption backed it up."""
    path, backup = home / rel, home / STATE_DIR / neko_folder.BACKUP_DIR / rel
    return path.is_file() and (not backup.is_file() or backup.read_bytes() != path.read_bytes())


def check_reference_files(home: Path) -> int:
    """Every reference file nekomem wrote in one character folder (any that is not the
    reference's own as backed up), read the reference's way; returns how many were read."""
    shards = [f"reflection_archive/{p.name}" for p in sorted((home / "reflection_archive").glob("*.json"))]
    written = [rel for rel in ["recent.json", "time_indexed.db", *REFERENCE_JSON, *shards] if nekomem_wrote(home, rel)]
    for rel in written:
        path = home / rel
        if rel == "recent.json":
            for item in read(path):
                ref_message(item)
            continue
        if rel == "time_indexed.db":
            ref_journal(path)
            continue
        value = read(path)
        ref_times(value, rel)
        if rel in ("facts.json", "facts_archive.json", "reflections.json", "surfaced.json") or rel in shards:
            assert isinstance(value, list) and all(isinstance(r, dict) and isinstance(r.get("text", ""), str) for r in value)
        if rel == "persona.json":
            assert all(isinstance(s.get("facts"), list) for k, s in value.items() if not k.startswith("__"))
        if rel == "cursors.json":
            for stamp in value.values():
                ref_json_time(stamp)
    return len(written)


def journal_texts(path: Path) -> list[str]:
    return [text for _, _, text, _ in ref_journal(path)]


# -- the tests ---------------------------------------------------------------------------------
def test_the_shared_folder_reads_back_with_the_reference_rules_and_adoption_is_one_idempotent_step(tmp_path: Path) -> None:
    data, fixture = data_dir(tmp_path)
    memory = data / "memory"
    before = {p.relative_to(memory): p.read_bytes() for p in memory.rglob("*") if p.is_file()}
    settings = neko_settings(data, view_flush_changes=1)
    with LiveServer(settings) as srv:
        assert (memory / NEKO_FOLDER_MARKER).is_file()
        names = [c["name"] for c in srv.get("/api/browse/characters").json()["characters"]]
        assert sorted(names) == sorted(fixture.characters)
        # The fixture's memories answer through nekomem.
        context = srv.get(f"/new_dialog/{MAIN}").text
        assert any(t in context for t in fixture_texts(fixture.characters[MAIN])), context
        # nekomem writes: a turn and a fact.
        turn = {"role": "user", "content": "nekomem wrote this turn about green tea"}
        assert srv.post(f"/cache/{MAIN}", json={"input_history": [turn]}).json()["status"] == "cached"
        assert (
            srv.post(f"/api/characters/{MAIN}/facts", json={"facts": [{"text": "Master loves green tea", "importance": 7}]}).status_code
            < 300
        )
        # While it serves, the main process's readers see the fact in the reference's facts.json.
        wait_for(lambda: "Master loves green tea" in facts_sync_candidates(memory).get(MAIN, []), what="the mirrored facts.json")
        assert "nekomem wrote this turn about green tea" in [ref_message(m)[1] for m in read(memory / MAIN / "recent.json")]
        assert memory_browser_list(memory) == sorted(n for n in fixture.characters if (memory / n / "recent.json").exists())
    # Stopped: every file nekomem left in the shared folder reads the reference's way, and
    # the reference's memory server would find nekomem's turn in its own journal.
    assert sum(check_reference_files(memory / name) for name in fixture.characters) >= 10
    assert "nekomem wrote this turn about green tea" in journal_texts(memory / MAIN / "time_indexed.db")
    texts = journal_texts(memory / MAIN / "time_indexed.db")
    assert all(ref_message(message)[1] in texts for _, _, message, _ in fixture.characters[MAIN].journal)
    facts = read(memory / MAIN / "facts.json")
    added = [f for f in facts if f["text"] == "Master loves green tea"]
    assert len(added) == 1 and added[0]["embedding"] is None
    ref_json_time(added[0]["created_at"])
    # The reference's own records keep their naive local times (not shifted by the zone).
    for record in fixture.characters[MAIN].facts:
        mirrored = next(f for f in facts if f["id"] == record["id"])
        assert datetime.fromisoformat(mirrored["created_at"]) == datetime.fromisoformat(record["created_at"])
    # Nothing of nekomem's is a folder of memory/ (the main process lists its folders).
    assert sorted(p.name for p in memory.iterdir() if p.is_dir()) == sorted(fixture.characters)
    # The backup holds every reference file as it was before nekomem.
    for rel, content in before.items():
        name, rest = rel.parts[0], Path(*rel.parts[1:])
        if name in fixture.characters:
            assert (memory / name / STATE_DIR / neko_folder.BACKUP_DIR / rest).read_bytes() == content, rel

    # Again: nothing to adopt, nothing changed.
    state_before = {p: p.read_bytes() for p in memory.rglob("*") if p.is_file() and STATE_DIR in p.parts and "-wal" not in p.name}
    again = neko_folder.adopt(memory, settings)
    assert again.adopted == [] and again.refreshed == [] and sorted(again.unchanged) == sorted(fixture.characters)
    assert {p: p.read_bytes() for p in state_before} == state_before

    # The reference's memory server runs on the folder meanwhile and adds a fact (naive
    # local times, its field names): nekomem takes it at its next start.
    facts.append(
        {
            **added[0],
            "id": "fact_20261201101500_feedbeef",
            "text": "主人周末去爬山",
            "hash": "feedbeef00000000",
            "created_at": "2026-12-01T10:15:00.000000",
        }
    )
    (memory / MAIN / "facts.json").write_text(json.dumps(facts, ensure_ascii=False), encoding="utf-8")
    with LiveServer(neko_settings(data)) as srv:
        listed = srv.get(f"/api/characters/{MAIN}/facts").json()
        assert "主人周末去爬山" in json.dumps(listed, ensure_ascii=False)
    assert (memory / MAIN / STATE_DIR / neko_folder.BACKUP_DIR / "facts.json").read_bytes() == before[Path(MAIN) / "facts.json"]


def release(srv: LiveServer, name: str, token: str, *, hold: bool = True, generation: int | None = 0) -> Any:
    query = {"hold_derived_task_admission": str(hold).lower(), "derived_task_claim_token": token}
    if generation is not None:
        query["derived_task_claim_generation"] = str(generation)
    return srv.post(f"/release_character/{name}", params=query)


def test_rename_and_delete_by_the_main_process_are_seen_by_nekomem(tmp_path: Path) -> None:
    data, fixture = data_dir(tmp_path)
    memory = data / "memory"
    new = "小白改名"
    settings = neko_settings(data)
    # SECOND's own journal is damaged: /health reports it until the character is gone.
    neko_folder.adopt(memory, settings)
    journal = memory / SECOND / STATE_DIR / "time_indexed.db"
    journal.write_bytes(b"not a database " * 300)
    for side in ("-wal", "-shm"):
        Path(f"{journal}{side}").unlink(missing_ok=True)
    with LiveServer(settings) as srv:
        turn = {"role": "user", "content": "I brewed oolong tea this morning"}
        assert srv.post(f"/cache/{MAIN}", json={"input_history": [turn]}).json()["status"] == "cached"
        assert srv.post(f"/api/characters/{MAIN}/facts", json={"facts": [{"text": "Master brews oolong tea"}]}).status_code < 300
        before = srv.get(f"/new_dialog/{MAIN}").text
        old_fact = next(t for t in fixture_texts(fixture.characters[MAIN]) if t in before)

        # The reference's contract: a token and a generation are required.
        assert release(srv, MAIN, "", generation=None).status_code == 400
        assert release(srv, MAIN, "t", generation=None).status_code == 400

        # Rename (utils/character_memory.rename_character_memory_storage): release with
        # the hold, move the folder whole, rewrite the name inside recent.json, /reload.
        token = uuid.uuid4().hex
        r = release(srv, MAIN, token)
        assert r.status_code == 200 and r.json()["status"] == "success" and r.json()["derived_task_claim_token"] == token
        held = srv.post(f"/cache/{MAIN}", json={"input_history": [{"role": "user", "content": "during the hold"}]})
        assert held.status_code == 409 and held.json()["status"] == "cancelled"
        assert srv.get(f"/new_dialog/{MAIN}").status_code == 409  # not reopened while it moves
        (memory / MAIN).rename(memory / new)
        recent = read(memory / new / "recent.json")
        for item in recent:
            content = item["data"]["content"]
            if isinstance(content, str) and f"{MAIN}说：" in content:
                item["data"]["content"] = content.replace(f"{MAIN}说：", f"{new}说：")
        (memory / new / "recent.json").write_text(json.dumps(recent, ensure_ascii=False), encoding="utf-8")
        body = {
            "resume_derived_task_names": [new],
            "resume_derived_task_generations": {new: 0},
            "release_derived_task_claims": {MAIN: [token]},
        }
        assert srv.post("/reload", json=body).json()["status"] == "success"
        # A release with the withdrawn token changes nothing.
        assert release(srv, MAIN, token).status_code == 409

        names = [c["name"] for c in srv.get("/api/browse/characters").json()["characters"]]
        assert new in names and MAIN not in names
        context = srv.get(f"/new_dialog/{new}").text
        assert old_fact in context and "I brewed oolong tea this morning" in context
        found = srv.post(f"/query_memory/{new}", json={"query": "oolong tea"}).json()["results"]
        assert any(row["text"] == "Master brews oolong tea" for row in found), found
        assert srv.post(f"/cache/{new}", json={"input_history": [{"role": "user", "content": "after the rename"}]}).status_code == 200
        assert not (memory / MAIN).exists()

        # Delete (delete_character_memory_storage): release with the hold, remove the
        # folder, /reload closing the claim.
        token = uuid.uuid4().hex
        srv.get(f"/new_dialog/{SECOND}")  # active when it goes
        assert SECOND in json.dumps(srv.get("/health").json(), ensure_ascii=False)
        assert release(srv, SECOND, token).json()["status"] == "success"
        shutil.rmtree(memory / SECOND)
        assert srv.post("/reload", json={"release_derived_task_claims": {SECOND: [token]}}).json()["status"] == "success"
        names = [c["name"] for c in srv.get("/api/browse/characters").json()["characters"]]
        assert SECOND not in names
        assert srv.get(f"/new_dialog/{SECOND}").text == ""
        assert not (memory / SECOND).exists()
        assert SECOND not in json.dumps(srv.get("/health").json(), ensure_ascii=False)
    assert not (memory / SECOND).exists() and not (memory / MAIN).exists()
    assert "after the rename" in journal_texts(memory / new / "time_indexed.db")


def test_a_memory_browser_edit_of_recent_json_is_adopted(tmp_path: Path) -> None:
    data, _ = data_dir(tmp_path)
    memory = data / "memory"
    with LiveServer(neko_settings(data)) as srv:
        turns = [{"role": "user", "content": "my cat is called Bean"}, {"role": "assistant", "content": "Bean is a lovely name"}]
        assert srv.post(f"/cache/{MAIN}", json={"input_history": turns}).json()["status"] == "cached"
        # The browser's save: every item rewritten from {role, text}, then /cancel_correction.
        shown = [{"role": m["type"], "text": ref_message(m)[1]} for m in read(memory / MAIN / "recent.json")]
        edited = [
            {**m, "text": "my cat is called Bella"} if m["text"] == "my cat is called Bean" else m
            for m in shown
            if m["text"] != "Bean is a lovely name"
        ]
        saved = [
            {
                "type": m["role"],
                "data": {
                    "content": m["text"],
                    "additional_kwargs": {},
                    "response_metadata": {},
                    "type": m["role"],
                    "name": None,
                    "id": None,
                    "example": False,
                },
            }
            for m in edited
        ]
        (memory / MAIN / "recent.json").write_text(json.dumps(saved, ensure_ascii=False, indent=2), encoding="utf-8")
        assert srv.post(f"/cancel_correction/{MAIN}").status_code == 200
        history = srv.get(f"/get_recent_history/{MAIN}").text
        assert "Bella" in history and "Bean is a lovely name" not in history
        # The next write keeps the edit (adopted, not overwritten).
        assert srv.post(f"/cache/{MAIN}", json={"input_history": [{"role": "user", "content": "she sleeps all day"}]}).status_code == 200
        texts = [ref_message(m)[1] for m in read(memory / MAIN / "recent.json")]
        assert "my cat is called Bella" in texts and "she sleeps all day" in texts and "Bean is a lovely name" not in texts


def test_neko_memory_root_default_is_the_data_dirs_memory_folder(tmp_path: Path, capsys: Any) -> None:
    data, _ = data_dir(tmp_path)
    settings = load_settings(None, env={}, overrides={"neko_data_dir": str(data)})
    assert Path(settings.server.memory_root) == data / "memory"
    assert neko_folder.serves_neko_folder(settings)
    try:
        cli.main(["neko", "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    assert "--memory-root" in text and "data directory's memory/" in text and "./memory" not in text


def test_release_character_claims_follow_the_reference(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        # Without the hold, writes go on; a bad generation is refused.
        assert release(srv, "Lan", "a", hold=False).json()["status"] == "success"
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "still here"}]}).status_code == 200
        assert (
            srv.post("/release_character/Lan", params={"derived_task_claim_token": "b", "derived_task_claim_generation": "x"}).status_code
            == 400
        )
        # Two holds of two generations: resuming generation 1 drops the claim of generation 0.
        assert release(srv, "Lan", "g0", generation=0).status_code == 200
        assert release(srv, "Lan", "g1", generation=1).status_code == 200
        assert (
            srv.post("/reload", json={"resume_derived_task_names": ["Lan"], "resume_derived_task_generations": {"Lan": 1}}).status_code
            == 200
        )
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]}).status_code == 409
        assert srv.post("/reload", json={"release_derived_task_claims": {"Lan": ["g1"]}}).status_code == 200
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "open again"}]}).status_code == 200
        assert srv.post("/reload", json={"release_derived_task_claims": "nope"}).status_code == 422
        assert srv.post("/reload").json()["status"] == "success"  # an empty body is allowed


def test_a_forgotten_turn_leaves_the_reference_journal_at_once(tmp_path: Path) -> None:
    data, _ = data_dir(tmp_path)
    memory = data / "memory"
    with LiveServer(neko_settings(data)) as srv:
        assert srv.post(f"/cache/{MAIN}", json={"input_history": [{"role": "user", "content": "my secret pin is 4921"}]}).status_code == 200
        srv.post(f"/release_character/{MAIN}", params={"derived_task_claim_token": "t", "derived_task_claim_generation": "0"})
        assert "my secret pin is 4921" in journal_texts(memory / MAIN / "time_indexed.db")
        row = srv.get(f"/api/browse/{MAIN}/journal", params={"q": "4921"}).json()["items"][0]["id"]
        assert srv.delete(f"/api/characters/{MAIN}/turns/{row}").status_code == 200
        assert "my secret pin is 4921" not in journal_texts(memory / MAIN / "time_indexed.db")
        db = sqlite3.connect(memory / MAIN / "time_indexed.db")
        try:
            assert all("4921" not in str(r) for r in db.execute("SELECT message FROM time_indexed_original"))
        finally:
            db.close()


def test_export_and_restore_of_a_character_in_the_shared_folder(tmp_path: Path) -> None:
    from nekomem.stores.snapshot_check import check_character
    from nekomem.stores.snapshot_write import write_characters

    data, _ = data_dir(tmp_path)
    memory = data / "memory"
    with LiveServer(neko_settings(data)) as srv:
        assert srv.post(f"/cache/{MAIN}", json={"input_history": [{"role": "user", "content": "export me"}]}).status_code == 200
        doc = srv.post(f"/api/characters/{MAIN}/export", json={}).json()
    assert doc["name"] == MAIN
    assert "export me" in [ref_message(m)[1] for m in doc["files"]["recent.json"]]
    # Restored into the shared folder: nekomem's files in .nekomem/, recent.json beside the
    # reference's files, and the next start adopts it (the reference's files appear).
    checked = check_character({**doc, "name": "Restored"}, where="export", max_depth=64, name_max_length=50, name_max_units=60)
    write_characters([checked], lambda _name: memory, replace=False)
    assert (memory / "Restored" / STATE_DIR / "time_indexed.db").is_file() and (memory / "Restored" / "recent.json").is_file()
    assert not (memory / "Restored" / "time_indexed.db").exists()
    with LiveServer(neko_settings(data)) as srv:
        assert "export me" in srv.get("/get_recent_history/Restored").text
    assert "export me" in journal_texts(memory / "Restored" / "time_indexed.db")


def test_a_character_nekomem_starts_is_not_imported_again(tmp_path: Path) -> None:
    data, _ = data_dir(tmp_path)
    memory = data / "memory"
    with LiveServer(neko_settings(data, view_flush_changes=1)) as srv:
        turn = {"role": "user", "content": "a brand new character"}
        assert srv.post("/cache/Fresh", json={"input_history": [turn]}).status_code == 200
        assert srv.post("/api/characters/Fresh/facts", json={"facts": [{"text": "Fresh likes rain"}]}).status_code < 300
        wait_for(lambda: (memory / "Fresh" / "facts.json").exists(), what="the mirrored facts.json")
        assert srv.post("/reload").json()["status"] == "success"
        assert srv.post("/reload").json()["status"] == "success"
        rows = srv.get("/api/browse/Fresh/journal", params={"q": "brand new"}).json()["items"]
        assert len(rows) == 1
        facts = srv.get("/api/characters/Fresh/facts").json()
        assert json.dumps(facts).count("Fresh likes rain") == 1
    assert journal_texts(memory / "Fresh" / "time_indexed.db").count("a brand new character") == 1


def test_an_old_nekomem_memory_root_is_pointed_out_with_the_command_that_brings_it_over(tmp_path: Path, capsys: Any) -> None:
    from nekomem.cli.neko_launch import legacy_root_notice

    data, _ = data_dir(tmp_path)
    assert legacy_root_notice(neko_settings(data)) is None
    old = data / "nekomem-memory"
    with LiveServer(make_settings(old)) as srv:  # what an earlier `nekomem neko` served
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "from the old root"}]}).status_code == 200
    notice = legacy_root_notice(neko_settings(data))
    assert notice is not None and "nekomem restore" in notice
    command = notice.split("run: ", 1)[1].split()
    assert command[:2] == ["nekomem", "restore"]
    assert cli.main(command[1:]) == 0
    with LiveServer(neko_settings(data)) as srv:
        assert "from the old root" in srv.get("/get_recent_history/Lan").text
    assert "from the old root" in journal_texts(data / "memory" / "Lan" / "time_indexed.db")
