"""The recent window layer on its own: a RecentLayer over a real character folder, driven
by calling its handlers (no RecentActor, no server). No sibling is routable, so what the
layer sends reaches the character's supervisor, here a recorder of what it is told."""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from nekomem.actors.messages import AppendTurns, CompressDone, Deliver, GetRecent, OutboxAck, PostTurn, RecentView
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import event_owners
from nekomem.domain.turns import Role, Turn
from nekomem.layers.recent.layer import RecentLayer
from nekomem.models.llm import LLMClient
from nekomem.runtime.clock import ManualClock
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.reply import Reply
from nekomem.runtime.services import CharacterContext, Services
from nekomem.runtime.timers import Timers
from nekomem.stores.applied import SharedJournal
from nekomem.stores.layout import CharacterPaths
from nekomem.wire.answers import WriteAnswer
from tests.support.live import make_settings

NAME = "Lan"
T = TypeVar("T")


class Recorder:
    """Stands in for the supervisor: every message it is told goes to ``got``."""

    def __init__(self, got: queue.Queue[object]) -> None:
        self.got = got

    def tell(self, message: object) -> None:
        self.got.put(message)


@contextlib.contextmanager
def character(root: Path, **overrides: object) -> Iterator[tuple[CharacterContext, queue.Queue[object]]]:
    """A character context over ``root``; with ``llm_base_url`` among ``overrides`` its
    model jobs run on a real pool against that endpoint, else it has no model (post-turn
    work is then announced, not enqueued)."""
    settings = make_settings(root, **overrides)
    clock = ManualClock()
    dispatcher = Dispatcher(1, 1)
    pool = ModelPool(1, 8, 1)
    llm = LLMClient(settings.llm) if "llm_base_url" in overrides else None
    services = Services(settings=settings, clock=clock, pool=pool, memory_root=root, dispatcher=dispatcher, timers=Timers(clock), llm=llm)
    paths = CharacterPaths(root, NAME)
    paths.ensure()
    got: queue.Queue[object] = queue.Queue()
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    try:
        yield CharacterContext(name=NAME, paths=paths, services=services, journal=journal, supervisor=Recorder(got)), got
    finally:
        pool.shutdown()
        dispatcher.shutdown()
        if llm is not None:
            llm.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[CharacterContext, queue.Queue[object]]]:
    with character(tmp_path) as made:
        yield made


def layer_of(ctx: CharacterContext) -> RecentLayer:
    layer = RecentLayer(LayerPorts(ctx, "recent", lambda message: None))
    layer.load()
    return layer


def delivered(got: queue.Queue[object], child: str, kind: type[T], timeout: float = 0) -> T:
    """The next message of type ``kind`` the layer (or a model job of it) sent to sibling
    ``child``, through the supervisor; fails when none came within ``timeout`` seconds."""
    while True:
        message = got.get(timeout=timeout) if timeout else got.get_nowait()
        if isinstance(message, Deliver) and message.child == child and isinstance(message.message, kind):
            return message.message


def view_of(layer: RecentLayer) -> RecentView:
    reply = Reply()
    layer.on_GetRecent(GetRecent(reply=reply))
    view = reply.result(5)
    assert isinstance(view, RecentView)
    return view


def turn(text: str, role: Role = "human") -> Turn:
    return Turn(role=role, text=text, ts="2026-06-01T10:00:00+00:00")


def test_a_cached_turn_is_rebuilt_from_the_journal_when_recent_json_is_lost(world) -> None:
    ctx, got = world
    layer = layer_of(ctx)
    reply = Reply()
    layer.on_AppendTurns(AppendTurns(turns=[turn("my cat is called Mochi")], mode="cache", session_id="s1", reply=reply))
    assert reply.result(5) == WriteAnswer(status="cached", count=1)
    # No model can extract facts: the stored turn is announced to the reflections at once.
    announced = delivered(got, "reflections", PostTurn)
    assert [t.text for t in announced.turns] == ["my cat is called Mochi"]
    layer.close()

    ctx.paths.recent.unlink()  # written without fsync: a power loss can take it
    again = layer_of(ctx)
    view = view_of(again)
    assert [t.text for t in view.window] == ["my cat is called Mochi"] and view.stored_total == 1
    assert ctx.paths.recent.exists()  # rewritten durably, as the new window base
    again.close()


def test_a_process_write_waits_for_its_ack_and_a_repeated_key_is_answered_from_the_journal(world) -> None:
    ctx, got = world
    layer = layer_of(ctx)
    first = Reply()
    layer.on_AppendTurns(
        AppendTurns(turns=[turn("hello"), turn("hi Master", "ai")], mode="process", session_id="s1", idempotency_key="k1", reply=first)
    )
    assert not first.done  # answered only once its post-turn work is acknowledged
    ack = delivered(got, "recent", OutboxAck)
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
    with character(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake") as (ctx, got):
        layer = layer_of(ctx)
        turns = [turn(f"turn number {i}", "human" if i % 2 == 0 else "ai") for i in range(25)]
        layer.on_AppendTurns(AppendTurns(turns=turns, mode="settle", session_id="s1", reply=Reply()))
        waiting = Reply()
        layer.on_GetRecent(GetRecent(wait_settle=True, reply=waiting))
        assert not waiting.done  # held until the settle's compression is spliced in
        done = delivered(got, "recent", CompressDone, timeout=30)
        layer.on_CompressDone(done)
        view = waiting.result(5)
        assert isinstance(view, RecentView)
        assert view.window[0].role == "system" and view.window[0].text.startswith("Memo from prior conversations: ")
        assert [t.text for t in view.window[1:]] == [f"turn number {i}" for i in range(16, 25)]
        assert fake_llm.calls("summarize_recent")
        on_disk = json.loads(ctx.paths.recent.read_text(encoding="utf-8"))
        assert on_disk[0]["data"]["content"] == view.window[0].text
        assert json.loads(ctx.paths.recent_meta.read_text(encoding="utf-8"))["compressions"] == 1
        layer.close()
