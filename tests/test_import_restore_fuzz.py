"""The import and restore fuzz (issue 38): crafted export documents and backup folders
(ids, cursors, the sequence, names, file keys, symbolic links, views, logs, journals, huge
and deep JSON), each given to the real ``nekomem import`` / ``restore`` as a process over a
memory root that already holds characters. Whatever the input:

- never a traceback (stderr has none, the exit status is 0 or 2);
- never a byte outside the root: no file appears or changes outside it (the source and a
  sentinel folder of secrets included), and no secret is pulled into it;
- never a change to an existing character when the command fails (every file hashed
  before and after).
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.restore_probe import export_file, fingerprint, nekomem, renamed, served_character

SECRET = "SECRET-OUTSIDE-THE-ROOT"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A seed document, a memory root holding Lan and Mika, and a backup of that root."""
    tmp = tmp_path_factory.mktemp("base")
    doc = served_character(tmp)
    root = tmp / "memory"
    done = nekomem("import", str(export_file(tmp / "two.json", doc, renamed(doc, "Mika"))), "--memory-root", str(root))
    assert done.returncode == 0, done.stderr
    backup = tmp / "backup"
    done = nekomem("backup", str(backup), "--memory-root", str(root), "--offline")
    assert done.returncode == 0, done.stderr
    (root / ".nekomem.lock").unlink()
    return {"doc": doc, "root": root, "backup": backup}


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return apply


def _row(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["journal"]["rows"][0].update(fields)


def _repeat_row(doc: dict[str, Any]) -> None:
    doc["journal"]["rows"].append(copy.deepcopy(doc["journal"]["rows"][0]))


# Each crafted document: a change to a copy of the seed (raw text replaces "RAW-n" markers).
DOCUMENTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "id-zero": _row(id=0),
    "id-negative": _row(id=-1),
    "id-2^53": _row(id=2**53),
    "id-2^63-1": _row(id=2**63 - 1),
    "id-2^63": _row(id=2**63),
    "id-2^70": _row(id=2**70),
    "id-float": _row(id=1.5),
    "id-string": _row(id="1"),
    "id-bool": _row(id=True),
    "id-repeated": _repeat_row,
    "session-int": _row(session_id=5),
    "timestamp-list": _row(timestamp=["2026"]),
    "message-nul": _row(message="a\x00b"),
    "message-deep": _row(message="RAW-deep-400"),
    "rows-not-list": _set(["journal", "rows"], {"id": 1}),
    "journal-not-object": _set(["journal"], []),
    "sequence-negative": _set(["journal", "sequence"], -1),
    "sequence-below-rows": _set(["journal", "sequence"], 1),
    "sequence-2^63": _set(["journal", "sequence"], 2**63),
    "sequence-string": _set(["journal", "sequence"], "9"),
    "cursor-negative": _set(["journal", "cursors", "post_turn"], -5),
    "cursor-past-sequence": _set(["journal", "cursors", "post_turn"], 10**9),
    "cursor-string": _set(["journal", "cursors", "post_turn"], "3"),
    "cursors-list": _set(["journal", "cursors"], [1]),
    "name-empty": _set(["name"], ""),
    "name-dotdot": _set(["name"], ".."),
    "name-slash": _set(["name"], "a/b"),
    "name-device": _set(["name"], "CON"),
    "name-long": _set(["name"], "L" * 5000),
    "name-nul": _set(["name"], "L\x00n"),
    "name-zero-width": _set(["name"], "La\u200bn"),
    "name-int": _set(["name"], 7),
    "name-lock-file": _set(["name"], ".nekomem.lock"),
    "name-core-config": _set(["name"], "core_config.json"),
    "name-temp": _set(["name"], ".nkatmp-restore-x"),
    "key-parent": lambda d: d["files"].update({"../escape.json": []}),
    "key-absolute": lambda d: d["files"].update({"/tmp/escape.json": []}),
    "key-archive-parent": lambda d: d["files"].update({"reflection_archive/../../escape.json": []}),
    "key-subfolder": lambda d: d["files"].update({"sub/x.json": []}),
    "key-not-json": lambda d: d["files"].update({"x.sh": []}),
    "key-nul": lambda d: d["files"].update({"a\x00.json": []}),
    "key-long": lambda d: d["files"].update({"x" * 300 + ".json": []}),
    "key-hidden": lambda d: d["files"].update({".nekomem.lock.json": []}),
    "key-log-as-view": lambda d: d["files"].update({"events.ndjson": []}),
    "key-empty-part": lambda d: d["files"].update({"reflection_archive/": []}),
    "view-facts-object": _set(["files", "facts.json"], {"a": 1}),
    "view-persona-list": _set(["files", "persona.json"], []),
    "view-meta-string": _set(["files", "recent_meta.json"], "x"),
    "view-archive-object": lambda d: d["files"].update({"reflection_archive/2026-05.json": {}}),
    "view-deep": _set(["files", "facts.json"], "RAW-deep-1000"),
    "view-very-deep": _set(["files", "facts.json"], "RAW-deep-100000"),
    "view-huge": _set(["files", "facts.json"], [{"text": "x" * 1000, "id": f"fact_{i}"} for i in range(20_000)]),
    "log-not-list": _set(["logs", "events.ndjson"], {"a": 1}),
    "log-unknown": lambda d: d["logs"].update({"evil.ndjson": []}),
    "log-deep-line": _set(["logs", "outbox.ndjson"], ["RAW-deep-400"]),
    "files-not-object": _set(["files"], []),
    "format-wrong": _set(["format"], "other"),
    "version-2": _set(["version"], 2),
}
# Whole files rather than one character.
FILES: dict[str, str] = {
    "not-json": "{nope",
    "empty": "",
    "deep-file": _deep(200_000),
    "export-version-9": json.dumps({"format": "nekomem-export", "version": 9, "characters": []}),
    "characters-object": json.dumps({"format": "nekomem-export", "version": 1, "characters": {}}),
    "a-list": "[]",
}


def _raw(text: str) -> str:
    for depth in (400, 1000, 100_000):
        text = text.replace(f'"RAW-deep-{depth}"', _deep(depth))
    return text


def _watch(tmp_path: Path, root: Path) -> dict[str, str]:
    """Every file of the test's folder outside ``root`` (the source, the secrets)."""
    return {k: v for k, v in fingerprint(tmp_path).items() if not (tmp_path / k).is_relative_to(root)}


def _check(tmp_path: Path, root: Path, command: list[str], outside_before: dict[str, str]) -> None:
    before = fingerprint(root)
    done = nekomem(*command, "--memory-root", str(root), timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 2), (done.returncode, done.stderr)
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        after = {k: v for k, v in fingerprint(root).items() if k != ".nekomem.lock"}
        assert after == {k: v for k, v in before.items() if k != ".nekomem.lock"}, "a failed command changed the root"
    assert _watch(tmp_path, root) == outside_before, "a file outside the root appeared or changed"
    for path in root.rglob("*"):
        assert not path.is_symlink(), path
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.parametrize("case", sorted(DOCUMENTS))
def test_crafted_documents(tmp_path: Path, base: dict[str, Any], case: str) -> None:
    """Each crafted document replaces the existing Lan (so a failure must keep Lan whole)."""
    root = tmp_path / "memory"
    shutil.copytree(base["root"], root)
    doc = renamed(base["doc"], "Lan")
    DOCUMENTS[case](doc)
    source = export_file(tmp_path / "crafted.json", doc)
    source.write_text(_raw(source.read_text(encoding="utf-8")), encoding="utf-8")
    outside = _watch(tmp_path, root)
    _check(tmp_path, root, ["import", str(source), "--replace"], outside)


@pytest.mark.parametrize("case", sorted(FILES))
def test_crafted_files(tmp_path: Path, base: dict[str, Any], case: str) -> None:
    root = tmp_path / "memory"
    shutil.copytree(base["root"], root)
    source = tmp_path / "crafted.json"
    source.write_text(FILES[case], encoding="utf-8")
    _check(tmp_path, root, ["import", str(source), "--replace"], _watch(tmp_path, root))


def test_random_documents(tmp_path: Path, base: dict[str, Any]) -> None:
    """Several crafted changes at once, into a file of two characters (seeded)."""
    rng = random.Random(38)
    names = sorted(DOCUMENTS)
    for i in range(12):
        case = tmp_path / f"case{i}"
        root = case / "memory"
        shutil.copytree(base["root"], root)
        first, second = renamed(base["doc"], "Lan"), renamed(base["doc"], f"New{i}")
        for pick in rng.sample(names, 3):
            try:
                DOCUMENTS[pick](rng.choice([first, second]))
            except (AttributeError, KeyError, IndexError, TypeError):
                continue  # an earlier change took away what this one changes
        source = export_file(case / "crafted.json", first, second)
        source.write_text(_raw(source.read_text(encoding="utf-8")), encoding="utf-8")
        _check(case, root, ["import", str(source), "--replace"], _watch(case, root))


def _secret(tmp_path: Path) -> Path:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "facts.json").write_text(json.dumps([{"text": SECRET}]), encoding="utf-8")
    (secrets / "2026-05.json").write_text(json.dumps([{"text": SECRET}]), encoding="utf-8")
    (secrets / "config.json").write_text(json.dumps({"powerful": SECRET}), encoding="utf-8")
    return secrets


def _journal_view(path: Path) -> None:
    path.unlink()
    db = sqlite3.connect(path)
    db.execute(
        "CREATE VIEW time_indexed_original AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
        "SELECT x AS id, 's' AS session_id, '{}' AS message, NULL AS timestamp FROM n"
    )
    db.commit()
    db.close()


def _journal_columns(path: Path) -> None:
    path.unlink()
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE time_indexed_original (id INTEGER PRIMARY KEY)")
    db.commit()
    db.close()


def _journal_bad_utf8(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("INSERT INTO time_indexed_original (session_id, message) VALUES ('s', CAST(X'fffe' AS TEXT))")
    db.commit()
    db.close()


def _journal_big_id(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("INSERT INTO time_indexed_original (id, session_id, message) VALUES (9223372036854775807, 's', '{}')")
    db.commit()
    db.close()


# Each crafted backup folder: a change to a copy of the backup (``s`` is the secrets folder).
FOLDERS: dict[str, Callable[[Path, Path], None]] = {
    "link-view": lambda b, s: ((b / "Lan/facts.json").unlink(), (b / "Lan/facts.json").symlink_to(s / "facts.json")),
    "link-new-view": lambda b, s: (b / "Lan/surfaced.json").symlink_to(s / "facts.json"),
    "link-archive-dir": lambda b, s: (b / "Lan/reflection_archive").symlink_to(s, target_is_directory=True),
    "link-archive-file": lambda b, s: (
        (b / "Lan/persona_archive").mkdir(),
        (b / "Lan/persona_archive/x.json").symlink_to(s / "2026-05.json"),
    ),
    "link-character": lambda b, s: (b / "Evil").symlink_to(s, target_is_directory=True),
    "link-character-to-root": lambda b, s: (b / "Evil").symlink_to(b / "Lan", target_is_directory=True),
    "link-core-config": lambda b, s: (b / "core_config.json").symlink_to(s / "config.json"),
    "link-log": lambda b, s: (b / "Lan/outbox.ndjson").symlink_to(s / "facts.json"),
    "link-journal": lambda b, s: (
        (b / "Lan/time_indexed.db").rename(s / "journal.db"),
        (b / "Lan/time_indexed.db").symlink_to(s / "journal.db"),
    ),
    "link-wal": lambda b, s: (b / "Lan/time_indexed.db-wal").symlink_to(s / "facts.json"),
    "fifo-view": lambda b, s: ((b / "Lan/facts.json").unlink(), os.mkfifo(b / "Lan/facts.json")),
    "folder-view": lambda b, s: ((b / "Lan/facts.json").unlink(), (b / "Lan/facts.json").mkdir()),
    "view-not-json": lambda b, s: (b / "Lan/facts.json").write_text("{nope", encoding="utf-8"),
    "view-deep": lambda b, s: (b / "Lan/facts.json").write_text(_deep(100_000), encoding="utf-8"),
    "view-wrong-shape": lambda b, s: (b / "Lan/persona.json").write_text("[]", encoding="utf-8"),
    "journal-text": lambda b, s: (b / "Lan/time_indexed.db").write_text("not a database", encoding="utf-8"),
    "journal-empty": lambda b, s: (b / "Lan/time_indexed.db").write_bytes(b""),
    "journal-view": lambda b, s: _journal_view(b / "Lan/time_indexed.db"),
    "journal-columns": lambda b, s: _journal_columns(b / "Lan/time_indexed.db"),
    "journal-bad-utf8": lambda b, s: _journal_bad_utf8(b / "Lan/time_indexed.db"),
    "journal-id-2^63-1": lambda b, s: _journal_big_id(b / "Lan/time_indexed.db"),
    "journal-truncated": lambda b, s: (b / "Lan/time_indexed.db").write_bytes((b / "Lan/time_indexed.db").read_bytes()[:1000]),
    "core-config-list": lambda b, s: (b / "core_config.json").write_text("[]", encoding="utf-8"),
    "dir-view-archive": lambda b, s: ((b / "Lan/persona_archive").mkdir(), (b / "Lan/persona_archive/x.json").mkdir()),
    "folder-long-name": lambda b, s: shutil.copytree(b / "Lan", b / ("L" * 200)),
    "folder-bad-name": lambda b, s: shutil.copytree(b / "Lan", b / "a\u200bb"),
}


@pytest.mark.parametrize("case", sorted(FOLDERS))
def test_crafted_backup_folders(tmp_path: Path, base: dict[str, Any], case: str) -> None:
    root = tmp_path / "memory"
    shutil.copytree(base["root"], root)
    backup = tmp_path / "backup"
    shutil.copytree(base["backup"], backup)
    secrets = _secret(tmp_path)
    FOLDERS[case](backup, secrets)
    outside = _watch(tmp_path, root)
    _check(tmp_path, root, ["restore", str(backup), "--replace"], outside)
