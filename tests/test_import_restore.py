"""``nekomem import`` / ``restore`` check everything before they write, and swap characters
in whole (issue 38, items 2 and 5; issue 37, item 4): the real CLI as a process, real
files, real servers."""

from __future__ import annotations

import copy
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from nekomem.stores.shard_layout import character_root
from tests.support.live import LiveServer, make_settings
from tests.support.restore_probe import export_file, fingerprint, nekomem, renamed, served_character


@pytest.fixture(scope="module")
def lan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return served_character(tmp_path_factory.mktemp("seed"))


def imported_root(tmp_path: Path, doc: dict[str, Any]) -> Path:
    root = tmp_path / "memory"
    done = nekomem("import", str(export_file(tmp_path / "good.json", doc)), "--memory-root", str(root))
    assert done.returncode == 0, done.stderr
    return root


def with_repeated_row(doc: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(doc)
    rows = bad["journal"]["rows"]
    rows.append({**rows[0], "message": {"role": "user", "text": "a second row with the first id"}})
    return bad


def test_replace_with_a_bad_document_keeps_the_character(tmp_path: Path, lan: dict[str, Any]) -> None:
    root = imported_root(tmp_path, lan)
    before = fingerprint(root / "Lan")
    done = nekomem("import", str(export_file(tmp_path / "bad.json", with_repeated_row(lan))), "--memory-root", str(root), "--replace")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "(Lan)" in done.stderr and "row 2 repeats the id" in done.stderr, done.stderr
    assert fingerprint(root / "Lan") == before
    assert sorted(p.name for p in root.iterdir()) == [".nekomem.lock", "Lan"]  # no temporary folder left
    # A good document then replaces it; the old folder is gone once the new one is in place.
    newer = copy.deepcopy(lan)
    newer["files"]["facts.json"] = []
    done = nekomem("import", str(export_file(tmp_path / "newer.json", newer)), "--memory-root", str(root), "--replace")
    assert done.returncode == 0, done.stderr
    assert json.loads((root / "Lan" / "facts.json").read_text(encoding="utf-8")) == []
    assert sorted(p.name for p in root.iterdir()) == [".nekomem.lock", "Lan"]  # the old folder is gone after the swap


def test_a_bad_document_leaves_nothing_that_blocks_a_reimport(tmp_path: Path, lan: dict[str, Any]) -> None:
    root = tmp_path / "memory"
    done = nekomem("import", str(export_file(tmp_path / "bad.json", with_repeated_row(lan))), "--memory-root", str(root))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert not (root / "Lan").exists()
    (tmp_path / "latest.json").symlink_to(export_file(tmp_path / "good.json", lan))  # the named file may be a link
    done = nekomem("import", str(tmp_path / "latest.json"), "--memory-root", str(root))
    assert done.returncode == 0, done.stderr


def test_a_file_whose_second_character_is_bad_writes_none(tmp_path: Path, lan: dict[str, Any]) -> None:
    root = tmp_path / "memory"
    source = export_file(tmp_path / "two.json", renamed(lan, "Mika"), with_repeated_row(lan))
    done = nekomem("import", str(source), "--memory-root", str(root))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "character 1 (Lan)" in done.stderr
    assert not (root / "Mika").exists() and not (root / "Lan").exists()


@pytest.mark.parametrize(
    ("craft", "said"),
    [
        (lambda d: d["journal"]["rows"][0].update(id=2**63), "outside 1.."),
        (lambda d: d["journal"]["rows"][0].update(id=2**64 + 5), "outside 1.."),
        (lambda d: d["journal"].update(sequence=2**63 - 1), "sequence"),
        (lambda d: d["files"].update({"facts.json": ["DEEP-5000"]}), "too deeply"),
        (lambda d: d["files"].update({"facts.json": ["DEEP-300"]}), "deeper than 64"),
        (lambda d: d.update(name="L" * 5000), "name_too_long"),
    ],
)
def test_crafted_ids_depths_and_names_answer_one_line(tmp_path: Path, lan: dict[str, Any], craft: Any, said: str) -> None:
    doc = copy.deepcopy(lan)
    craft(doc)
    root = tmp_path / "memory"
    source = export_file(tmp_path / "crafted.json", doc)
    for depth in (300, 5000):  # deeper than Python's own json module writes
        source.write_text(source.read_text(encoding="utf-8").replace(f'["DEEP-{depth}"]', "[" + "[" * depth + "]" * depth + "]"))
    done = nekomem("import", str(source), "--memory-root", str(root))
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not any(p.name != ".nekomem.lock" for p in root.iterdir())


def test_the_highest_accepted_row_id_leaves_room_for_new_turns(tmp_path: Path, lan: dict[str, Any]) -> None:
    top = 2**53 - 1
    at_top = copy.deepcopy(lan)
    rows = at_top["journal"]["rows"]
    rows[-1]["id"] = top
    at_top["journal"]["sequence"] = top
    refused = copy.deepcopy(at_top)
    refused["journal"]["rows"][-1]["id"] = 2**63 - 1
    refused["journal"]["sequence"] = 2**63 - 1
    root = tmp_path / "memory"
    done = nekomem("import", str(export_file(tmp_path / "max.json", refused)), "--memory-root", str(root))
    assert done.returncode == 2 and f"outside 1..{top}" in done.stderr, done.stderr
    done = nekomem("import", str(export_file(tmp_path / "top.json", at_top)), "--memory-root", str(root))
    assert done.returncode == 0, done.stderr
    with LiveServer(make_settings(root)) as srv:
        for i in range(3):
            r = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"after the top {i}"}]})
            assert r.status_code == 200, r.text
        ids = [i["id"] for i in srv.get("/api/browse/Lan/journal", params={"order": "asc", "limit": 100}).json()["items"]]
    assert ids[-3:] == [top + 1, top + 2, top + 3]


# -- restore: the backup folder is not trusted ------------------------------------------


def backup_of(tmp_path: Path, doc: dict[str, Any]) -> Path:
    (tmp_path / "src").mkdir()
    root = imported_root(tmp_path / "src", doc)
    backup = tmp_path / "backup"
    done = nekomem("backup", str(backup), "--memory-root", str(root), "--offline")
    assert done.returncode == 0, done.stderr
    return backup


def outside_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps([{"text": "SECRET-OUTSIDE-THE-ROOT"}]), encoding="utf-8")
    return secret


def assert_nothing_pulled_in(root: Path) -> None:
    for path in root.rglob("*") if root.exists() else []:
        assert not path.is_symlink(), path
        if path.is_file():
            assert b"SECRET-OUTSIDE-THE-ROOT" not in path.read_bytes(), path


@pytest.mark.parametrize("link", ["view", "archive", "character", "core_config", "journal", "log"])
def test_restore_follows_no_symbolic_link(tmp_path: Path, lan: dict[str, Any], link: str) -> None:
    backup = backup_of(tmp_path, lan)
    secret = outside_secret(tmp_path)
    if link == "view":
        (backup / "Lan" / "facts.json").unlink()
        (backup / "Lan" / "facts.json").symlink_to(secret)
    elif link == "archive":
        shards = tmp_path / "outside" / "shards"
        shards.mkdir()
        (shards / "2026-05.json").write_text(secret.read_text(encoding="utf-8"), encoding="utf-8")
        (backup / "Lan" / "reflection_archive").symlink_to(shards, target_is_directory=True)
    elif link == "character":
        (backup / "Mika").symlink_to(backup / "Lan", target_is_directory=True)
    elif link == "core_config":
        (backup / "core_config.json").symlink_to(secret)
    elif link == "log":
        (backup / "Lan" / "events.ndjson").unlink(missing_ok=True)
        (backup / "Lan" / "events.ndjson").symlink_to(secret)
    else:
        outside_db = tmp_path / "outside" / "journal.db"
        (backup / "Lan" / "time_indexed.db").rename(outside_db)
        (backup / "Lan" / "time_indexed.db").symlink_to(outside_db)
    root = tmp_path / "memory"
    done = nekomem("restore", str(backup), "--memory-root", str(root))
    assert done.returncode == 2 and "symbolic link" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert_nothing_pulled_in(root)
    assert not (root / "Lan").exists()
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) in (
        ["secret.json"],
        ["journal.db", "secret.json"],
        ["secret.json", "shards"],
    )


def test_restore_reads_the_journal_without_writing_beside_it(tmp_path: Path, lan: dict[str, Any]) -> None:
    backup = backup_of(tmp_path, lan)
    before = fingerprint(backup)
    os.chmod(backup / "Lan", 0o555)  # a read-only backup (a mounted snapshot, a CD) restores too
    try:
        done = nekomem("restore", str(backup), "--memory-root", str(tmp_path / "memory"))
    finally:
        os.chmod(backup / "Lan", 0o755)
    assert done.returncode == 0, done.stderr
    assert fingerprint(backup) == before  # no -wal, no -shm, nothing changed


def test_restore_reads_committed_turns_left_in_a_wal(tmp_path: Path, lan: dict[str, Any]) -> None:
    backup = backup_of(tmp_path, lan)
    db_path = backup / "Lan" / "time_indexed.db"
    # A copy of a root whose server was killed: the last turn is only in the -wal.
    writer = sqlite3.connect(db_path)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(
        "INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('s', ?, '2026-05-01T12:00:00+00:00')",
        (json.dumps({"role": "user", "text": "only in the wal"}),),
    )
    writer.commit()
    wal = (backup / "Lan" / "time_indexed.db-wal").read_bytes()
    main = db_path.read_bytes()
    writer.close()
    db_path.write_bytes(main)
    (backup / "Lan" / "time_indexed.db-wal").write_bytes(wal)
    (backup / "Lan" / "time_indexed.db-shm").unlink(missing_ok=True)
    before = fingerprint(backup)
    root = tmp_path / "memory"
    done = nekomem("restore", str(backup), "--memory-root", str(root))
    assert done.returncode == 0, done.stderr
    assert fingerprint(backup) == before
    restored = sqlite3.connect(root / "Lan" / "time_indexed.db")
    messages = [json.loads(m) for (m,) in restored.execute("SELECT message FROM time_indexed_original ORDER BY id")]
    restored.close()
    assert messages[-1] == {"role": "user", "text": "only in the wal"}


def test_a_journal_that_is_a_recursive_view_is_refused(tmp_path: Path, lan: dict[str, Any]) -> None:
    backup = backup_of(tmp_path, lan)
    db_path = backup / "Lan" / "time_indexed.db"
    db_path.unlink()
    db = sqlite3.connect(db_path)
    db.execute(
        "CREATE VIEW time_indexed_original AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
        "SELECT x AS id, 's' AS session_id, '{}' AS message, NULL AS timestamp FROM n"
    )
    db.commit()
    db.close()
    done = nekomem("restore", str(backup), "--memory-root", str(tmp_path / "memory"), timeout=60)
    assert done.returncode == 2 and "no time_indexed_original table" in done.stderr, done.stderr


def test_a_journal_slower_than_the_deadline_is_refused(tmp_path: Path, lan: dict[str, Any]) -> None:
    backup = backup_of(tmp_path, lan)
    db = sqlite3.connect(backup / "Lan" / "time_indexed.db")
    db.executemany("INSERT INTO time_indexed_original (session_id, message) VALUES ('s', ?)", [(f'"{i}"',) for i in range(50_000)])
    db.commit()
    db.close()
    done = nekomem(
        "restore", str(backup), "--memory-root", str(tmp_path / "memory"), env={"NEKOMEM_RESTORE_READ_TIMEOUT_SECONDS": "0.000001"}
    )
    assert done.returncode == 2 and "took longer than" in done.stderr, done.stderr


def test_restore_into_a_cluster_root_uses_the_shard_layout(tmp_path: Path, lan: dict[str, Any]) -> None:
    backup = backup_of(tmp_path, lan)
    root = tmp_path / "cluster-memory"
    (root / "shards" / "0003").mkdir(parents=True)
    done = nekomem("restore", str(backup), "--memory-root", str(root))
    assert done.returncode == 2 and "cluster memory root" in done.stderr and "cluster_shards" in done.stderr, done.stderr
    assert not (root / "Lan").exists()
    cluster = {"NEKOMEM_CLUSTER_ETCD_URL": "http://127.0.0.1:9", "NEKOMEM_CLUSTER_SHARDS": "16"}
    done = nekomem("restore", str(backup), "--memory-root", str(root), env=cluster)
    assert done.returncode == 0, done.stderr
    assert not (root / "Lan").exists()
    assert (character_root(root, "Lan", 16) / "Lan" / "time_indexed.db").is_file()
    done = nekomem("restore", str(backup), "--memory-root", str(root), env=cluster)
    assert done.returncode == 2 and "already in" in done.stderr, done.stderr


# -- issue 37, item 4: the README's lines with the server running or stopped ------------


def test_the_backup_block_with_the_server_running_and_stopped(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "before the backup"}]}).status_code == 200
        url = ["--url", srv.url]
        done = nekomem("backup", "./memory-backup", *url, cwd=tmp_path)
        assert done.returncode == 0 and "backed up 1 character into" in done.stdout, done.stderr
        done = nekomem("export", "./lan.json", "--character", "Lan", *url, cwd=tmp_path)
        assert done.returncode == 0 and "exported 1 character into" in done.stdout, done.stderr
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "after the backup"}]}).status_code == 200
        for extra in ([], ["--replace"]):
            done = nekomem("restore", "./memory-backup", "--memory-root", "./memory", *extra, cwd=tmp_path)
            assert done.returncode == 2, done.stderr
            said = done.stderr
            assert "already" not in said and "/api/import/neko" not in said, said
            assert "in use by a running nekomem server" in said and "Stop that server" in said, said
            assert f"`nekomem restore ./memory-backup --memory-root ./memory{' --replace' if extra else ''}`" in said, said
        done = nekomem("import", "./lan.json", "--memory-root", "./other-memory", cwd=tmp_path)
        assert done.returncode == 0 and "imported 1 character into" in done.stdout, done.stderr
    # Stopped: the command the refusal named restores the backup.
    done = nekomem("restore", "./memory-backup", "--memory-root", "./memory", cwd=tmp_path)
    assert done.returncode == 2 and "`nekomem restore ./memory-backup --memory-root ./memory --replace`" in done.stderr, done.stderr
    done = nekomem("restore", "./memory-backup", "--memory-root", "./memory", "--replace", cwd=tmp_path)
    assert done.returncode == 0 and "restored 1 character into" in done.stdout, done.stderr
    with LiveServer(make_settings(root)) as srv:
        items = srv.get("/api/browse/Lan/journal", params={"order": "asc", "limit": 100}).json()["items"]
    assert [i["text"] for i in items] == ["before the backup"]


def test_a_failure_while_building_the_second_character_changes_nothing(tmp_path: Path, lan: dict[str, Any]) -> None:
    """All or none, with the writer itself: the second character cannot be built (its
    parent is a file), so the first, already built, is not swapped in."""
    from nekomem.stores.snapshot_check import check_character
    from nekomem.stores.snapshot_write import write_characters

    root = imported_root(tmp_path, lan)
    before = fingerprint(root)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file", encoding="utf-8")
    newer = copy.deepcopy(lan)
    newer["files"]["facts.json"] = []
    checked = [check_character(d, where="test", max_depth=64, name_max_length=50, name_max_units=60) for d in (newer, renamed(lan, "Mika"))]
    with pytest.raises(OSError):
        write_characters(checked, lambda name: root if name == "Lan" else blocked / "sub", replace=True)
    assert fingerprint(root) == before  # Lan as it was, and no temporary folder left
