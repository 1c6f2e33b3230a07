"""The persona layer without actors: a PersonaLayer over LayerPorts of a real
CharacterContext, driven by calling its handlers. Siblings are reached through the
context's supervisor, here a small actor that records what it is handed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pykka
import pytest

from nekomem.actors.messages import ImportCard, ListEntries, ScrubTexts
from nekomem.actors.ports import LayerPorts
from nekomem.domain import persona as pl
from nekomem.domain.layers import event_owners
from nekomem.domain.records import Correction
from nekomem.layers.persona.corrections import CorrectionDone
from nekomem.layers.persona.layer import PersonaLayer
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.protocol import Deliver
from nekomem.runtime.reply import Reply
from nekomem.runtime.services import CharacterContext, Services
from nekomem.runtime.timers import Timers
from nekomem.stores.applied import SharedJournal
from nekomem.stores.atomic import read_json
from nekomem.stores.layout import CharacterPaths
from tests.support.live import make_settings

NAME = "Mio"


class Recorder(pykka.ThreadingActor):
    """Stands in for the character's supervisor: keeps every message it is told; asked
    "got", answers them (after every earlier tell, as a mailbox is in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[object] = []

    def on_receive(self, message: object) -> object:
        if message == "got":
            return list(self.got)
        self.got.append(message)
        return None


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[CharacterContext]:
    settings = make_settings(tmp_path)
    clock = ManualClock()
    dispatcher = Dispatcher(1, 1)
    pool = ModelPool(1, 4, 1)
    services = Services(settings=settings, clock=clock, pool=pool, memory_root=tmp_path, dispatcher=dispatcher, timers=Timers(clock))
    paths = CharacterPaths(tmp_path, NAME)
    paths.ensure()
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    supervisor = Recorder.start()
    try:
        yield CharacterContext(name=NAME, paths=paths, services=services, journal=journal, supervisor=supervisor)
    finally:
        supervisor.stop()
        pool.shutdown()
        dispatcher.shutdown()


def loaded(ctx: CharacterContext) -> tuple[PersonaLayer, list[object]]:
    """A loaded layer over fresh ports, and what it posted to its own mailbox."""
    posted: list[object] = []
    layer = PersonaLayer(LayerPorts(ctx, "persona", posted.append))
    layer.load()
    return layer, posted


def delivered(ctx: CharacterContext) -> list[Deliver]:
    got = ctx.supervisor.ask("got")
    assert isinstance(got, list)
    return [m for m in got if isinstance(m, Deliver)]


def test_an_imported_entry_is_journaled_written_at_flush_and_loaded_again(ctx: CharacterContext) -> None:
    layer, _posted = loaded(ctx)
    reply = Reply()
    layer.on_ImportCard(ImportCard(entries=[{"entity": "neko", "text": "  Mio is a calico  "}], reply=reply))
    answer = reply.result(5)
    assert answer.skipped_existing == 0 and len(answer.added) == 1
    entry_id = answer.added[0]
    assert ctx.journal.unapplied_for("persona"), "journaled before any view write"

    layer.flush()  # what the actor does on the supervisor's Flush
    on_disk, _status = read_json(ctx.paths.persona, default={})
    assert "Mio is a calico" in msgspec.json.encode(on_disk).decode()
    assert ctx.journal.unapplied_for("persona") == []

    again, _ = loaded(ctx)
    found = again.store.find(entry_id)
    assert found is not None and found[0] == "neko" and found[1].protected and found[1].text == "Mio is a calico"
    listing = Reply()
    again.on_ListEntries(ListEntries(status="protected", reply=listing))
    assert [item["id"] for item in listing.result(5).items] == [entry_id]


def test_a_failed_correction_counts_an_attempt_backs_off_and_survives_a_reload(ctx: CharacterContext) -> None:
    layer, _posted = loaded(ctx)
    item = Correction(old_text="Mio dislikes fish", new_text="Mio loves fish", entity="neko", created_at="2026-01-01T00:00:00+00:00")
    layer.store.commit(pl.copy_persona(layer.store.persona), [item])
    assert layer.corrections.due_at() is not None

    layer.on_CorrectionDone(CorrectionDone(token=1, output=None, error="TimeoutError()", item=item))

    assert [c.resolve_attempts for c in layer.store.corrections] == [1]
    assert layer.corrections.gate.blocked(ctx.clock.monotonic()) == "backoff"
    # Not flushed: the journal alone brings the count back.
    again, _ = loaded(ctx)
    assert [c.resolve_attempts for c in again.store.corrections] == [1]


def test_scrub_texts_drops_a_quoting_correction_then_passes_the_erasure_to_the_outbox(ctx: CharacterContext) -> None:
    layer, _posted = loaded(ctx)
    quoting = Correction(old_text="Mio lives at 5 Elm St", new_text="Mio moved", entity="neko", created_at="2026-01-02T00:00:00+00:00")
    other = Correction(old_text="Mio is shy", new_text="Mio is bold", entity="neko", created_at="2026-01-03T00:00:00+00:00")
    layer.store.commit(pl.copy_persona(layer.store.persona), [quoting, other])
    reply = Reply()

    layer.on_ScrubTexts(ScrubTexts(texts=["Mio lives at 5 Elm St"], reply_value={"deleted": "f1"}, reply=reply))

    on_disk, _status = read_json(ctx.paths.persona_corrections, default=[])
    assert [c["old_text"] for c in on_disk] == ["Mio is shy"]  # written at once: an erasure does not wait
    assert "5 Elm St" not in ctx.paths.events.read_text(encoding="utf-8")
    passed = delivered(ctx)
    assert [d.child for d in passed] == ["outbox"]
    scrub = passed[0].message
    assert isinstance(scrub, ScrubTexts) and scrub.texts == ["Mio lives at 5 Elm St"] and scrub.reply is reply
    assert scrub.reply_value == {"deleted": "f1"}
    assert not reply.done, "the outbox answers, once it is scrubbed too"

    untouched = ScrubTexts(texts=["nothing queued says this"], reply=Reply())
    layer.on_ScrubTexts(untouched)
    assert [d.message for d in delivered(ctx)][1:] == [untouched]
