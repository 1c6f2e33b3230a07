"""The recent window layer on its own: a RecentLayer over FakePorts and a real character
folder, driven by calling its handlers (no RecentActor, no runtime, no server). What the
layer sends its siblings is read from the ports; its model jobs run when the test says."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from nekomem.actors.messages import AppendTurns, CompressDone, GetRecent, OutboxAck, PostTurn, RecentView
from nekomem.config import Settings
from nekomem.domain.layers import event_owners
from nekomem.domain.turns import Role, Turn
from nekomem.layers.recent.layer import RecentLayer
from nekomem.models.llm import LLMClient
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.reply import Reply
from nekomem.stores.applied import SharedJournal
from nekomem.stores.layout import CharacterPaths
from nekomem.wire.answers import WriteAnswer
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings

NAME = "Lan"
T = TypeVar("T")


@dataclass
class Character:
    """One character's folder, journal and clock; the layers built over it keep their ports."""

    settings: Settings
    root: Path
    llm: LLMClient | None = None
    clock: ManualClock = field(default_factory=ManualClock)
    ports: list[FakePorts] = field(default_factory=list)
    seen: int = 0  # messages of ``sent()`` already looked at by ``delivered``

    def __post_init__(self) -> None:
        self.paths = CharacterPaths(self.root, NAME)
        self.paths.ensure()
        self.journal = SharedJournal(self.paths.events, self.paths.events_applied, event_owners())

    def sent(self) -> list[tuple[str, object]]:
        return [item for ports in self.ports for item in ports.sent]


@contextlib.contextmanager
def character(root: Path, **overrides: object) -> Iterator[Character]:
    """A character over ``root``; with ``llm_base_url`` among ``overrides`` its model jobs
    run against that endpoint, else it has no model (post-turn work is then announced, not
    enqueued)."""
    settings = make_settings(root, **overrides)
    llm = LLMClient(settings.llm) if "llm_base_url" in overrides else None
    try:
        yield Character(settings, root, llm)
    finally:
        if llm is not None:
            llm.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Character]:
    with character(tmp_path) as made:
        yield made


def layer_of(ch: Character) -> RecentLayer:
    ports = FakePorts(ch.settings, ch.root, "recent", character=NAME, clock=ch.clock, journal=ch.journal, llm=ch.llm)
    ch.ports.append(ports)
    layer = RecentLayer(ports)
    layer.load()
    return layer


def delivered(ch: Character, child: str, kind: type[T]) -> T:
    """The next message of type ``kind`` the layer sent to sibling ``child`` (the ones
    before it are passed over); fails when there is none."""
    sent = ch.sent()
    while ch.seen < len(sent):
        to, message = sent[ch.seen]
        ch.seen += 1
        if to == child and isinstance(message, kind):
            return message
    raise AssertionError(f"no {kind.__name__} sent to {child}")


def view_of(layer: RecentLayer) -> RecentView:
    reply = Reply()
    layer.on_GetRecent(GetRecent(reply=reply))
    view = reply.result(5)
    assert isinstance(view, RecentView)
    return view


def turn(text: str, role: Role = "human") -> Turn:
    return Turn(role=role, text=text, ts="2026-06-01T10:00:00+00:00")


def test_a_cached_turn_is_rebuilt_from_the_journal_when_recent_json_is_lost(world) -> None:
    ch = world
    layer = layer_of(ch)
    reply = Reply()
    layer.on_AppendTurns(AppendTurns(turns=[turn("my cat is called Mochi")], mode="cache", session_id="s1", reply=reply))
    assert reply.result(5) == WriteAnswer(status="cached", count=1)
    # No model can extract facts: the stored turn is announced to the reflections at once.
    announced = delivered(ch, "reflections", PostTurn)
    assert [t.text for t in announced.turns] == ["my cat is called Mochi"]
    layer.close()

    ch.paths.recent.unlink()  # written without fsync: a power loss can take it
    again = layer_of(ch)
    view = view_of(again)
    assert [t.text for t in view.window] == ["my cat is called Mochi"] and view.stored_total == 1
    assert ch.paths.recent.exists()  # rewritten durably, as the new window base
    again.close()


def test_a_process_write_waits_for_its_ack_and_a_repeated_key_is_answered_from_the_journal(world) -> None:
    ch = world
    layer = layer_of(ch)
    first = Reply()
    layer.on_AppendTurns(
        AppendTurns(turns=[turn("hello"), turn("hi Master", "ai")], mode="process", session_id="s1", idempotency_key="k1", reply=first)
    )
    assert not first.done  # answered only once its post-turn work is acknowledged
    ack = delivered(ch, "recent", OutboxAck)
    assert ack.row == 2
    layer.on_OutboxAck(ack)
    assert first.result(5) == WriteAnswer(status="processed")

    retry = Reply()
    layer.on_AppendTurns(
        AppendTurns(turns=[turn("hello"), turn("hi Master", "ai")], mode="process", session_id="s1", idempotency_key="k1", reply=retry)
    )
    assert retry.result(5) == WriteAnswer(status="processed")
    assert view_of(layer).stored_total == 2  # stored once
    layer.close()


def test_a_settle_read_waits_for_the_compression_and_gets_its_memo(tmp_path: Path, fake_llm) -> None:
    """The compression runs on the model pool and comes back as a CompressDone; the read
    that waits for the settle is answered with the spliced window."""
    with character(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake") as ch:
        layer = layer_of(ch)
        turns = [turn(f"turn number {i}", "human" if i % 2 == 0 else "ai") for i in range(25)]
        layer.on_AppendTurns(AppendTurns(turns=turns, mode="settle", session_id="s1", reply=Reply()))
        waiting = Reply()
        layer.on_GetRecent(GetRecent(wait_settle=True, reply=waiting))
        assert not waiting.done  # held until the settle's compression is spliced in
        # The model jobs (the compression, and the review the write also started) run here.
        [done] = [m for m in ch.ports[-1].run_jobs() if isinstance(m, CompressDone)]
        layer.on_CompressDone(done)
        view = waiting.result(5)
        assert isinstance(view, RecentView)
        assert view.window[0].role == "system" and view.window[0].text.startswith("Memo from prior conversations: ")
        assert [t.text for t in view.window[1:]] == [f"turn number {i}" for i in range(16, 25)]
        assert fake_llm.calls("summarize_recent")
        on_disk = json.loads(ch.paths.recent.read_text(encoding="utf-8"))
        assert on_disk[0]["data"]["content"] == view.window[0].text
        assert json.loads(ch.paths.recent_meta.read_text(encoding="utf-8"))["compressions"] == 1
        layer.close()
