"""The fact layer without its actor nor a runtime: FactsLayer over FakePorts (a real
character folder and journal), its model jobs run by the test with the real LLM client
against FakeLLM, each outcome handed to the layer's handler as the actor would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nekomem.actors.messages import BacklogMined, ImportFacts, OpFinished, PostTurn, RunOp
from nekomem.config import Settings
from nekomem.domain.layers import event_owners
from nekomem.domain.subjects import Subject
from nekomem.domain.turns import Turn
from nekomem.layers.facts.extraction import ExtractDone
from nekomem.layers.facts.layer import FactsLayer
from nekomem.layers.facts.scoped import ScopedDone
from nekomem.models.llm import LLMClient
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.stores.applied import SharedJournal
from nekomem.stores.fact_backlog import BACKLOG_ROWS_KEY
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_llm import FakeLLM
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings

NAME = "Lan"


@dataclass
class Character:
    settings: Settings
    root: Path
    llm: LLMClient
    clock: ManualClock = field(default_factory=ManualClock)
    ports: list[FakePorts] = field(default_factory=list)

    @property
    def paths(self) -> CharacterPaths:
        return CharacterPaths(self.root, NAME)

    def layer(self) -> FactsLayer:
        """A fresh layer over this character's folder (a new activation: its own journal
        reader), loaded as its actor would."""
        journal = SharedJournal(self.paths.events, self.paths.events_applied, event_owners())
        ports = FakePorts(self.settings, self.root, "facts", character=NAME, clock=self.clock, journal=journal, llm=self.llm)
        self.ports.append(ports)
        layer = FactsLayer(ports)
        layer.load()
        return layer

    def sent(self) -> list[tuple[str, object]]:
        """What the newest layer sent its siblings since the last call."""
        ports = self.ports[-1]
        items, ports.sent = ports.sent, []
        return items


@pytest.fixture
def character(tmp_path: Path, fake_llm: FakeLLM) -> Iterator[Character]:
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        powerful_memory_default=False,
        # The views are written only on Flush here, so what a load finds shows the journal.
        view_flush_changes=10_000,
        view_flush_seconds=3_600,
    )
    llm = LLMClient(settings.llm)
    try:
        yield Character(settings, tmp_path, llm)
    finally:
        llm.close()


def test_a_backlog_record_is_extracted_through_a_typed_result_and_reported_mined(character: Character, fake_llm: FakeLLM) -> None:
    fake_llm.on(
        "extract_facts", lambda request: {"facts": [{"text": "Master grows jasmine on the balcony", "importance": 6, "entity": "master"}]}
    )
    layer = character.layer()
    turns = [Turn(role="human", text="I grow jasmine on my balcony", ts="2026-05-01T10:00:00+00:00"), Turn(role="ai", text="Lovely!")]
    payload = {"messages": [t.to_disk() for t in turns], BACKLOG_ROWS_KEY: [3, 7]}
    character.sent()  # what the load sent (ReclaimParked, the index)
    layer.on_RunOp(RunOp(op_id="op-1", op_type="extract_facts", payload=payload, attempt=1, turns=turns))

    [done] = character.ports[-1].run_jobs()  # the extraction, on this thread: its outcome comes home
    assert isinstance(done, ExtractDone) and done.mode == "single" and done.error is None
    layer.on_ExtractDone(done)
    layer.flush()  # what the actor does on the supervisor's Flush
    stored = json.loads(character.paths.facts.read_text(encoding="utf-8"))
    assert [f["text"] for f in stored] == ["Master grows jasmine on the balcony"]
    assert stored[0]["source_ref"] == {"kind": "turns", "from": turns[0].ts, "to": turns[0].ts}
    sent = character.sent()
    assert ("outbox", OpFinished(op_id="op-1", ok=True)) in sent
    assert ("recent", BacklogMined(row=7)) in sent
    # A backlog batch was announced when it was stored: not again.
    assert not any(isinstance(m, PostTurn) for _c, m in sent)


def test_an_import_not_yet_in_the_view_comes_back_from_the_journal(character: Character) -> None:
    first = character.layer()
    answer = Reply()
    first.on_ImportFacts(
        ImportFacts(facts=[{"text": "Master's cat is called Mochi"}, {"text": "Master's cat is called Mochi"}], reply=answer)
    )

    assert answer.result(5).skipped_duplicates == 1
    assert not character.paths.facts.exists()  # journaled, the view not written yet
    again = character.layer()
    assert [f.text for f in again.store.facts.values()] == ["Master's cat is called Mochi"]


def test_a_failed_scoped_extraction_answers_its_caller_502(character: Character) -> None:
    layer = character.layer()
    caller = Reply()
    subject = Subject(subject_kind="group_chat", subject_id="g1", scope="group")
    layer.on_ScopedDone(ScopedDone(token=1, output=None, error="TimeoutError()", subject=subject, caller=caller))

    with pytest.raises(ActorFailure) as failure:
        caller.result(5)
    assert failure.value.status == 502
    assert layer.store.facts == {}


def test_a_wake_builds_no_dedup_index_and_the_first_write_still_dedups_against_the_stored_facts(character: Character) -> None:
    first = character.layer()
    first.on_ImportFacts(ImportFacts(facts=[{"text": "Master's cat is called Mochi"}, {"text": "Master plays the cello"}], reply=Reply()))
    first.flush()

    again = character.layer()  # a wake: reads only, so no dedup keys are made
    assert again.store._dedup is None
    answer = Reply()
    again.on_ImportFacts(ImportFacts(facts=[{"text": "Master's cat is called Mochi"}, {"text": "Master lives in Osaka"}], reply=answer))
    assert answer.result(5).skipped_duplicates == 1
    assert sorted(f.text for f in again.store.facts.values()) == [
        "Master lives in Osaka",
        "Master plays the cello",
        "Master's cat is called Mochi",
    ]


def test_a_view_with_one_bad_record_is_read_record_by_record_and_the_bad_one_kept_aside(character: Character) -> None:
    good = {"id": "fact_1", "text": "Master plays the cello", "importance": "7"}  # lax: "7" reads as 7
    character.paths.facts.parent.mkdir(parents=True, exist_ok=True)
    character.paths.facts.write_text(json.dumps([good, {"id": 3, "text": None}]), encoding="utf-8")
    layer = character.layer()
    assert [(f.id, f.importance) for f in layer.store.facts.values()] == [("fact_1", 7)]
    assert list(character.paths.facts.parent.glob("facts.json.rejected-*"))
