"""Archive sweeps of reflections and persona over a real server (issue 8, item 3), and
records that fail validation on load are kept aside, never dropped (item 4)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from nekomem.actors.messages import Flush
from nekomem.actors.supervisor import child_order
from nekomem.runtime.clock import ManualClock
from nekomem.stores.layout import CharacterPaths
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce

NAME = "Lan"
START = datetime(2026, 7, 1, 12, 0, tzinfo=timezone.utc)
SHARD = re.compile(r"^2026-07-0[12]_[0-9a-f]{8}\.json$")


def settle(srv: LiveServer) -> None:
    for child in child_order():
        srv.runtime.registry.ask_sync(NAME, child, lambda reply: Flush(reply=reply))


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


def below_zero(days: int) -> dict:
    """Evidence of an entry disputed long ago, below zero on ``days`` distinct days."""
    return {
        "disputation": 3.0,
        "disp_last_signal_at": (START - timedelta(days=20)).isoformat(),
        "sub_zero_days": days,
        "sub_zero_last_increment_date": (START - timedelta(days=1)).date().isoformat(),
    }


def seed(root: Path, settings) -> CharacterPaths:
    paths = CharacterPaths(root, NAME)
    paths.ensure()
    days = settings.longterm.evidence_archive_days - 1  # one more sweep day archives them
    write(
        paths.reflections,
        [
            {
                "id": "ref_doomed",
                "text": "Master hates mornings",
                "entity": "master",
                "status": "pending",
                "created_at": (START - timedelta(days=30)).isoformat(),
                **below_zero(days),
            },
            {
                "id": "ref_fine",
                "text": "Master likes tea",
                "entity": "master",
                "status": "pending",
                "created_at": (START - timedelta(days=1)).isoformat(),
            },
            {
                "id": "ref_denied_long_ago",
                "text": "Master is a dog person",
                "entity": "master",
                "status": "denied",
                "created_at": (START - timedelta(days=60)).isoformat(),
                "denied_at": (START - timedelta(days=40)).isoformat(),
            },
        ],
    )
    write(
        paths.persona,
        {
            "master": {
                "facts": [
                    {"id": "prom_doomed", "text": "Master is a night owl", "source": "reflection", **below_zero(days)},
                    {"id": "prom_fine", "text": "Master has a cat", "source": "reflection"},
                ]
            }
        },
    )
    return paths


def ids(srv: LiveServer, layer: str) -> set[str]:
    return {item["id"] for item in srv.get(f"/api/characters/{NAME}/{layer}").json()["items"]}


def shard_entries(folder: Path) -> dict[str, list]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in folder.glob("*.json")}


def test_both_archive_sweeps_move_entries_into_day_shards(tmp_path):
    clock = ManualClock(START)
    settings = make_settings(tmp_path, embedding_enabled=False, passivate_idle_seconds=1e9)  # the clock jumps by days
    paths = seed(tmp_path, settings)
    with LiveServer(settings, clock=clock) as srv:
        assert ids(srv, "reflections") == {"ref_doomed", "ref_fine", "ref_denied_long_ago"}
        assert ids(srv, "persona") == {"prom_doomed", "prom_fine"}
        clock.advance(settings.longterm.evidence_archive_sweep_initial_delay_seconds + 1)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        settle(srv)
        assert ids(srv, "reflections") == {"ref_fine"}
        assert ids(srv, "persona") == {"prom_fine"}

        # The next day's sweep runs too (a crashing sweep restarted the actor each time).
        clock.advance(days=1)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        settle(srv)
        health = srv.get("/health").json()
        assert srv.get(f"/api/characters/{NAME}/reflections").status_code == 200

    reflection_shards = shard_entries(paths.reflection_archive_dir)
    persona_shards = shard_entries(paths.persona_archive_dir)
    assert all(SHARD.match(name) for name in [*reflection_shards, *persona_shards]), (reflection_shards, persona_shards)
    archived = {e["id"]: e["status"] for entries in reflection_shards.values() for e in entries}
    assert archived == {"ref_doomed": "archived", "ref_denied_long_ago": "denied"}
    assert [e["entry"]["id"] for entries in persona_shards.values() for e in entries] == ["prom_doomed"]
    assert health["supervision"]["child_restarts"] == 0 and health["supervision"]["failed_children"] == 0, health


def test_unreadable_records_are_kept_aside_not_dropped(tmp_path):
    settings = make_settings(tmp_path, embedding_enabled=False)
    paths = CharacterPaths(tmp_path, NAME)
    paths.ensure()
    bad_correction = {"id": 17, "text": ["not", "a", "string"]}
    good_surfaced = {"reflection_id": "ref_a", "text": "Master likes tea", "surfaced_at": START.isoformat()}
    bad_surfaced = {"reflection_id": None, "surfaced_at": {"when": "yesterday"}}
    bad_entry = {"id": "prom_bad", "text": 42}
    write(paths.persona_corrections, [bad_correction])
    write(paths.surfaced, [good_surfaced, bad_surfaced])
    write(paths.persona, {"master": {"facts": [{"id": "prom_ok", "text": "Master has a cat"}, bad_entry]}})
    write(paths.facts, [{"id": "fact_bad", "text": None}])
    good_turn = {"type": "human", "data": {"content": "hello there"}}
    bad_turn = {"type": "human", "data": {"content": {"nested": True}}}
    write(paths.recent, [good_turn, bad_turn])

    with LiveServer(settings) as srv:
        assert ids(srv, "persona") == {"prom_ok"}
        # A change makes every owner rewrite its views.
        r = srv.post(f"/api/characters/{NAME}/card", json={"entries": [{"entity": "neko", "text": "Lan is a cat girl"}]})
        assert r.status_code == 200, r.text
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master likes green tea", "importance": 5}]})
        assert r.status_code == 200, r.text
        r = srv.post(f"/record_surfaced/{NAME}", json={"reflection_ids": []})
        assert r.status_code == 200, r.text
        settle(srv)
    with LiveServer(settings) as srv:  # a second load keeps nothing twice
        assert "prom_ok" in ids(srv, "persona")
        settle(srv)

    def kept(view: Path) -> list:
        found = sorted(view.parent.glob(view.name + ".rejected-*"))
        assert len(found) == 1, f"{view.name}: {found}"
        return json.loads(found[0].read_text(encoding="utf-8"))

    assert kept(paths.persona_corrections) == [bad_correction]
    assert kept(paths.surfaced) == [bad_surfaced]
    assert kept(paths.persona) == [{"entity": "master", "entry": bad_entry}]
    assert kept(paths.facts) == [{"id": "fact_bad", "text": None}]
    assert kept(paths.recent) == [bad_turn]
    assert [m["data"]["content"] for m in json.loads(paths.recent.read_text(encoding="utf-8"))] == ["hello there"]
    # The readable records are still in the rewritten views.
    persona = json.loads(paths.persona.read_text(encoding="utf-8"))
    assert [e["id"] for e in persona["master"]["facts"]] == ["prom_ok"]
    surfaced = json.loads(paths.surfaced.read_text(encoding="utf-8"))
    assert [(e["reflection_id"], e["text"]) for e in surfaced] == [("ref_a", "Master likes tea")]
