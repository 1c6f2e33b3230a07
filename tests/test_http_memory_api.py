"""The /api/characters memory API: list, edit and delete entries of every layer (through
nekomem.client, the way a chat server or an operator script calls it)."""

from __future__ import annotations

import json

import pytest

from nekomem.client import FactImport, NekomemClient, NekomemError
from tests.support.live import LiveServer, make_settings


def refused(call, *args, **kwargs) -> tuple[int, str]:
    """(status, message) of the NekomemError a client call raises."""
    with pytest.raises(NekomemError) as error:
        call(*args, **kwargs)
    return error.value.status, error.value.message


def test_list_edit_delete_facts_and_recent(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv, NekomemClient(srv.url) as client:
        answer = client.add_facts(
            "Lan",
            [
                FactImport(text="Master likes kites", importance=4),
                FactImport(text="Master owns a red bicycle", importance=6, entity="master", event_start_at="2026-04-01T00:00:00+00:00"),
            ],
        )
        added = answer.added
        assert len(added) == 2
        again = client.add_facts("Lan", [FactImport(text="Master likes kites", importance=4)])
        assert (again.added, again.skipped_duplicates) == ([], 1)
        listing = client.entries("Lan", "facts", limit=1)
        assert listing.total == 2 and len(listing.items) == 1
        fid = added[0]
        edited = client.edit_entry("Lan", "facts", fid, text="Master loves kites", importance=7)
        assert edited["text"] == "Master loves kites"
        assert refused(client.edit_entry, "Lan", "facts", fid, importance=11)[0] == 422
        assert srv.patch(f"/api/characters/Lan/facts/{fid}", json={"colour": "blue"}).status_code == 422  # not in the client's types
        assert refused(client.edit_entry, "Lan", "facts", "fact_nope", text="x")[0] == 404
        assert client.delete_entry("Lan", "facts", added[1]) == {"deleted": added[1]}
        assert refused(client.delete_entry, "Lan", "facts", added[1])[0] == 404
        assert [f["text"] for f in client.entries("Lan", "facts").items] == ["Master loves kites"]
        # Bad imports are refused whole.
        status, message = refused(client.add_facts, "Lan", [FactImport(text="ok"), FactImport(text="")])
        assert status == 422 and "facts[1]" in message

        client.cache("Lan", [{"role": "user", "content": "helo"}, {"role": "assistant", "content": "hi"}])
        assert [i["text"] for i in client.entries("Lan", "recent").items] == ["helo", "hi"]
        client.edit_entry("Lan", "recent", "0", text="hello")
        client.delete_entry("Lan", "recent", "1")
        assert refused(client.delete_entry, "Lan", "recent", "5")[0] == 404
        assert [i["text"] for i in client.entries("Lan", "recent").items] == ["hello"]
        # What a typed client cannot send: an unknown layer, a malformed page size.
        assert srv.get("/api/characters/Lan/nolayer").status_code == 404
        assert srv.get("/api/characters/Lan/facts", params={"limit": "many"}).status_code == 400
        assert ("Lan", True) in [(c.name, c.active) for c in client.characters().characters]
    # The change went through the journal: it survives a restart.
    with LiveServer(make_settings(tmp_path)) as srv, NekomemClient(srv.url) as client:
        assert [f["text"] for f in client.entries("Lan", "facts").items] == ["Master loves kites"]
    events = [json.loads(x)["type"] for x in (tmp_path / "Lan" / "events.ndjson").read_text().splitlines()]
    # The deleted fact's events went with it (an erasure keeps only its id-only tombstone).
    assert events.count("fact.added") == 1 and "fact.updated" in events and "fact.deleted" in events


def test_edit_and_delete_reflections_and_persona(tmp_path, fake_llm):
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master enjoys windy days",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv, NekomemClient(srv.url) as client:
        places = ("beach", "park", "hill", "field", "river")
        client.add_facts("Lan", [FactImport(text=f"Master flew a kite at the {p}", importance=7) for p in places])
        reflection = client.reflect("Lan").reflection
        assert reflection is not None
        rid = reflection["id"]
        assert client.edit_entry("Lan", "reflections", rid, text="Master loves flying kites")["text"] == "Master loves flying kites"
        assert "Master loves flying kites" in client.new_dialog("Lan")
        assert refused(client.feedback, "Lan", rid, "maybe")[0] == 422
        assert refused(client.deny, "Lan", "ref_unknown")[0] == 404
        client.delete_entry("Lan", "reflections", rid)
        assert client.entries("Lan", "reflections").total == 0

        card = client.import_card("Lan", [("neko", "Lan likes fish")])["added"][0]
        assert client.edit_entry("Lan", "persona", card, text="Lan adores fish")["text"] == "Lan adores fish"
        assert "Lan adores fish" in client.new_dialog("Lan")
        client.delete_entry("Lan", "persona", card)
        assert client.persona("Lan").total == 0
