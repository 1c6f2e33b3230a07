"""A layer is one folder and one declaration: a throw-away "notes" layer, declared here with
one LayerSpec and written as a thin actor over a plain layer object, gets from that
declaration alone everything a real layer has: the supervisor starts it, its file makes a
folder a character, its typed journal event is journaled and replayed after a restart, it
takes part in the erasure relay (a forgotten turn leaves no byte of its text in the root),
its counts are in the memory browser's character list (live and from disk), `nekomem
delete --note` forgets one of its entries, the importer's report has its row, recall
searches its tier, its setting is loaded like any other, /new_dialog carries its block,
and /openapi.json lists it. Nothing else in the tree changes."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
import pytest

from nekomem.actors.base import ChildActor
from nekomem.actors.handlers import handles
from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.messages import (
    CountEntries,
    DeleteEntry,
    EntryCounts,
    Flush,
    ListEntries,
    Message,
    RenderBlock,
    ScrubTexts,
    Tick,
)
from nekomem.actors.ports import LayerPorts
from nekomem.cli import main as cli
from nekomem.config import settings_markdown
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import (
    Address,
    CharacterFolder,
    Count,
    ForgetFlag,
    JournalEvent,
    LayerSpec,
    character_files,
    event_owners,
    layer_settings,
    layers,
    recall_tiers,
    register_layer,
)
from nekomem.importer.report import CharacterReport
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import list_characters
from nekomem.wire.answers import DeleteAnswer, PageAnswer
from tests.support.live import LiveServer, make_settings

NAME = "Mika"
NOTES = Address("notes")
NOTES_FILE = "notes.json"
SAID = "the keeper plays the oboe"


class AddNote(Message, frozen=True):
    text: str


class NoteSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The layer's own settings section ([notes] in the TOML file)."""

    note_max_chars: Annotated[int, msgspec.Meta(ge=1, description="Longest note kept; a longer one is cut there.")] = 500


class NoteAdded(JournalEvent, frozen=True, kw_only=True):
    type: ClassVar[str] = "note.added"
    id: str
    text: str


class NoteDeleted(JournalEvent, frozen=True, kw_only=True):
    type: ClassVar[str] = "note.deleted"
    id: str


class NoteLayer:
    """The whole layer: its notes in notes.json, journaled as typed note.* events; a note
    quoting a forgotten turn goes with it."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.path = ports.paths.folder / NOTES_FILE
        self.notes: dict[str, str] = {}
        self.views = JournaledViews(ports, NOTES, self)

    # the ViewState of JournaledViews
    def load_views(self) -> None:
        raw = self.views.read_view(self.path, default={})
        self.notes = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def write_views(self) -> None:
        atomic_write_json(self.path, self.notes)

    def apply_event(self, event: JournalEvent) -> None:
        match event:
            case NoteAdded(id=note_id, text=text):
                self.notes[note_id] = text
            case NoteDeleted(id=note_id):
                self.notes.pop(note_id, None)

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
        text = msg.text[: self.ports.settings.section(NOTES, NoteSettings).note_max_chars]
        self.views.record_event(NoteAdded(id=note_id, text=text))
        self.ports.index_upsert([self._entry(note_id, text)])
        assert msg.reply is not None
        msg.reply.ok({"id": note_id})

    @handles(ListEntries)
    def on_list(self, msg: ListEntries) -> None:
        assert msg.reply is not None
        msg.reply.ok(PageAnswer(total=len(self.notes), offset=0, items=[{"id": i, "text": t} for i, t in self.notes.items()]))

    @handles(CountEntries)
    def on_count(self, msg: CountEntries) -> None:
        assert msg.reply is not None
        msg.reply.ok(EntryCounts({"notes": len(self.notes)}))

    @handles(DeleteEntry)
    def on_delete(self, msg: DeleteEntry) -> None:
        text = self.notes.get(msg.id)
        if text is None:
            raise ActorFailure("not_found", f"no note {msg.id}", 404)
        self.views.record_event(NoteDeleted(id=msg.id))
        self.views.erase([msg.id], [text], None, msg.reply, DeleteAnswer(deleted=msg.id))

    @handles(ScrubTexts)
    def on_scrub(self, msg: ScrubTexts) -> None:
        """The erasure hook: notes quoting a forgotten turn go, and the relay goes on."""
        quoted = [i for i, t in self.notes.items() if t in msg.texts]
        for note_id in quoted:
            self.views.record_event(NoteDeleted(id=note_id))
        self.views.erase(quoted, msg.texts, None, msg.reply, msg.reply_value, relay=msg)

    @handles(RenderBlock)
    def on_render(self, msg: RenderBlock) -> None:
        assert msg.reply is not None
        msg.reply.ok("## Notes\n" + "\n".join(f"- {text}" for text in self.notes.values()) if self.notes else "")

    @handles(Tick)
    def on_tick(self, msg: Tick) -> None:
        self.views.maybe_flush()


class NoteActor(ChildActor):
    child_name = "notes"

    def make_layer(self, ports: LayerPorts) -> NoteLayer:
        return NoteLayer(ports)


def note_counts(paths: CharacterFolder) -> dict[str, Count]:
    try:
        return {"notes": len(json.loads((paths.folder / NOTES_FILE).read_text()))}
    except (OSError, ValueError):
        return {"notes": 0}


SPEC = LayerSpec(
    NOTES,
    f"{__name__}:NoteActor",
    files=(NOTES_FILE,),
    events=(NoteAdded, NoteDeleted),
    tiers=("note",),
    listing="notes",
    scrubs=("turns",),
    counts=("notes",),
    disk_counts=note_counts,
    forget=ForgetFlag("note", "note"),
    import_counts=("notes",),
    settings=NoteSettings,
    render=True,
)


@pytest.fixture
def notes_layer() -> Iterator[None]:
    unregister = register_layer(SPEC)
    try:
        yield
    finally:
        unregister()
    assert NOTES not in [spec.address for spec in layers()]


def holders(root: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = cli.main(list(argv))
    return status, out.getvalue()


def browse_row(srv: LiveServer) -> dict[str, object]:
    rows = srv.get("/api/browse/characters").json()["characters"]
    return next(row for row in rows if row["name"] == NAME)


def test_a_declared_layer_gets_everything_from_its_declaration(tmp_path: Path, notes_layer: None) -> None:
    assert event_owners()["note.added"] == NOTES and "note" in recall_tiers() and NOTES_FILE in character_files()
    # the importer's report has its row
    assert "notes" in CharacterReport(name=NAME).layers
    settings = make_settings(tmp_path, recall_legs="bm25", note_max_chars=26)
    assert settings.section(NOTES, NoteSettings).note_max_chars == 26  # its setting, loaded as any other
    assert "NEKOMEM_NOTE_MAX_CHARS" in settings_markdown(layer_settings())
    folder = tmp_path / NAME
    with LiveServer(settings) as srv:
        registry = srv.runtime.registry
        # its file alone makes a folder a character
        folder.mkdir()
        atomic_write_json(folder / NOTES_FILE, {})
        assert list_characters(tmp_path) == [NAME]
        assert srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": SAID}]}).status_code == 200
        # the supervisor started it, between persona and the outbox
        described = registry.describe(NAME)
        assert described is not None
        assert described["children"].get("notes") is True
        assert list(described["children"]).index("notes") == len(described["children"]) - 2
        # its change is a typed journal event of its own
        for text in (SAID, "the ferry leaves at nine", "the tide tables are pinned by the door"):
            registry.ask_sync(NAME, NOTES, lambda reply, text=text: AddNote(text=text, reply=reply))
        registry.ask_sync(NAME, NOTES, lambda reply: Flush(reply=reply))
        events = [json.loads(line) for line in (folder / "events.ndjson").read_text().splitlines() if line.strip()]
        assert [e["payload"] for e in events if e["type"] == "note.added"] == [
            {"id": "note_1", "text": SAID},
            {"id": "note_2", "text": "the ferry leaves at nine"},
            {"id": "note_3", "text": "the tide tables are pinned"},  # its setting cut it (note_max_chars=26)
        ]
        # recall searches its tier
        hits = srv.post(f"/query_memory/{NAME}", json={"query": "ferry nine"}).json().get("results", [])
        assert any("ferry leaves" in json.dumps(hit, ensure_ascii=False) for hit in hits), hits
        # its block is in the working context
        context = srv.get(f"/new_dialog/{NAME}").text
        assert f"## Notes\n- {SAID}\n- the ferry leaves at nine\n- the tide tables are pinned" in context, context
        # the browser counts it (asked of the live actor)
        assert browse_row(srv)["counts"]["notes"] == 3  # type: ignore[index]
        # `nekomem delete --note` forgets one of its entries, through the server
        status, said = run_cli("delete", NAME, "--note", "note_2", "--url", srv.url, "--yes")
        assert status == 0 and said.strip() == f"forgot notes entry note_2 of {NAME}", said
        assert holders(tmp_path, "ferry leaves") == []
        # listed, and documented
        assert srv.get(f"/api/characters/{NAME}/notes").json()["total"] == 2
        enum = next(
            p["schema"]["enum"]
            for p in srv.get("/openapi.json").json()["paths"]["/api/characters/{name}/{layer}"]["get"]["parameters"]
            if p["name"] == "layer"
        )
        assert enum == ["recent", "facts", "reflections", "persona", "notes"]
    # restarted, the character is passive: the browser counts it from its file
    with LiveServer(settings) as srv:
        row = browse_row(srv)
        assert row["active"] is False and row["counts"]["notes"] == 2  # type: ignore[index]
    # a view lost behind its applied mark: replay applies its typed event again
    atomic_write_json(folder / NOTES_FILE, {})
    applied = json.loads((folder / "events_applied.json").read_text())
    del applied["owners"]["notes"]
    (folder / "events_applied.json").write_text(json.dumps(applied))
    with LiveServer(settings) as srv:
        listed = srv.get(f"/api/characters/{NAME}/notes").json()
        assert listed["items"] == [{"id": "note_1", "text": SAID}, {"id": "note_3", "text": "the tide tables are pinned"}]
        # the erasure relay passes through it: forgetting the turn erases the note quoting it
        rows = srv.get(f"/api/browse/{NAME}/journal").json()["items"]
        row_id = next(r["id"] for r in rows if r["text"] == SAID)
        forgotten = srv.client.delete(f"/api/characters/{NAME}/turns/{row_id}")
        assert forgotten.status_code == 200, forgotten.text
        assert srv.get(f"/api/characters/{NAME}/notes").json()["items"] == [{"id": "note_3", "text": "the tide tables are pinned"}]
        assert holders(tmp_path, SAID) == []


def test_a_second_declaration_of_a_taken_name_event_or_file_is_refused(notes_layer: None) -> None:
    with pytest.raises(ValueError, match="already declared"):
        register_layer(SPEC)
    with pytest.raises(ValueError, match="event note.added already belongs to notes"):
        register_layer(LayerSpec(Address("other"), f"{__name__}:NoteActor", events=(NoteAdded,)))
    with pytest.raises(ValueError, match="file facts.json already belongs to facts"):
        register_layer(LayerSpec(Address("other"), f"{__name__}:NoteActor", files=("facts.json",)))


def test_every_event_of_a_declaration_decodes_its_payload_typed() -> None:
    from nekomem.domain.layers import decode_event

    event = decode_event("fact.archived", {"ids": ["f1", "f2"]})
    assert type(event).__name__ == "FactArchived" and msgspec.structs.asdict(event) == {"ids": ["f1", "f2"]}
    with pytest.raises(msgspec.ValidationError):
        decode_event("persona.entry_deleted", {})
