"""The fact layer without its actor: FactsLayer over real LayerPorts, a real character
folder and journal, the real model pool and LLM client (against FakeLLM). The character's
supervisor is a small recording actor: with no live sibling routes, every message the
layer sends to a sibling reaches it as ``Deliver``, and a model result comes home the same
way (``Deliver(child="facts", message=ExtractDone(...))``), to be handed to the layer."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pykka
import pytest

from nekomem.actors.messages import BacklogMined, ImportFacts, OpFinished, PostTurn, RunOp
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import event_owners
from nekomem.domain.subjects import Subject
from nekomem.domain.turns import Turn
from nekomem.layers.facts.extraction import ExtractDone
from nekomem.layers.facts.layer import FactsLayer
from nekomem.layers.facts.scoped import ScopedDone
from nekomem.models.llm import LLMClient
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.protocol import Deliver
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.runtime.services import CharacterContext, Services
from nekomem.runtime.timers import Timers
from nekomem.stores.applied import SharedJournal
from nekomem.stores.fact_backlog import BACKLOG_ROWS_KEY
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_llm import FakeLLM
from tests.support.live import make_settings

NAME = "Lan"


class Siblings(pykka.ThreadingActor):
    """Stands in for the supervisor: records what the layer sends to its siblings."""

    def __init__(self, got: queue.Queue[Deliver]) -> None:
        super().__init__()
        self.got = got

    def on_receive(self, message: object) -> object:
        if isinstance(message, Deliver):
            self.got.put(message)
        return None


@dataclass
class Character:
    ctx: CharacterContext
    got: queue.Queue[Deliver]
    told_self: list[object]

    def layer(self) -> FactsLayer:
        """A fresh layer over this character's folder, loaded as its actor would."""
        layer = FactsLayer(LayerPorts(self.ctx, "facts", self.told_self.append))
        layer.load()
        return layer

    def next_for(self, child: str, timeout: float = 20.0) -> object:
        """The next message sent to sibling ``child`` (others before it are dropped)."""
        while True:
            deliver = self.got.get(timeout=timeout)
            if deliver.child == child:
                return deliver.message

    def sent(self) -> list[Deliver]:
        """Everything sent so far (a barrier first: the recorder has read its mailbox)."""
        self.ctx.supervisor.ask("barrier")
        items: list[Deliver] = []
        while not self.got.empty():
            items.append(self.got.get_nowait())
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
    clock = ManualClock()
    rt = settings.runtime
    pool = ModelPool(rt.model_workers, rt.model_queue_max, rt.model_jobs_per_character)
    dispatcher = Dispatcher(1, 1)
    services = Services(
        settings=settings,
        clock=clock,
        pool=pool,
        memory_root=tmp_path,
        dispatcher=dispatcher,
        timers=Timers(clock),
        llm=LLMClient(settings.llm),
    )
    paths = CharacterPaths(tmp_path, NAME)
    paths.root.mkdir(parents=True, exist_ok=True)
    got: queue.Queue[Deliver] = queue.Queue()
    supervisor = Siblings.start(got)
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    try:
        yield Character(CharacterContext(NAME, paths, services, journal, supervisor), got, [])
    finally:
        supervisor.stop()
        pool.shutdown()
        dispatcher.shutdown()


def test_a_backlog_record_is_extracted_through_a_typed_result_and_reported_mined(character: Character, fake_llm: FakeLLM) -> None:
    fake_llm.on(
        "extract_facts", lambda request: {"facts": [{"text": "Master grows jasmine on the balcony", "importance": 6, "entity": "master"}]}
    )
    layer = character.layer()
    turns = [Turn(role="human", text="I grow jasmine on my balcony", ts="2026-05-01T10:00:00+00:00"), Turn(role="ai", text="Lovely!")]
    payload = {"messages": [t.to_disk() for t in turns], BACKLOG_ROWS_KEY: [3, 7]}
    character.sent()  # what the load sent (ReclaimParked, the index)
    layer.on_RunOp(RunOp(op_id="op-1", op_type="extract_facts", payload=payload, attempt=1, turns=turns))

    done = character.next_for("facts")
    assert isinstance(done, ExtractDone) and done.mode == "single" and done.error is None
    layer.on_ExtractDone(done)
    layer.flush()  # what the actor does on the supervisor's Flush
    stored = json.loads(character.ctx.paths.facts.read_text(encoding="utf-8"))
    assert [f["text"] for f in stored] == ["Master grows jasmine on the balcony"]
    assert stored[0]["source_ref"] == {"kind": "turns", "from": turns[0].ts, "to": turns[0].ts}
    sent = [(d.child, d.message) for d in character.sent()]
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
    assert not character.ctx.paths.facts.exists()  # journaled, the view not written yet
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
    character.ctx.paths.facts.parent.mkdir(parents=True, exist_ok=True)
    character.ctx.paths.facts.write_text(json.dumps([good, {"id": 3, "text": None}]), encoding="utf-8")
    layer = character.layer()
    assert [(f.id, f.importance) for f in layer.store.facts.values()] == [("fact_1", 7)]
    assert list(character.ctx.paths.facts.parent.glob("facts.json.rejected-*"))
