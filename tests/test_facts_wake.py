"""A character waking with a long memory reads its facts only when a message needs them:
the first /query_memory is answered from the facts' recall segment while facts.json stays
undecoded by the fact layer; a write, a listing or an erasure reads them first and then
behaves as before. Live servers over a real root; the fact layer's reads are observed by a
spy on the one function that decodes its views (``read_records`` as the fact store calls
it), and the layer-level tests drive FactsLayer over FakePorts."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nekomem.actors.messages import ImportFacts, IndexUpsert, RequestIndex, Tick
from nekomem.domain.layers import event_owners
from nekomem.layers.facts import state as fact_state
from nekomem.layers.facts.layer import FactsLayer
from nekomem.models.embeddings import EmbeddingService
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.reply import Reply
from nekomem.stores.applied import SharedJournal
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_ports import FakePorts
from tests.support.live import LiveServer, make_settings

NAME = "Lan"
HOBBIES = ["green tea", "the cello", "old jazz records", "rye bread", "chess", "river walks", "kites", "ramen", "origami"]
TEXTS = [f"Master loves {h} (note {i})" for i in range(4) for h in HOBBIES]


def _spy_fact_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the views the fact store decodes from now on (in every server of this
    process: the spy replaces the function its load calls)."""
    reads: list[str] = []
    real: Callable[..., Any] = fact_state.read_records

    def spy(path: Path, *args: Any, **kwargs: Any) -> Any:
        reads.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fact_state, "read_records", spy)
    return reads


def _serve(root: Path) -> LiveServer:
    settings = make_settings(root, embedding_enabled=False)
    return LiveServer(settings, embeddings=EmbeddingService(settings.embeddings))


def _found(srv: LiveServer, query: str) -> list[str]:
    r = srv.post(f"/query_memory/{NAME}", json={"query": query})
    assert r.status_code == 200, r.text
    return [row["text"] for row in r.json()["results"]]


def holders(root: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def test_a_woken_memory_answers_its_first_query_without_reading_its_facts_and_a_write_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _serve(tmp_path) as srv:
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in TEXTS]})
        assert r.status_code == 200 and len(r.json()["added"]) == len(TEXTS), r.text
        before = {q: _found(srv, q) for q in ("cello", "rye bread", "origami kites")}
    assert CharacterPaths(tmp_path, NAME).recall_segment.exists()
    reads = _spy_fact_reads(monkeypatch)

    with _serve(tmp_path) as srv:
        assert {q: _found(srv, q) for q in before} == before  # the first query, from the segment
        assert srv.get(f"/new_dialog/{NAME}").status_code == 200
        assert _found(srv, "jazz")
        assert reads == []  # the fact layer has not decoded facts.json

        # A write needs the facts: they are read once, then it dedups against them.
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": TEXTS[1]}, {"text": "Master bought a red kite in Kobe"}]})
        assert r.status_code == 200, r.text
        assert r.json()["skipped_duplicates"] == 1 and len(r.json()["added"]) == 1
        assert reads == ["facts.json", "facts_archive.json"]
        assert srv.get(f"/api/characters/{NAME}/facts", params={"limit": 1}).json()["total"] == len(TEXTS) + 1
        assert _found(srv, "red kite Kobe")[0] == "Master bought a red kite in Kobe"
        assert {q: _found(srv, q) for q in before} == before
        assert reads == ["facts.json", "facts_archive.json"]  # once

    reads.clear()
    with _serve(tmp_path) as srv:  # the change is in the segment written at stop
        assert _found(srv, "red kite Kobe")[0] == "Master bought a red kite in Kobe"
        assert reads == []


def test_a_fact_forgotten_first_thing_after_a_wake_leaves_no_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "Master keeps the spare key under the FACTZ9Q1 rock"
    with _serve(tmp_path) as srv:
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in [*TEXTS, secret]]})
        secret_id = r.json()["added"][-1]
    reads = _spy_fact_reads(monkeypatch)
    with _serve(tmp_path) as srv:
        assert _found(srv, "FACTZ9Q1 rock")[0] == secret  # answered from the segment's rows
        assert reads == []
        r = srv.delete(f"/api/characters/{NAME}/facts/{secret_id}")  # the facts are read, then erased
        assert r.status_code == 200, r.text
        assert reads[:1] == ["facts.json"]
        assert secret not in _found(srv, "FACTZ9Q1 rock")
        assert holders(tmp_path, "FACTZ9Q1") == []
    assert holders(tmp_path, "FACTZ9Q1") == []
    with _serve(tmp_path) as srv:
        assert secret not in _found(srv, "FACTZ9Q1 rock")


# -- the layer over FakePorts --------------------------------------------------------------
def _layer(root: Path, clock: ManualClock) -> tuple[FactsLayer, FakePorts]:
    settings = make_settings(root, embedding_enabled=False, powerful_memory_default=False)
    paths = CharacterPaths(root, NAME)
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    ports = FakePorts(settings, root, "facts", character=NAME, clock=clock, journal=journal)
    layer = FactsLayer(ports)
    layer.load()
    return layer, ports


def _stored(root: Path, texts: list[str]) -> None:
    layer, _ports = _layer(root, ManualClock())
    layer.on_ImportFacts(ImportFacts(facts=[{"text": t} for t in texts], reply=Reply()))
    layer.flush()


def test_the_timers_of_an_unread_fact_layer_do_not_read_its_facts_before_a_synthesis_is_due(tmp_path: Path) -> None:
    _stored(tmp_path, TEXTS)
    clock = ManualClock()
    layer, ports = _layer(tmp_path, clock)
    assert layer.store.loads == 0
    synthesis = ports.settings.longterm.reflection_synthesis_initial_delay_seconds
    # Nothing due before the synthesis pass: no archive check "at once" on unread facts.
    assert layer.due_at() == pytest.approx(clock.monotonic() + synthesis)
    layer.on_Tick(Tick(monotonic=clock.monotonic()))
    clock.advance(synthesis / 2)
    layer.on_Tick(Tick(monotonic=clock.monotonic()))
    layer.flush()
    assert layer.store.loads == 0 and not any(isinstance(m, IndexUpsert) for _c, m in ports.sent)

    clock.advance(synthesis)  # the synthesis pass picks its batch from the facts: read now
    layer.on_Tick(Tick(monotonic=clock.monotonic()))
    assert layer.store.loads == 1
    # Read, the archive check ran in the same tick, as it ran at a start that read them.
    assert layer.store.last_archive_at == clock.now()


def test_recall_asking_for_the_facts_reads_them_once_and_a_wake_request_after_a_read_sends_nothing_more(tmp_path: Path) -> None:
    _stored(tmp_path, TEXTS)
    layer, ports = _layer(tmp_path, ManualClock())

    def feeds() -> int:
        return sum(1 for _c, m in ports.sent if isinstance(m, IndexUpsert) and m.replace_tier == "fact")

    layer.on_RequestIndex(RequestIndex(wake=True))
    assert layer.store.loads == 1 and feeds() == 1
    assert {e.text for _c, m in ports.sent if isinstance(m, IndexUpsert) for e in m.entries} == set(TEXTS)
    layer.on_RequestIndex(RequestIndex(wake=True))  # already read: its read fed recall
    assert feeds() == 1
    layer.on_RequestIndex(RequestIndex())  # a restarted recall lost its index: sent again
    assert layer.store.loads == 1 and feeds() == 2


def test_views_behind_the_journal_are_read_and_repaired_at_wake(tmp_path: Path) -> None:
    first, _ports = _layer(tmp_path, ManualClock())
    first.on_ImportFacts(ImportFacts(facts=[{"text": t} for t in TEXTS[:3]], reply=Reply()))
    facts = CharacterPaths(tmp_path, NAME).facts
    assert not facts.exists()  # journaled only: a crash before the view's rewrite

    again, _ports = _layer(tmp_path, ManualClock())
    assert again.store.loads == 1  # at wake, not on first use
    assert sorted(f["text"] for f in json.loads(facts.read_bytes())) == sorted(TEXTS[:3])


def test_a_feed_recall_asked_for_is_read_again_by_the_reload_after_a_storage_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stored(tmp_path, TEXTS)
    layer, ports = _layer(tmp_path, ManualClock())
    real = fact_state.read_records

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "I/O error")  # a failing disk: nothing real produces it on demand

    monkeypatch.setattr(fact_state, "read_records", failing)
    with pytest.raises(OSError):
        layer.on_RequestIndex(RequestIndex(wake=True))
    assert layer.store.loads == 0 and not layer.store.loaded
    monkeypatch.setattr(fact_state, "read_records", real)
    layer.close()
    layer.load()  # what the actor does after a storage fault (a reload reads at once): the request is not lost
    assert layer.store.loads == 1
    assert any(isinstance(m, IndexUpsert) and m.replace_tier == "fact" and len(m.entries) == len(TEXTS) for _c, m in ports.sent)
