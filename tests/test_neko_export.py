"""``nekomem export-neko``: going back to the reference.

A reference folder (tests/support/neko_fixture.py) is imported, a real server adds
nekomem-written data on top (turns, a theater capsule), and the memory root is exported.
The exported folder is read with the reference's own parsing rules, implemented here
independently of nekomem's code: naive ``datetime.fromisoformat`` for JSON times,
``datetime.strptime(..., "%Y-%m-%d %H:%M:%S.%f")`` (the SQLAlchemy/sqlite form) for the
journal, ``MAX(timestamp)`` compared with a naive ``datetime.now()``, and the LangChain
message-dict shape. It is then imported again with nekomem's own importer and compared
with the memory root it came from.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from nekomem.cli import main as cli
from tests.support import neko_fixture
from tests.support.live import LiveServer, make_settings

ZONE = "Asia/Tokyo"  # not the machine's zone: a wrong conversion cannot pass by accident
DB_TIME = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{6}$")
EMBEDDING = ("embedding", "embedding_text_sha256", "embedding_model_id")
CAPSULE = "Lan and Master hid from the storm in an old lighthouse."


# -- the reference's reading rules ---------------------------------------------------------
def ref_json_time(value: str) -> datetime:
    """How the reference reads a JSON time: fromisoformat, and it must be naive (it is
    compared with datetime.now())."""
    parsed = datetime.fromisoformat(value)
    assert parsed.tzinfo is None, f"{value!r} is not a naive local time"
    datetime.now() - parsed  # the reference's comparison: raises TypeError for an aware time
    return parsed


def ref_message(raw: Any) -> tuple[str, str]:
    """messages_from_dict: ``{"type": human|ai|system, "data": {"content": str | parts}}``."""
    assert isinstance(raw, dict) and raw["type"] in ("human", "ai", "system"), raw
    content = raw["data"]["content"]
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")
    assert isinstance(content, str)
    return raw["type"], content


def ref_times(value: Any, where: str) -> int:
    """Every ``*_at`` / ``recent_mentions`` time in a JSON value read the reference's way."""
    count = 0
    if isinstance(value, list):
        return sum(ref_times(v, where) for v in value)
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("_at") and isinstance(item, str):
                ref_json_time(item)
                count += 1
            elif key == "recent_mentions" and isinstance(item, list):
                count += sum(1 for t in item if ref_json_time(t))
            else:
                count += ref_times(item, where)
    return count


def ref_journal(path: Path) -> list[tuple[str, str, str, datetime | None]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT session_id, message, timestamp FROM time_indexed_original ORDER BY id").fetchall()
        top = db.execute("SELECT MAX(timestamp) FROM time_indexed_original").fetchone()[0]
        assert db.execute("SELECT COUNT(*) FROM time_indexed_compressed").fetchone()[0] == 0
    finally:
        db.close()
    out = []
    for session, message, stamp in rows:
        role, text = ref_message(json.loads(message))
        if stamp is not None:
            assert DB_TIME.match(stamp), stamp
            moment = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
        else:
            moment = None
        out.append((session, role, text, moment))
    stamps = [r[3] for r in out if r[3] is not None]
    if stamps:
        # get_last_conversation_time: MAX over the text column, then fromisoformat, then now - last.
        last = datetime.fromisoformat(top)
        assert last == max(stamps) and last.tzinfo is None
        datetime.now() - last
    return out


# -- comparison of two nekomem roots -----------------------------------------------------------
def instant(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    assert parsed.tzinfo is not None, value
    return parsed.astimezone(timezone.utc)


def normal(value: Any) -> Any:
    """A nekomem record with embeddings left out and every time as a UTC instant."""
    if isinstance(value, list):
        return [normal(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in EMBEDDING:
            continue
        if key.endswith("_at") and isinstance(item, str):
            out[key] = instant(item)
        elif key == "recent_mentions" and isinstance(item, list):
            out[key] = [instant(t) for t in item]
        else:
            out[key] = normal(item)
    return out


def read(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def journal_multiset(path: Path) -> Counter[tuple[str, str, str, datetime | None]]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT session_id, message, timestamp FROM time_indexed_original").fetchall()
    finally:
        db.close()
    return Counter((s, *ref_message(json.loads(m)), instant(t) if t else None) for s, m, t in rows)


def cli_run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_export_reads_back_with_the_reference_rules_and_reimports_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEKOMEM_IMPORT_SOURCE_TIMEZONE", ZONE)
    fixture = neko_fixture.build(tmp_path / "neko")
    root_a, out_dir, root_b = tmp_path / "a", tmp_path / "exported", tmp_path / "b"
    code, _, err = cli_run(capsys, "import-neko", str(fixture.root), "--memory-root", str(root_a))
    assert code == 0, err
    main = neko_fixture.MAIN
    with LiveServer(make_settings(root_a)) as srv:
        srv.post(f"/cache/{main}", json={"input_history": [{"role": "user", "content": "nekomem wrote this turn"}]})
        meta = {
            "source": "theater_numeric_v2",
            "memory_tier": "episode_summary",
            "story_id": "story_rain",
            "session_id": "session_rain",
            "story_title": "Rainy Night",
            "episode_summary": CAPSULE,
            "archive_through_revision": 4,
            "performed_at": "2026-05-01T21:30:00+09:00",
        }
        capsule = {"role": "system", "content": CAPSULE, "metadata": meta}
        body = {"input_history": json.dumps([capsule]), "idempotency_key": "archive-1", "theater_archive_attempt": 1}
        assert srv.post(f"/cache/{main}", json=body).json()["status"] == "cached"

    code, out, err = cli_run(capsys, "export-neko", str(out_dir), "--memory-root", str(root_a))
    assert code == 0, err
    report = json.loads(out)
    assert sorted(report["characters"]) == sorted(fixture.characters)

    for name, data in fixture.characters.items():
        folder = out_dir / name
        journal = ref_journal(folder / "time_indexed.db") if (folder / "time_indexed.db").exists() else []
        recent = read(folder / "recent.json") or []
        recent_pairs = [ref_message(m) for m in recent]
        for file in ("facts.json", "facts_archive.json", "reflections.json", "surfaced.json", "persona_corrections.json"):
            value = read(folder / file)
            if value is not None:
                assert isinstance(value, list)
                ref_times(value, file)
                assert all(r.get(k) is None for r in value for k in EMBEDDING if k in r)
        for shard in (folder / "reflection_archive").glob("*.json"):
            ref_times(read(shard), shard.name)
        persona = read(folder / "persona.json")
        if persona is not None:
            assert all(isinstance(s.get("facts"), list) for k, s in persona.items() if not k.startswith("__"))
            ref_times(persona, "persona.json")
        for value in (read(folder / "cursors.json") or {}).values():
            ref_json_time(value)
        if data.last_past_block_update_at:
            stamp = read(folder / "recent_meta.json")["last_past_block_update_at"]
            # The reference's own string comes back: same zone, same naive local time.
            assert ref_json_time(stamp) == datetime.fromisoformat(data.last_past_block_update_at)

        # The reference's records come back with their own naive times (not shifted).
        for layer in ("facts", "reflections"):
            exported = {r["id"]: r for r in read(folder / f"{layer}.json") or []}
            for record in getattr(data, layer):
                if record["id"] in exported and not neko_fixture.is_scoped(record):
                    assert exported[record["id"]]["created_at"] == record["created_at"], (layer, record["id"])
        expected = [(sid, *ref_message(m), datetime.fromisoformat(ts.replace(" ", "T"))) for _rid, sid, m, ts in data.journal]
        assert [r for r in journal if r[2] != "nekomem wrote this turn" and r[2] != CAPSULE] == expected
        if name == main:
            assert recent_pairs[-2:] == [("human", "nekomem wrote this turn"), ("system", CAPSULE)]
            assert recent[-1]["data"]["metadata"]["story_id"] == "story_rain"  # the capsule keeps its metadata
            assert "additional_kwargs" not in recent[-2]["data"]  # nekomem's own time annotation is not exported
            capsule_row = [r for r in journal if r[2] == CAPSULE]
            assert len(capsule_row) == 1 and capsule_row[0][3] == datetime(2026, 5, 1, 21, 30)  # performed_at, Tokyo
            theirs = [r for r in journal if r[2] == "nekomem wrote this turn"]
            assert len(theirs) == 1 and theirs[0][3] is not None

    # Exporting over an exported folder is refused; nothing is overwritten.
    before = (out_dir / main / "facts.json").read_bytes()
    code, _, err = cli_run(capsys, "export-neko", str(out_dir), "--memory-root", str(root_a))
    assert code == 1 and "already holds files" in err
    assert (out_dir / main / "facts.json").read_bytes() == before

    # nekomem's importer reads the export back into what it was exported from.
    code, _, err = cli_run(capsys, "import-neko", str(out_dir), "--memory-root", str(root_b))
    assert code == 0, err
    for name in fixture.characters:
        a, b = root_a / name, root_b / name
        for file in ("facts.json", "facts_archive.json", "reflections.json", "surfaced.json", "persona.json", "persona_corrections.json"):
            assert normal(read(b / file)) == normal(read(a / file)), (name, file)
        shards_a = {p.name: normal(read(p)) for p in (a / "reflection_archive").glob("*.json")}
        shards_b = {p.name: normal(read(p)) for p in (b / "reflection_archive").glob("*.json")}
        assert shards_b == shards_a
        if (a / "time_indexed.db").exists():
            assert journal_multiset(b / "time_indexed.db") == journal_multiset(a / "time_indexed.db")
        recent_a = [(m["type"], m["data"]["content"], m["data"].get("metadata")) for m in read(a / "recent.json") or []]
        recent_b = [(m["type"], m["data"]["content"], m["data"].get("metadata")) for m in read(b / "recent.json") or []]
        assert recent_b == recent_a
        cursors_a = {k: instant(v) for k, v in (read(a / "cursors.json") or {}).items()}
        assert {k: instant(v) for k, v in (read(b / "cursors.json") or {}).items()} == cursors_a


def test_export_refuses_a_held_root_and_unknown_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    with LiveServer(make_settings(root)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]})
        code, _, err = cli_run(capsys, "export-neko", str(tmp_path / "out"), "--memory-root", str(root))
        assert code == 1 and "export-neko" in err
    code, _, err = cli_run(capsys, "export-neko", str(tmp_path / "out"), "--memory-root", str(root), "--character", "Nobody")
    assert code == 1 and "Nobody" in err
    code, _, err = cli_run(capsys, "export-neko", str(root / "inside"), "--memory-root", str(root))
    assert code == 1 and "outside the memory root" in err
    code, _, err = cli_run(capsys, "export-neko", str(tmp_path / "out"), "--memory-root", str(root), "--timezone", "Mars/Olympus")
    assert code == 1 and "unknown time zone" in err
