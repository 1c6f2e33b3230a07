"""The persona layer without actors nor a runtime: a PersonaLayer over FakePorts (a real
character folder and journal), driven by calling its handlers; what it sends its siblings
is read from the ports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from nekomem.actors.messages import ImportCard, ListEntries, ScrubTexts
from nekomem.config import Settings
from nekomem.domain import persona as pl
from nekomem.domain.layers import REFLECTIONS, event_owners
from nekomem.domain.records import Correction
from nekomem.layers.persona.corrections import CorrectionDone
from nekomem.layers.persona.layer import PersonaLayer
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.reply import Reply
from nekomem.stores.applied import SharedJournal
from nekomem.stores.atomic import read_json
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings

NAME = "Mio"


@dataclass
class Character:
    """One character's folder, journal and clock; every layer built over it keeps its ports."""

    settings: Settings
    root: Path
    clock: ManualClock = field(default_factory=ManualClock)
    ports: list[FakePorts] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = CharacterPaths(self.root, NAME)
        self.paths.ensure()
        self.journal = SharedJournal(self.paths.events, self.paths.events_applied, event_owners())


@pytest.fixture
def mio(tmp_path: Path) -> Character:
    # The views are written only on Flush here (a first load that reads the tokenizer can
    # take longer than view_flush_seconds), so what a load finds shows the journal.
    return Character(make_settings(tmp_path, view_flush_changes=10_000, view_flush_seconds=3_600), tmp_path)


def loaded(mio: Character) -> tuple[PersonaLayer, list[object]]:
    """A loaded layer over fresh ports, and what it posted to its own mailbox."""
    ports = FakePorts(mio.settings, mio.root, "persona", character=NAME, clock=mio.clock, journal=mio.journal)
    mio.ports.append(ports)
    layer = PersonaLayer(ports)
    layer.load()
    return layer, ports.told


def delivered(mio: Character) -> list[tuple[str, object]]:
    """Everything the layers of ``mio`` sent their siblings, in order."""
    return [item for ports in mio.ports for item in ports.sent]


def test_an_imported_entry_is_journaled_written_at_flush_and_loaded_again(mio: Character) -> None:
    layer, _posted = loaded(mio)
    reply = Reply()
    layer.on_ImportCard(ImportCard(entries=[{"entity": "neko", "text": "  Mio is a calico  "}], reply=reply))
    answer = reply.result(5)
    assert answer.skipped_existing == 0 and len(answer.added) == 1
    entry_id = answer.added[0]
    assert mio.journal.unapplied_for("persona"), "journaled before any view write"

    layer.flush()  # what the actor does on the supervisor's Flush
    on_disk, _status = read_json(mio.paths.persona, default={})
    assert "Mio is a calico" in msgspec.json.encode(on_disk).decode()
    assert mio.journal.unapplied_for("persona") == []

    again, _ = loaded(mio)
    found = again.store.find(entry_id)
    assert found is not None and found[0] == "neko" and found[1].protected and found[1].text == "Mio is a calico"
    listing = Reply()
    again.on_ListEntries(ListEntries(status="protected", reply=listing))
    assert [item["id"] for item in listing.result(5).items] == [entry_id]


def test_a_failed_correction_counts_an_attempt_backs_off_and_survives_a_reload(mio: Character) -> None:
    layer, _posted = loaded(mio)
    item = Correction(old_text="Mio dislikes fish", new_text="Mio loves fish", entity="neko", created_at="2026-01-01T00:00:00+00:00")
    layer.store.commit(pl.copy_persona(layer.store.persona), [item])
    assert layer.corrections.due_at() is not None

    layer.on_CorrectionDone(CorrectionDone(token=1, output=None, error="TimeoutError()", item=item))

    assert [c.resolve_attempts for c in layer.store.corrections] == [1]
    assert layer.corrections.gate.blocked(mio.clock.monotonic()) == "backoff"
    # Not flushed: the journal alone brings the count back.
    again, _ = loaded(mio)
    assert [c.resolve_attempts for c in again.store.corrections] == [1]


def test_scrub_texts_drops_a_quoting_correction_then_passes_the_erasure_to_the_outbox(mio: Character) -> None:
    layer, _posted = loaded(mio)
    quoting = Correction(old_text="Mio lives at 5 Elm St", new_text="Mio moved", entity="neko", created_at="2026-01-02T00:00:00+00:00")
    other = Correction(old_text="Mio is shy", new_text="Mio is bold", entity="neko", created_at="2026-01-03T00:00:00+00:00")
    layer.store.commit(pl.copy_persona(layer.store.persona), [quoting, other])
    reply = Reply()

    # A reflection's erasure passes through the persona on its way to the outbox.
    relayed = ScrubTexts(texts=["Mio lives at 5 Elm St"], origin=REFLECTIONS, kind="entries", reply_value={"deleted": "f1"}, reply=reply)
    layer.on_ScrubTexts(relayed)

    on_disk, _status = read_json(mio.paths.persona_corrections, default=[])
    assert [c["old_text"] for c in on_disk] == ["Mio is shy"]  # written at once: an erasure does not wait
    assert "5 Elm St" not in mio.paths.events.read_text(encoding="utf-8")
    passed = delivered(mio)
    assert [child for child, _ in passed] == ["outbox"]
    scrub = passed[0][1]
    assert isinstance(scrub, ScrubTexts) and scrub.texts == ["Mio lives at 5 Elm St"] and scrub.reply is reply
    assert scrub.reply_value == {"deleted": "f1"}
    assert not reply.done, "the outbox answers, once it is scrubbed too"

    untouched = ScrubTexts(texts=["nothing queued says this"], origin=REFLECTIONS, kind="entries", reply=Reply())
    layer.on_ScrubTexts(untouched)
    assert [message for _, message in delivered(mio)][1:] == [untouched]
