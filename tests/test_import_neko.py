"""``nekomem import-neko``: a reference memory folder of every layer, imported offline.

The fixture (tests/support/neko_fixture.py) is written from the reference's on-disk notes;
every assertion compares the target with what the fixture says it wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
import pytest

from nekomem.actors.host import ACTORS
from nekomem.cli import main as cli
from nekomem.domain.records import Fact, PersonaEntry, Reflection
from nekomem.domain.turns import from_disk
from nekomem.runtime.runtime import Runtime
from nekomem.stores import rootlock
from nekomem.stores.rootlock import RootLocked
from tests.support import neko_fixture
from tests.support.live import make_settings

EMBEDDING = ("embedding", "embedding_text_sha256", "embedding_model_id")


def tree_hashes(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path (folders are implied)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    code = cli.main(["import-neko", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def local(value: str | None, zone: ZoneInfo | None = None) -> datetime | None:
    """The instant of a reference naive local time (this machine's zone unless given)."""
    if value is None:
        return None
    naive = datetime.fromisoformat(value.replace(" ", "T", 1))
    return naive.replace(tzinfo=zone) if zone is not None else naive.astimezone()


def scopable(cls: type[msgspec.Struct]) -> bool:
    """Whether this nekomem keeps a subject on ``cls`` (else scoped records are refused)."""
    return "subject_kind" in cls.__struct_fields__


def expected(records: list[dict[str, Any]], cls: type[msgspec.Struct], entity: str = "") -> list[dict[str, Any]]:
    """The fixture records an import must take: scoped ones only where nekomem can scope."""
    return [r for r in records if scopable(cls) or not neko_fixture.is_scoped(r, entity)]


def assert_same_record(source: dict[str, Any], target: dict[str, Any], cls: type[msgspec.Struct], passthrough: str | None = None) -> None:
    """Every field of the source record is in the target: equal values, times as the same
    instant with the same local date, cached embeddings dropped, fields nekomem lacks in
    the passthrough."""
    known = {f.name for f in msgspec.structs.fields(cls)}
    extra = {}
    for key, value in source.items():
        if key in EMBEDDING:
            assert target[key] is None, key
        elif key not in known:
            extra[key] = value
        elif key.endswith("_at") and isinstance(value, str):
            assert datetime.fromisoformat(target[key]) == local(value), key
            assert target[key][:10] == value[:10], key
        elif key == "version_history":
            assert [v["text"] for v in target[key]] == [v["text"] for v in value]
        else:
            assert target[key] == value, key
    if passthrough is not None and extra:
        assert target[passthrough] == {"neko": extra}


@pytest.fixture
def fixture(tmp_path: Path) -> neko_fixture.NekoFixture:
    return neko_fixture.build(tmp_path / "neko-memory")


def by_id(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["id"]: item for item in items}


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def journal_rows(db_path: Path) -> list[tuple[str, str, str, str]]:
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute("SELECT session_id, message, timestamp FROM time_indexed_original ORDER BY id").fetchall()
    finally:
        db.close()
    out = []
    for session, message, ts in rows:
        turn = from_disk(json.loads(message))
        assert turn is not None
        out.append((session, turn.role, turn.text, ts))
    return out


def test_every_layer_is_imported_with_its_fields(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nekomem-root"
    code, report, err = run_cli(capsys, str(fixture.root), "--memory-root", str(root))
    assert code == 0, err
    assert report is not None
    assert sorted(c["name"] for c in report["characters"]) == sorted(fixture.characters)
    for name, data in fixture.characters.items():
        folder = root / name
        counts = next(c["layers"] for c in report["characters"] if c["name"] == name)
        # recent window (memo first) and its summary time
        recent = [from_disk(item) for item in read(folder / "recent.json")] if data.recent else []
        assert [(t.role, t.text) for t in recent] == [(t.role, t.text) for t in map(from_disk, data.recent)]
        assert counts["recent"]["added"] == len(data.recent)
        if data.last_past_block_update_at:
            meta = read(folder / "recent_meta.json")
            assert datetime.fromisoformat(meta["last_past_block_update_at"]) == local(data.last_past_block_update_at)
        # journal rows: session, speaker, text and time of every readable row, in order
        expected_rows = []
        for _rid, session, message, ts in data.journal:
            turn = from_disk(message)
            assert turn is not None and ts is not None
            expected_rows.append((session, turn.role, turn.text, local(ts)))
        got_rows = journal_rows(folder / "time_indexed.db") if data.journal else []
        assert [(s, r, t, datetime.fromisoformat(ts)) for s, r, t, ts in got_rows] == expected_rows
        assert counts["journal"]["added"] == len(expected_rows)
        # facts and archived facts (scoped fields kept in the passthrough)
        for file, every in (("facts.json", data.facts), ("facts_archive.json", data.facts_archive)):
            records = expected(every, Fact)
            stored = by_id(read(folder / file)) if records else {}
            assert set(stored) == {r["id"] for r in records}
            for record in records:
                fixed = {
                    **record,
                    "source": record["source"] if record["source"] in ("user_observation", "ai_disclosure") else "user_observation",
                }
                if fixed["source"] != record["source"]:
                    fixed["neko_source"] = record["source"]
                assert_same_record(fixed, stored[record["id"]], Fact, passthrough="source_ref")
        # reflections with status and evidence, archive shards, surfaced
        refs = by_id(read(folder / "reflections.json")) if data.reflections else {}
        assert set(refs) == {r["id"] for r in data.reflections}
        for record in data.reflections:
            assert_same_record(record, refs[record["id"]], Reflection)
        for shard, records in data.reflection_archive.items():
            stored = by_id(read(folder / "reflection_archive" / shard))
            for record in records:
                assert_same_record(record, stored[record["id"]], Reflection)
        if data.surfaced:
            stored_surfaced = read(folder / "surfaced.json")
            assert [(s["reflection_id"], s["feedback"]) for s in stored_surfaced] == [
                (s["reflection_id"], s["feedback"]) for s in data.surfaced
            ]
            assert [datetime.fromisoformat(s["surfaced_at"]) for s in stored_surfaced] == [local(s["surfaced_at"]) for s in data.surfaced]
        # persona by section; card entries stay protected
        persona = read(folder / "persona.json")
        for entity, every in data.persona.items():
            entries = expected(every, PersonaEntry, entity)
            stored = by_id(persona[entity]["facts"]) if entries else {}
            assert set(stored) == {e["id"] for e in entries}, entity
            for entry in entries:
                stamp = neko_fixture.SECTION_SUBJECT if entity.startswith("@subject/") else {}
                assert_same_record({**stamp, **entry}, stored[entry["id"]], PersonaEntry)
                assert stored[entry["id"]]["protected"] is entry["protected"]
        assert "__meta__" not in persona
        if data.corrections:
            assert [(c["old_text"], c["new_text"]) for c in read(folder / "persona_corrections.json")] == [
                (c["old_text"], c["new_text"]) for c in data.corrections
            ]
        if data.cursors:
            cursors = read(folder / "cursors.json")
            assert {k: datetime.fromisoformat(v) for k, v in cursors.items()} == {k: local(v) for k, v in data.cursors.items()}
    # everything malformed is named in the report, nothing else is a record-level problem
    problems = report["problems"]
    for bad in fixture.malformed:
        assert any(p["character"] == bad.character and p["layer"] == bad.layer and p["record"] == bad.record for p in problems), bad
    # scoped records nekomem cannot scope are refused by name (fail closed), never imported unscoped
    refused = [r["id"] for d in fixture.characters.values() for r in d.facts + d.facts_archive if r not in expected([r], Fact)]
    refused += [
        e["id"]
        for d in fixture.characters.values()
        for ent, es in d.persona.items()
        for e in es
        if e not in expected([e], PersonaEntry, ent)
    ]
    for record_id in refused:
        assert any(p["record"] == record_id and "scoped to subject" in p["reason"] for p in problems), record_id
    record_problems = [p for p in problems if p["record"] is not None]
    assert len(record_problems) == sum(1 for b in fixture.malformed if b.record is not None) + len(refused)
    layers = {p["layer"] for p in problems if p["character"] == neko_fixture.MAIN}
    assert {"events", "outbox"} <= layers  # the source's unapplied bookkeeping is reported
    assert "speaker_trust.json" in report["ignored_files"]
    assert "records read" in err and f"{report['added_total']} added" in err


def test_second_run_adds_nothing_and_the_source_is_untouched(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nekomem-root"
    source_before = tree_hashes(fixture.root)
    code, first, _ = run_cli(capsys, str(fixture.root), "--memory-root", str(root))
    assert code == 0 and first is not None and first["added_total"] > 0
    target_after_first = tree_hashes(root, skip=(rootlock.LOCK_FILE,))
    code, second, _ = run_cli(capsys, str(fixture.root), "--memory-root", str(root))
    assert code == 0 and second is not None
    assert second["added_total"] == 0
    for before, again in zip(first["characters"], second["characters"], strict=True):
        for layer, count in before["layers"].items():
            assert again["layers"][layer]["unchanged"] == count["added"], (before["name"], layer)
    assert tree_hashes(root, skip=(rootlock.LOCK_FILE,)) == target_after_first
    # byte-identical source, and no file (SQLite -wal/-shm/-journal) appeared in it
    assert tree_hashes(fixture.root) == source_before


def test_only_the_named_characters(fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "nekomem-root"
    code, report, _ = run_cli(capsys, str(fixture.root), "--memory-root", str(root), "--character", neko_fixture.SECOND)
    assert code == 0 and report is not None
    assert [c["name"] for c in report["characters"]] == [neko_fixture.SECOND]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [neko_fixture.SECOND]
    code, _, err = run_cli(capsys, str(fixture.root), "--memory-root", str(root), "--character", "nobody")
    assert code == 1 and "no character folder named nobody" in err


def test_a_single_character_folder_and_the_source_timezone(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "nekomem-root"
    monkeypatch.setenv("NEKOMEM_IMPORT_SOURCE_TIMEZONE", "Asia/Tokyo")
    code, report, err = run_cli(capsys, str(fixture.root / neko_fixture.MAIN), "--memory-root", str(root))
    assert code == 0, err
    assert report is not None and [c["name"] for c in report["characters"]] == [neko_fixture.MAIN]
    source = fixture.characters[neko_fixture.MAIN].facts[0]
    stored = by_id(read(root / neko_fixture.MAIN / "facts.json"))[source["id"]]
    assert stored["created_at"].endswith("+09:00")
    assert datetime.fromisoformat(stored["created_at"]) == local(source["created_at"], ZoneInfo("Asia/Tokyo"))
    monkeypatch.setenv("NEKOMEM_IMPORT_SOURCE_TIMEZONE", "Mars/Olympus")
    code, _, err = run_cli(capsys, str(fixture.root), "--memory-root", str(tmp_path / "other"))
    assert code == 1 and "Mars/Olympus" in err


def test_bad_sources_are_refused_with_a_message(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, str(tmp_path / "missing"), "--memory-root", str(tmp_path / "root"))
    assert code == 1 and "is not a folder" in err
    code, _, err = run_cli(capsys, str(fixture.root), "--memory-root", str(fixture.root / "inside"))
    assert code == 1 and "overlap" in err
    assert not (fixture.root / "inside").exists()


def test_progress_bar_on_request(fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, str(fixture.root), "--memory-root", str(tmp_path / "root"), "--progress")
    assert code == 0
    assert "import-neko [" in err and "100%" in err
    code, _, err = run_cli(capsys, str(fixture.root), "--memory-root", str(tmp_path / "root2"))
    assert "import-neko [" not in err  # not a terminal, not asked for


def test_a_database_with_rows_only_in_its_wal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reference server that died before a checkpoint leaves rows in time_indexed.db-wal;
    they are imported, and the source's files stay as they were."""
    folder = tmp_path / "neko" / "walcat"
    folder.mkdir(parents=True)
    live = sqlite3.connect(folder / "time_indexed.db")
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("PRAGMA wal_autocheckpoint=0")
    live.execute(
        "CREATE TABLE time_indexed_original (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR, message TEXT, timestamp DATETIME)"
    )
    live.execute(
        "INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('s', ?, '2026-11-30 10:00:00.000001')",
        (json.dumps({"type": "human", "data": {"content": "only in the wal"}}),),
    )
    live.commit()
    copy = tmp_path / "copy" / "walcat"
    copy.mkdir(parents=True)
    for name in ("time_indexed.db", "time_indexed.db-wal"):
        (copy / name).write_bytes((folder / name).read_bytes())
    live.close()
    assert (copy / "time_indexed.db-wal").stat().st_size > 0
    before = tree_hashes(copy.parent)
    code, report, err = run_cli(capsys, str(copy), "--memory-root", str(tmp_path / "root"))
    assert code == 0, err
    assert [r[2] for r in journal_rows(tmp_path / "root" / "walcat" / "time_indexed.db")] == ["only in the wal"]
    assert tree_hashes(copy.parent) == before


def test_refused_while_a_server_holds_the_root(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "nekomem-root"
    runtime = Runtime(make_settings(root), actors=ACTORS)
    runtime.start(background=False)
    try:
        code, report, err = run_cli(capsys, str(fixture.root), "--memory-root", str(root))
        assert code == 1 and report is None
        assert "in use by a running nekomem server" in err and "serve pid" in err
        assert not any(p.is_dir() for p in root.iterdir())  # nothing was written
    finally:
        runtime.stop()
    code, report, _ = run_cli(capsys, str(fixture.root), "--memory-root", str(root))
    assert code == 0 and report is not None and report["added_total"] > 0


def test_the_root_lock_modes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with rootlock.acquire(root, "shared", "serve"), rootlock.acquire(root, "shared", "serve"):
        with pytest.raises(RootLocked):
            rootlock.acquire(root, "exclusive", "import-neko")
    with rootlock.acquire(root, "exclusive", "import-neko"):
        with pytest.raises(RootLocked, match="locked by another tool"):
            Runtime(make_settings(root), actors=ACTORS).start(background=False)
    lock = rootlock.acquire(root, "exclusive", "import-neko")
    lock.release()
    lock.release()  # idempotent
    with rootlock.acquire(root, "exclusive", "import-neko"):
        pass


def test_the_memory_root_of_the_config_file(
    fixture: neko_fixture.NekoFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --memory-root the import goes where `serve --config FILE` keeps its data."""
    for key in [k for k in os.environ if k.startswith("NEKOMEM_")]:
        monkeypatch.delenv(key)
    root = tmp_path / "configured-root"
    config = tmp_path / "nekomem.toml"
    config.write_text(f'[server]\nmemory_root = "{root.as_posix()}"\n', encoding="utf-8")
    code, report, err = run_cli(capsys, str(fixture.root), "--config", str(config), "--character", neko_fixture.V1)
    assert code == 0, err
    assert report is not None and report["memory_root"] == str(root.resolve())
    assert (root / neko_fixture.V1 / "persona.json").is_file()
