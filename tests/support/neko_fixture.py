"""A reference (N.E.K.O.) memory folder written the way the reference lays it out on disk
(``/work/shared/reference/neko-ondisk.md``): every layer of two characters, a version-1
persona of a third, the process-wide files, and a few malformed records and files that an
importer must report instead of taking.

:func:`build` writes the folder and returns a :class:`NekoFixture` that says what it wrote:
the valid records per layer (so tests compare against the data, not against numbers) and
the malformed ones with the layer and record an importer should name.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

MEMO_PREFIX = "先前对话的备忘录: "
MAIN = "小白"
SECOND = "Mochi"
V1 = "oldcat"


@dataclass
class Malformed:
    character: str
    layer: str
    record: str | None  # the id / index / row an importer should name, None for a whole file


@dataclass
class CharacterData:
    recent: list[dict[str, Any]] = field(default_factory=list)  # valid items, file order
    journal: list[tuple[int, str, dict[str, Any], str]] = field(default_factory=list)  # (id, session, message, timestamp)
    facts: list[dict[str, Any]] = field(default_factory=list)
    facts_archive: list[dict[str, Any]] = field(default_factory=list)
    reflections: list[dict[str, Any]] = field(default_factory=list)
    reflection_archive: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    surfaced: list[dict[str, Any]] = field(default_factory=list)
    persona: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # entity -> entries
    corrections: list[dict[str, Any]] = field(default_factory=list)
    cursors: dict[str, str] = field(default_factory=dict)
    last_past_block_update_at: str | None = None


@dataclass
class NekoFixture:
    root: Path
    characters: dict[str, CharacterData] = field(default_factory=dict)
    malformed: list[Malformed] = field(default_factory=list)


SCOPED_SECTION = "@subject/group_chat:qq:123456"
SECTION_SUBJECT = {"subject_kind": "group_chat", "subject_id": "qq:123456", "scope": "group_chat:qq:123456"}


def is_scoped(record: dict[str, Any], entity: str = "") -> bool:
    """Whether a fixture record belongs to a group/participant subject (its own stamp, or
    the scoped persona section it sits in)."""
    return bool(record.get("subject_kind")) or entity.startswith("@subject/")


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2), encoding="utf-8")


def _local(moment: datetime) -> str:
    """The reference's naive local ISO form."""
    return moment.isoformat(timespec="microseconds")


def fact(fid: str, text: str, created: datetime, **extra: Any) -> dict[str, Any]:
    record = {
        "id": fid,
        "text": text,
        "importance": 6,
        "entity": "master",
        "source": "user_observation",
        "tags": [],
        "hash": fid[-8:] + "00000000",
        "created_at": _local(created),
        "event_when_raw": {"start": {"offset": 0, "unit": "day"}, "end": None},
        "event_start_at": _local(created),
        "event_end_at": None,
        "schema_version": 2,
        "absorbed": False,
        "signal_processed": False,
        "embedding": "AAAAAAAAPDw8PA==",
        "embedding_text_sha256": "ab" * 32,
        "embedding_model_id": "neko-embed-v1",
    }
    record.update(extra)
    return record


def reflection(rid: str, text: str, status: str, created: datetime, source_fact_ids: list[str], **extra: Any) -> dict[str, Any]:
    record = {
        "id": rid,
        "text": text,
        "entity": "master",
        "status": status,
        "source_fact_ids": source_fact_ids,
        "created_at": _local(created),
        "feedback": None,
        "next_eligible_at": _local(created + timedelta(days=1)),
        "reinforcement": 0.0,
        "disputation": 0.0,
        "rein_last_signal_at": None,
        "disp_last_signal_at": None,
        "relation_type": None,
        "temporal_scope": "pattern",
        "subject": None,
        "event_when_raw": None,
        "event_start_at": _local(created),
        "event_end_at": None,
        "schema_version": 2,
        "sub_zero_days": 0,
        "sub_zero_last_increment_date": None,
        "user_fact_reinforce_count": 0,
        "absorbed_into": None,
        "last_promote_attempt_at": None,
        "promote_attempt_count": 0,
        "promote_blocked_reason": None,
        "recent_mentions": [],
        "suppress": False,
        "suppressed_at": None,
        "embedding": None,
        "embedding_text_sha256": None,
        "embedding_model_id": None,
        "last_refine_cluster_hash": None,
        "last_refine_at": None,
    }
    record.update(extra)
    return record


def persona_entry(eid: str, text: str, source: str, protected: bool = False, **extra: Any) -> dict[str, Any]:
    record = {
        "id": eid,
        "text": text,
        "source": source,
        "source_id": None,
        "recent_mentions": [],
        "suppress": False,
        "suppressed_at": None,
        "protected": protected,
        "reinforcement": 0.0,
        "disputation": 0.0,
        "rein_last_signal_at": None,
        "disp_last_signal_at": None,
        "sub_zero_days": 0,
        "sub_zero_last_increment_date": None,
        "user_fact_reinforce_count": 0,
        "merged_from_ids": [],
        "token_count": None,
        "token_count_text_sha256": None,
        "token_count_tokenizer": None,
        "version_history": [],
        "embedding": None,
        "embedding_text_sha256": None,
        "embedding_model_id": None,
        "last_refine_cluster_hash": None,
        "last_refine_at": None,
    }
    record.update(extra)
    return record


def _journal_db(path: Path, rows: list[tuple[int, str, Any, str | None]]) -> None:
    """time_indexed.db as the reference creates it (SQLAlchemy, rollback journal)."""
    db = sqlite3.connect(path)
    try:
        for table in ("time_indexed_original", "time_indexed_compressed"):
            db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR, message TEXT, timestamp DATETIME)")
        try:
            db.execute("CREATE VIRTUAL TABLE facts_fts USING fts5(fact_id, content)")
            db.execute("INSERT INTO facts_fts (fact_id, content) VALUES ('x', 'y')")
        except sqlite3.OperationalError:
            pass  # an SQLite without FTS5: the table is only a search aid
        db.executemany(
            "INSERT INTO time_indexed_original (id, session_id, message, timestamp) VALUES (?, ?, ?, ?)",
            [(rid, sid, msg if isinstance(msg, str) else json.dumps(msg, ensure_ascii=False), ts) for rid, sid, msg, ts in rows],
        )
        db.commit()
    finally:
        db.close()


def _main_character(folder: Path, now: datetime, out: NekoFixture) -> None:
    """Every layer, with malformed records in most of them."""
    data = CharacterData()
    t0 = now - timedelta(days=20)
    for part in (_main_recent, _main_journal, _main_facts, _main_reflections, _main_persona, _main_bookkeeping):
        part(folder, now, t0, data, out.malformed)
    out.characters[folder.name] = data


def _main_recent(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """Recent window and its summary time."""
    name = folder.name
    recent = [
        {"type": "system", "data": {"content": MEMO_PREFIX + "主人在学做拿铁，也喜欢早上的美式咖啡。"}},
        {"type": "human", "data": {"content": "我最近在学做拿铁"}},
        {
            "type": "ai",
            "data": {
                "content": "[20261120 Fri 09:59]喵～拿铁要先打奶泡哦",
                "additional_kwargs": {"anti_repeat_response_id": "r1", "anti_repeat_visible_text_length": 12},
            },
        },
        {
            "type": "human",
            "data": {"content": [{"type": "text", "text": "明天"}, {"type": "text", "text": "再试一次"}]},
            "response_metadata": {},
            "name": None,
            "id": None,
            "example": False,
        },
    ]
    data.recent = recent
    _write(folder / "recent.json", recent[:2] + [{"type": "human"}] + recent[2:])
    bad.append(Malformed(name, "recent", "[2]"))
    data.last_past_block_update_at = _local(now - timedelta(days=1))
    _write(folder / "recent_meta.json", {"last_past_block_update_at": data.last_past_block_update_at})


def _main_journal(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """Journal: three requests (sessions), every row of one sharing its time."""
    name = folder.name
    s1, s2, s3 = "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "6fa459ea-ee8a-3ca4-894e-db77e160355e", "16fd2706-8baf-433b-82eb-8c7fada847da"
    at1, at2, at3 = now - timedelta(days=3, hours=2), now - timedelta(days=1, hours=1), now - timedelta(minutes=30)
    rows: list[tuple[int, str, Any, str | None]] = [
        (1, s1, {"type": "human", "data": {"content": "早上好，我刚喝了一杯美式"}}, str(at1)),
        (2, s1, {"type": "ai", "data": {"content": "[20261128 Sat 08:00]早上好喵", "additional_kwargs": {}}}, str(at1)),
        (3, s2, {"type": "human", "data": {"content": "我最近在学做拿铁"}}, str(at2)),
        (4, s2, {"type": "ai", "data": {"content": "[20261120 Fri 09:59]喵～拿铁要先打奶泡哦"}}, str(at2)),
        (5, s2, "this is not json", str(at2)),
        (6, s3, {"type": "human", "data": {"content": [{"type": "text", "text": "明天"}, {"type": "text", "text": "再试一次"}]}}, str(at3)),
        (7, s3, {"type": "human", "data": {"content": "好的"}}, None),
        (8, s3, {"type": "human", "data": {"content": "好的"}}, str(at3)),  # a repeated line stays repeated
    ]
    _journal_db(folder / "time_indexed.db", rows)
    data.journal = [(r[0], r[1], r[2], r[3]) for r in rows if r[0] not in (5, 7)]  # type: ignore[misc]
    bad.extend([Malformed(name, "journal", "row 5"), Malformed(name, "journal", "row 7")])


def _main_facts(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """Facts and archive."""
    name = folder.name
    f1 = fact("fact_20261111101500_a0e4f870", "主人每天早上喝美式咖啡", t0)
    f2 = fact("fact_20261112101500_b1c2d3e4", "主人养了一只叫豆豆的柴犬", t0 + timedelta(days=1), importance=8, tags=["pet"])
    f3 = fact(
        "fact_20261113101500_c0ffee00",
        "群里的阿明喜欢打羽毛球",
        t0 + timedelta(days=2),
        entity="master",
        subject_kind="group_chat",
        subject_id="qq:123456",
        scope="group_chat:qq:123456",
        speaker_label="阿明",
        speaker_trust=0.4,
    )
    f4 = fact("fact_20261114101500_d15c1050", "猫猫说自己最喜欢晒太阳", t0 + timedelta(days=2), entity="neko", source="ai_disclosure")
    data.facts = [f1, f2, f3, f4]
    broken = [{"id": "fact_broken_notext", "importance": 3}, {"id": "fact_broken_importance", "text": "坏的重要度", "importance": "very"}]
    _write(folder / "facts.json", [f1, broken[0], f2, f3, broken[1], f4, "not an object"])
    bad.extend(
        [
            Malformed(name, "facts", "fact_broken_notext"),
            Malformed(name, "facts", "fact_broken_importance"),
            Malformed(name, "facts", "[6]"),
        ]
    )
    a1 = fact("fact_20260101090000_0a0a0a0a", "主人去年冬天去了札幌看雪祭", now - timedelta(days=300), absorbed=True, signal_processed=True)
    a2 = fact(
        "fact_20260102090000_0b0b0b0b", "主人曾经在书店打工", now - timedelta(days=299), merged_from_ids=["fact_x"], recheck_attempts=2
    )
    data.facts_archive = [a1, a2]
    _write(folder / "facts_archive.json", [a1, a2])


def _main_reflections(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """Reflections, archive shards, surfaced."""
    name = folder.name
    f1, f2 = data.facts[0], data.facts[1]
    a1, a2 = data.facts_archive
    r1 = reflection(
        "ref_00000000000000a1",
        "主人早上离不开咖啡",
        "confirmed",
        t0 + timedelta(days=3),
        [f1["id"]],
        confirmed_at=_local(t0 + timedelta(days=5)),
        reinforcement=1.5,
        rein_last_signal_at=_local(t0 + timedelta(days=5)),
    )
    r2 = reflection("ref_00000000000000a2", "主人很爱护豆豆", "pending", t0 + timedelta(days=4), [f2["id"]], feedback="ignored")
    r3 = reflection(
        "ref_00000000000000a3",
        "主人喜欢冬天",
        "denied",
        t0 + timedelta(days=4),
        [a1["id"]],
        denied_at=_local(t0 + timedelta(days=6)),
        disputation=2.0,
        disp_last_signal_at=_local(t0 + timedelta(days=6)),
    )
    r4 = reflection(
        "ref_00000000000000a4",
        "主人和猫猫的关系很亲密",
        "promoted",
        t0 + timedelta(days=1),
        [f1["id"], f2["id"]],
        promoted_at=_local(t0 + timedelta(days=9)),
        entity="relationship",
    )
    data.reflections = [r1, r2, r3, r4]
    _write(folder / "reflections.json", [r1, r2, {"id": "ref_bad_status", "text": "x", "status": "bogus"}, r3, r4])
    bad.append(Malformed(name, "reflections", "ref_bad_status"))
    shard = "2026-04-01_ab12cd34.json"
    r5 = reflection(
        "ref_00000000000000b5",
        "主人以前常熬夜",
        "archived",
        now - timedelta(days=200),
        [a2["id"]],
        archived_at=_local(now - timedelta(days=100)),
        archive_shard_path=shard,
    )
    data.reflection_archive = {shard: [r5]}
    _write(folder / "reflection_archive" / shard, [r5])
    (folder / "reflection_archive" / "2026-04-02_deadbeef.json").write_text('[{"id": "ref_cut', encoding="utf-8")
    bad.append(Malformed(name, "reflection_archive", None))
    su1 = {
        "reflection_id": r1["id"],
        "text": r1["text"],
        "surfaced_at": _local(t0 + timedelta(days=4)),
        "feedback": "confirmed",
        "feedback_at": _local(t0 + timedelta(days=5)),
    }
    su2 = {"reflection_id": r2["id"], "text": r2["text"], "surfaced_at": _local(t0 + timedelta(days=6)), "feedback": None}
    data.surfaced = [su1, su2]
    _write(folder / "surfaced.json", [su1, {"text": "no reflection id", "surfaced_at": _local(t0)}, su2])
    bad.append(Malformed(name, "surfaced", "[1]"))


def _main_persona(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """Persona (protected card entries, promoted, manual, a scoped section, markers),
    the correction queue and the cursors."""
    name = folder.name
    r4 = data.reflections[3]
    card1 = persona_entry("card_1a2b3c4d", "性格: 温柔", "character_card", protected=True)
    card2 = persona_entry("card_5e6f7a8b", "口癖: 句尾加喵", "character_card", protected=True)
    master1 = persona_entry(
        "prom_ref_00000000000000a4",
        "主人和猫猫一起生活了两年",
        "reflection",
        source_id=r4["id"],
        reinforcement=3.0,
        rein_last_signal_at=_local(t0 + timedelta(days=9)),
        version_history=[{"text": "主人和猫猫一起生活", "replaced_at": _local(t0 + timedelta(days=8)), "reason": "refine"}],
    )
    manual = persona_entry("manual_20261101120000_0c0c0c0c", "主人的生日是三月三日", "manual")
    scoped = persona_entry("manual_20261102120000_0d0d0d0d", "这个群里大家叫主人老大", "manual")
    data.persona = {"master": [master1, manual], "neko": [card1, card2], "relationship": [], SCOPED_SECTION: [scoped]}
    _write(
        folder / "persona.json",
        {
            "master": {"facts": [master1, "not an entry", manual]},
            "neko": {"facts": [card1, card2]},
            "relationship": {"facts": []},
            SCOPED_SECTION: {"facts": [scoped], **SECTION_SUBJECT, "entity": "group_chat"},
            "__meta__": {"facts": [persona_entry("__marker_v2", "migrated", "settings", protected=True)]},
        },
    )
    bad.append(Malformed(name, "persona", "master[1]"))
    c1 = {
        "old_text": "主人的生日是三月三日",
        "new_text": "主人的生日是三月四日",
        "entity": "master",
        "created_at": _local(now - timedelta(days=2)),
    }
    data.corrections = [c1]
    _write(folder / "persona_corrections.json", [c1])
    data.cursors = {"rebuttal_checked_until": _local(now - timedelta(hours=5))}
    _write(folder / "cursors.json", {**data.cursors, "broken_cursor": "yesterday-ish"})
    bad.append(Malformed(name, "cursors", "broken_cursor"))


def _main_bookkeeping(folder: Path, now: datetime, t0: datetime, data: CharacterData, bad: list[Malformed]) -> None:
    """The source's own bookkeeping (reported, not taken)."""
    f1 = data.facts[0]
    ev1, ev2 = "e" * 32, "f" * 32
    (folder / "events.ndjson").write_text(
        json.dumps({"event_id": ev1, "type": "fact.added", "ts": _local(t0), "payload": {"fact_id": f1["id"]}})
        + "\n"
        + json.dumps({"event_id": ev2, "type": "reflection.synthesized", "ts": _local(t0), "payload": {"reflection_id": "ref_unapplied"}})
        + "\n",
        encoding="utf-8",
    )
    _write(folder / "events_applied.json", {"last_applied_event_id": ev1, "ts": _local(t0)})
    (folder / "outbox.ndjson").write_text(
        json.dumps({"op_id": "op-1", "type": "extract_facts", "payload": {"messages": []}, "status": "pending", "ts": _local(t0)})
        + "\n"
        + json.dumps({"op_id": "op-2", "type": "extract_facts", "payload": {"messages": []}, "status": "pending", "ts": _local(t0)})
        + "\n"
        + json.dumps({"op_id": "op-2", "status": "done", "ts": _local(t0)})
        + "\n",
        encoding="utf-8",
    )
    _write(folder / "synth_backoff.json", {"master": {"n": 1, "at": _local(t0)}})
    _write(folder / "anti_repeat_corpus.json", [])


def _second_character(folder: Path, now: datetime, out: NekoFixture) -> None:
    """A small character with every JSON layer, one archived fact, and a broken facts file."""
    data = CharacterData()
    t0 = now - timedelta(days=10)
    data.recent = [
        {"type": "human", "data": {"content": "Mochi, what's for dinner?"}},
        {"type": "ai", "data": {"content": "[20261130 Mon 19:00]Salmon, nya!"}},
    ]
    _write(folder / "recent.json", data.recent)
    sid = "0f0e0d0c-0b0a-4908-8706-050403020100"
    rows: list[tuple[int, str, Any, str | None]] = [
        (1, sid, data.recent[0], str(now - timedelta(hours=3))),
        (2, sid, data.recent[1], str(now - timedelta(hours=3))),
    ]
    _journal_db(folder / "time_indexed.db", rows)
    data.journal = [(r[0], r[1], r[2], r[3]) for r in rows]  # type: ignore[misc]
    (folder / "facts.json").write_text('[{"id": "fact_cut_off", "text": ', encoding="utf-8")
    out.malformed.append(Malformed(folder.name, "facts", None))
    a1 = fact("fact_20261121080000_1e1e1e1e", "Master's favourite fish is salmon", t0, source="external_import", external_import=True)
    data.facts_archive = [a1]
    _write(folder / "facts_archive.json", [a1])
    r1 = reflection("ref_00000000000000c1", "Master cooks fish on weekdays", "pending", t0, [a1["id"]])
    data.reflections = [r1]
    _write(folder / "reflections.json", [r1])
    card = persona_entry("card_0f0f0f0f", "Mochi is a grey tabby", "character_card", protected=True)
    data.persona = {"neko": [card]}
    _write(folder / "persona.json", {"neko": {"facts": [card]}})
    out.characters[folder.name] = data


def _v1_character(folder: Path, out: NekoFixture) -> None:
    """Only a version-1 persona.json (sections ``user``/``ai``, list key ``dynamics``)."""
    data = CharacterData()
    user = persona_entry("legacy_11111111", "Master likes rainy days", "settings")
    ai = persona_entry("card_22222222", "A shy black cat", "character_card", protected=True)
    data.persona = {"master": [user], "neko": [ai]}
    _write(folder / "persona.json", {"user": {"dynamics": [user]}, "ai": {"facts": [ai]}})
    out.characters[folder.name] = data


def build(root: Path, now: datetime | None = None) -> NekoFixture:
    """Write a complete reference memory folder under ``root`` (created) and describe it.
    Times are naive local, as the reference writes them, relative to ``now`` (local)."""
    now = now or datetime.now().replace(microsecond=123456)
    out = NekoFixture(root=root)
    root.mkdir(parents=True, exist_ok=True)
    _main_character(root / MAIN, now, out)
    _second_character(root / SECOND, now, out)
    _v1_character(root / V1, out)
    _write(root / "idle_maintenance_state.json", {"last_run_at": _local(now)})
    _write(root / "speaker_trust.json", {"qq:42": 0.8})
    return out
