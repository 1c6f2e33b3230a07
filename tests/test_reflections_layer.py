"""The reflections layer as a plain object: no ReflectionActor nor runtime, its handlers
called directly.

The layer runs over FakePorts (a real character folder and journal under a temporary
memory root); what it sends its siblings is read from the ports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pytest

from nekomem.actors.messages import EditEntry, IndexUpsert
from nekomem.config import Settings
from nekomem.domain.layers import event_owners
from nekomem.domain.records import Reflection, SurfacedEntry, to_iso
from nekomem.layers.reflections.evidence import FeedbackDone
from nekomem.layers.reflections.layer import ReflectionLayer
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.reply import Reply
from nekomem.stores.applied import SharedJournal
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings

NAME = "Lan"
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)


@dataclass
class World:
    settings: Settings
    root: Path
    clock: ManualClock = field(default_factory=lambda: ManualClock(T0))
    ports: list[FakePorts] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = CharacterPaths(self.root, NAME)
        self.paths.ensure()
        self.journal = SharedJournal(self.paths.events, self.paths.events_applied, event_owners())

    def layer(self) -> ReflectionLayer:
        """A fresh layer over these files, loaded (as a restarted actor would be)."""
        ports = FakePorts(self.settings, self.root, "reflections", character=NAME, clock=self.clock, journal=self.journal)
        self.ports.append(ports)
        layer = ReflectionLayer(ports)
        layer.load()
        return layer

    def delivered(self) -> list[tuple[str, object]]:
        """What the layers sent their siblings so far, in order."""
        return [item for ports in self.ports for item in ports.sent]


@pytest.fixture
def world(tmp_path: Path) -> World:
    # The views are written only on Flush here (a first load that reads the tokenizer can
    # take longer than view_flush_seconds).
    return World(make_settings(tmp_path, view_flush_changes=10_000, view_flush_seconds=3_600), tmp_path)


def seed(paths: CharacterPaths, *refs: Reflection, surfaced: list[SurfacedEntry] | None = None) -> None:
    atomic_write_json(paths.reflections, list(refs))
    atomic_write_json(paths.surfaced, surfaced or [])


def on_disk(paths: CharacterPaths) -> dict[str, Reflection]:
    items = msgspec.json.decode(paths.reflections.read_bytes(), type=list[Reflection])
    return {r.id: r for r in items}


def test_an_edit_is_journaled_written_at_flush_indexed_and_read_back(world: World) -> None:
    paths = world.paths
    seed(paths, Reflection(id="ref_tea", text="Master likes tea", created_at=to_iso(T0)))
    layer = world.layer()

    reply = Reply()
    layer.on_EditEntry(EditEntry(id="ref_tea", changes={"text": "  Master loves green tea "}, reply=reply))
    assert reply.result(5).entry["text"] == "Master loves green tea"
    assert on_disk(paths)["ref_tea"].text == "Master likes tea"  # one change: the view waits for its batch
    assert [e.type for e in world.journal.all_for("reflections")] == ["reflection.updated"]

    layer.flush()  # what the actor does on the supervisor's Flush
    assert on_disk(paths)["ref_tea"].text == "Master loves green tea"
    assert world.journal.unapplied_for("reflections") == []

    # Recall got the whole tier at load, then the edited entry.
    upserts = [message for child, message in world.delivered() if child == "recall" and isinstance(message, IndexUpsert)]
    assert [(u.replace_tier, [e.text for e in u.entries]) for u in upserts] == [
        ("reflection", ["Master likes tea"]),
        (None, ["Master loves green tea"]),
    ]
    assert world.layer().state.refs["ref_tea"].text == "Master loves green tea"


def test_a_feedback_result_applies_once_per_answer_and_survives_a_reload(world: World) -> None:
    paths = world.paths
    surfaced = SurfacedEntry(reflection_id="ref_tea", text="Master likes tea", surfaced_at=to_iso(T0))
    seed(paths, Reflection(id="ref_tea", text="Master likes tea", created_at=to_iso(T0)), surfaced=[surfaced])
    layer = world.layer()
    before = layer.state.refs["ref_tea"]

    answer = {"feedback": [{"reflection_id": "ref_tea", "feedback": "confirmed"}]}
    layer.on_FeedbackDone(FeedbackDone(token=1, output=answer, error=None, ids=["ref_tea"]))
    # The same answer from an overlapping call changes nothing more.
    layer.on_FeedbackDone(FeedbackDone(token=2, output=answer, error=None, ids=["ref_tea"]))

    assert [e.type for e in world.journal.all_for("reflections")] == ["reflection.evidence_updated", "reflection.surfaced"]
    after = layer.state.refs["ref_tea"]
    assert after != before
    assert [(s.reflection_id, s.feedback) for s in layer.state.surfaced] == [("ref_tea", "confirmed")]
    # Not flushed: a new layer replays the journal over the old views.
    reloaded = world.layer()
    assert reloaded.state.refs["ref_tea"] == after
    assert [(s.reflection_id, s.feedback) for s in reloaded.state.surfaced] == [("ref_tea", "confirmed")]
