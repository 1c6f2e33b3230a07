"""Seeding for the memory-browser tests: stores written directly before a server starts
(10,000 journal turns, 100,000 facts, a persona with a contradiction queue), so that the
browser tests spend their time in the browser, not in 100,000 HTTP calls."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec

from nekomem.domain.records import Correction, Fact, PersonaEntry, fact_hash, persona_to_disk
from nekomem.domain.turns import Turn
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.timeindex import TimeIndex

BASE = datetime(2026, 1, 1, 8, 0, tzinfo=timezone.utc)


def seed_journal(root: Path, name: str, turns: int) -> None:
    """``turns`` alternating user/character turns one minute apart, in one transaction."""
    paths = CharacterPaths(root, name)
    paths.ensure()
    rows = [
        Turn(
            role="human" if i % 2 == 0 else "ai",
            text=f"journal line {i:05d} " + ("about kites" if i % 10 == 0 else "small talk"),
            ts=(BASE + timedelta(minutes=i)).isoformat(),
        )
        for i in range(turns)
    ]
    with TimeIndex(paths.time_index_db) as db:
        db.append("seed", rows)


def seed_facts(root: Path, name: str, count: int, archived: int = 0) -> None:
    """``count`` active facts (facts.json) and ``archived`` archived ones
    (facts_archive.json), as FactActor loads them at activation. Active facts are from the
    last ``count`` seconds, so none is old enough to be archived while the test runs."""
    paths = CharacterPaths(root, name)
    paths.ensure()
    entities = ("master", "neko", "relationship")
    now = datetime.now(timezone.utc)

    def fact(i: int, created: datetime, absorbed: bool) -> Fact:
        text = f"Seeded fact number {i} about topic {i % 997}"
        return Fact(
            id=f"fact_seed_{i:06d}",
            text=text,
            importance=1 + i % 10,
            entity=entities[i % 3],
            hash=fact_hash(text),
            created_at=created.isoformat(),
            absorbed=absorbed,
        )

    active = [fact(i, now - timedelta(seconds=count - i), i % 7 == 0) for i in range(count)]
    old = [fact(count + i, BASE + timedelta(hours=i), True) for i in range(archived)]
    paths.facts.write_bytes(msgspec.json.encode(active))
    paths.facts_archive.write_bytes(msgspec.json.encode(old))


def seed_persona(root: Path, name: str) -> None:
    """A protected card entry, two learned entries and one queued contradiction."""
    paths = CharacterPaths(root, name)
    paths.ensure()
    created = BASE.isoformat()
    persona = {
        "master": [
            PersonaEntry(id="card_1", text="Master is a night owl", source="character_card", protected=True, created_at=created),
            PersonaEntry(
                id="per_tea",
                text="Master drinks jasmine tea every morning",
                source="reflection",
                created_at=created,
                reinforcement=3.0,
                rein_last_signal_at=created,
            ),
        ],
        "neko": [
            PersonaEntry(
                id="per_song",
                text="Lan hums when she is happy",
                source="reflection",
                created_at=created,
                reinforcement=2.0,
                rein_last_signal_at=created,
            )
        ],
        "relationship": [],
    }
    atomic_write_json(paths.persona, persona_to_disk(persona))
    corrections = [
        Correction(
            old_text="Master drinks jasmine tea every morning",
            new_text="Master switched to coffee in the mornings",
            entity="master",
            created_at=created,
            old_entry_id="per_tea",
        )
    ]
    atomic_write_json(paths.persona_corrections, corrections)
