"""The reflections layer as a plain object: no ReflectionActor, its handlers called directly.

The layer runs over real ports (a real CharacterContext and Services over a temporary
memory root); its messages to siblings go through the context, i.e. to the supervisor,
which here is a small actor recording what it receives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec
import pykka
import pytest

from nekomem.actors.messages import EditEntry, IndexUpsert
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import event_owners
from nekomem.domain.records import Reflection, SurfacedEntry, to_iso
from nekomem.layers.reflections.evidence import FeedbackDone
from nekomem.layers.reflections.layer import ReflectionLayer
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.protocol import Deliver
from nekomem.runtime.reply import Reply
from nekomem.runtime.services import CharacterContext, Services
from nekomem.runtime.timers import Timers
from nekomem.stores.applied import SharedJournal
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths
from tests.support.live import make_settings

NAME = "Lan"
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)


class Recorder(pykka.ThreadingActor):
    """Stands in for the character's supervisor: keeps every message it is told."""

    def __init__(self, seen: list[object]) -> None:
        super().__init__()
        self.seen = seen

    def on_receive(self, message: object) -> None:
        self.seen.append(message)


@dataclass
class World:
    ctx: CharacterContext
    seen: list[object]
    told: list[object]  # what the layer posted to its own mailbox

    def layer(self) -> ReflectionLayer:
        """A fresh layer over these files, loaded (as a restarted actor would be)."""
        layer = ReflectionLayer(LayerPorts(self.ctx, "reflections", self.told.append))
        layer.load()
        return layer

    def delivered(self) -> list[Deliver]:
        """What reached the supervisor so far (waits until it handled everything told before)."""
        self.ctx.supervisor.ask(_Barrier(), timeout=5)
        return [m for m in self.seen if isinstance(m, Deliver)]


class _Barrier:
    pass


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    settings = make_settings(tmp_path)
    clock = ManualClock(T0)
    rt = settings.runtime
    services = Services(
        settings=settings,
        clock=clock,
        pool=ModelPool(1, rt.model_queue_max, rt.model_jobs_per_character),
        memory_root=tmp_path,
        dispatcher=Dispatcher(1, 1),
        timers=Timers(clock),
    )
    paths = CharacterPaths(tmp_path, NAME)
    paths.ensure()
    seen: list[object] = []
    supervisor = Recorder.start(seen)
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    ctx = CharacterContext(name=NAME, paths=paths, services=services, journal=journal, supervisor=supervisor)
    try:
        yield World(ctx, seen, [])
    finally:
        supervisor.stop()
        services.dispatcher.shutdown()
        services.pool.shutdown()


def seed(paths: CharacterPaths, *refs: Reflection, surfaced: list[SurfacedEntry] | None = None) -> None:
    atomic_write_json(paths.reflections, list(refs))
    atomic_write_json(paths.surfaced, surfaced or [])


def on_disk(paths: CharacterPaths) -> dict[str, Reflection]:
    items = msgspec.json.decode(paths.reflections.read_bytes(), type=list[Reflection])
    return {r.id: r for r in items}


def test_an_edit_is_journaled_written_at_flush_indexed_and_read_back(world: World) -> None:
    paths = world.ctx.paths
    seed(paths, Reflection(id="ref_tea", text="Master likes tea", created_at=to_iso(T0)))
    layer = world.layer()

    reply = Reply()
    layer.on_EditEntry(EditEntry(id="ref_tea", changes={"text": "  Master loves green tea "}, reply=reply))
    assert reply.result(5).entry["text"] == "Master loves green tea"
    assert on_disk(paths)["ref_tea"].text == "Master likes tea"  # one change: the view waits for its batch
    assert [e.type for e in world.ctx.journal.all_for("reflections")] == ["reflection.updated"]

    layer.flush()  # what the actor does on the supervisor's Flush
    assert on_disk(paths)["ref_tea"].text == "Master loves green tea"
    assert world.ctx.journal.unapplied_for("reflections") == []

    # Recall got the whole tier at load, then the edited entry.
    upserts = [d.message for d in world.delivered() if d.child == "recall" and isinstance(d.message, IndexUpsert)]
    assert [(u.replace_tier, [e.text for e in u.entries]) for u in upserts] == [
        ("reflection", ["Master likes tea"]),
        (None, ["Master loves green tea"]),
    ]
    assert world.layer().state.refs["ref_tea"].text == "Master loves green tea"


def test_a_feedback_result_applies_once_per_answer_and_survives_a_reload(world: World) -> None:
    paths = world.ctx.paths
    surfaced = SurfacedEntry(reflection_id="ref_tea", text="Master likes tea", surfaced_at=to_iso(T0))
    seed(paths, Reflection(id="ref_tea", text="Master likes tea", created_at=to_iso(T0)), surfaced=[surfaced])
    layer = world.layer()
    before = layer.state.refs["ref_tea"]

    answer = {"feedback": [{"reflection_id": "ref_tea", "feedback": "confirmed"}]}
    layer.on_FeedbackDone(FeedbackDone(token=1, output=answer, error=None, ids=["ref_tea"]))
    # The same answer from an overlapping call changes nothing more.
    layer.on_FeedbackDone(FeedbackDone(token=2, output=answer, error=None, ids=["ref_tea"]))

    assert [e.type for e in world.ctx.journal.all_for("reflections")] == ["reflection.evidence_updated", "reflection.surfaced"]
    after = layer.state.refs["ref_tea"]
    assert after != before
    assert [(s.reflection_id, s.feedback) for s in layer.state.surfaced] == [("ref_tea", "confirmed")]
    # Not flushed: a new layer replays the journal over the old views.
    reloaded = world.layer()
    assert reloaded.state.refs["ref_tea"] == after
    assert [(s.reflection_id, s.feedback) for s in reloaded.state.surfaced] == [("ref_tea", "confirmed")]
