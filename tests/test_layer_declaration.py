"""A layer is one declaration: a throw-away "notes" layer, declared here with one LayerSpec
and written as a thin actor over a plain layer object, is started by the supervisor, owns
its journal events, feeds recall (its entries are found by /query_memory), is listed under
/api/characters/{name}/notes and appears in the OpenAPI document, with no other change."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nekomem.actors.base import ChildActor
from nekomem.actors.handlers import handles
from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.messages import Flush, ListEntries, Message, Tick
from nekomem.actors.ports import LayerPorts
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import Address, LayerSpec, event_owners, layers, recall_tiers, register_layer
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.journal import Event
from nekomem.wire.answers import PageAnswer
from tests.support.live import LiveServer, make_settings

NAME = "Mika"
NOTES = Address("notes")


class AddNote(Message, frozen=True):
    text: str


class NoteLayer:
    """The whole layer: its notes in notes.json, journaled as note.added events."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.path = ports.ctx.paths.folder / "notes.json"
        self.notes: dict[str, str] = {}
        self.views = JournaledViews(ports, "notes", self)

    # the ViewState of JournaledViews
    def load_views(self) -> None:
        raw = self.views.read_view(self.path, default={})
        self.notes = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def write_views(self) -> None:
        atomic_write_json(self.path, self.notes)

    def apply_event(self, event: Event) -> None:
        self.notes[str(event.payload["id"])] = str(event.payload["text"])

    # the Layer protocol
    def load(self) -> None:
        self.views.load()
        self.ports.index_upsert([self._entry(i, t) for i, t in self.notes.items()], replace_tier="note")

    def flush(self) -> None:
        self.views.flush()

    def close(self) -> None:
        pass

    def due_at(self) -> float | None:
        return None

    def real_due_at(self) -> float | None:
        return self.views.real_due_at()

    def _entry(self, note_id: str, text: str) -> IndexEntry:
        return IndexEntry(id=note_id, tier="note", text=text, created_at=self.ports.now_iso())

    @handles(AddNote)
    def on_add(self, msg: AddNote) -> None:
        note_id = f"note_{len(self.notes) + 1}"
        self.views.record("note.added", {"id": note_id, "text": msg.text})
        self.ports.index_upsert([self._entry(note_id, msg.text)])
        assert msg.reply is not None
        msg.reply.ok({"id": note_id})

    @handles(ListEntries)
    def on_list(self, msg: ListEntries) -> None:
        assert msg.reply is not None
        msg.reply.ok(PageAnswer(total=len(self.notes), offset=0, items=[{"id": i, "text": t} for i, t in self.notes.items()]))

    @handles(Tick)
    def on_tick(self, msg: Tick) -> None:
        self.views.maybe_flush()


class NoteActor(ChildActor):
    child_name = "notes"

    def make_layer(self, ports: LayerPorts) -> NoteLayer:
        return NoteLayer(ports)


SPEC = LayerSpec(NOTES, f"{__name__}:NoteActor", events=("note.added",), tiers=("note",), listing="notes")


@pytest.fixture
def notes_layer() -> Iterator[None]:
    unregister = register_layer(SPEC)
    try:
        yield
    finally:
        unregister()
    assert NOTES not in [spec.address for spec in layers()]


def test_a_declared_layer_is_started_journaled_recalled_listed_and_documented(tmp_path: Path, notes_layer: None) -> None:
    assert event_owners()["note.added"] == NOTES and "note" in recall_tiers()
    with LiveServer(make_settings(tmp_path, recall_legs="bm25")) as srv:
        assert srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "hello"}]}).status_code == 200
        registry = srv.runtime.registry
        # the supervisor started it, between persona and the outbox
        described = registry.describe(NAME)
        assert described is not None
        assert described["children"].get("notes") is True
        assert list(described["children"]).index("notes") == len(described["children"]) - 2
        # its change is a journal event of its own
        assert registry.ask_sync(NAME, NOTES, lambda reply: AddNote(text="the lighthouse keeper plays the oboe", reply=reply)) == {
            "id": "note_1"
        }
        registry.ask_sync(NAME, NOTES, lambda reply: Flush(reply=reply))
        folder = tmp_path / NAME
        events = [json.loads(line) for line in (folder / "events.ndjson").read_text().splitlines() if line.strip()]
        assert [e["type"] for e in events if e["type"].startswith("note.")] == ["note.added"]
        assert json.loads((folder / "notes.json").read_text()) == {"note_1": "the lighthouse keeper plays the oboe"}
        # recall searches its tier
        hits = srv.post(f"/query_memory/{NAME}", json={"query": "lighthouse oboe"}).json().get("results", [])
        assert any("lighthouse keeper" in json.dumps(hit, ensure_ascii=False) for hit in hits), hits
        # it is listed, and documented
        listed = srv.get(f"/api/characters/{NAME}/notes")
        assert listed.status_code == 200 and listed.json()["total"] == 1
        enum = next(
            p["schema"]["enum"]
            for p in srv.get("/openapi.json").json()["paths"]["/api/characters/{name}/{layer}"]["get"]["parameters"]
            if p["name"] == "layer"
        )
        assert enum == ["recent", "facts", "reflections", "persona", "notes"]
    # a restart re-applies nothing twice and reads the view back
    with LiveServer(make_settings(tmp_path, recall_legs="bm25")) as srv:
        listed = srv.get(f"/api/characters/{NAME}/notes")
        assert listed.status_code == 200 and listed.json()["items"] == [{"id": "note_1", "text": "the lighthouse keeper plays the oboe"}]


def test_a_second_declaration_of_a_taken_name_or_event_is_refused(notes_layer: None) -> None:
    with pytest.raises(ValueError, match="already declared"):
        register_layer(SPEC)
    with pytest.raises(ValueError, match="event note.added already belongs to notes"):
        register_layer(LayerSpec(Address("other"), f"{__name__}:NoteActor", events=("note.added",)))
