"""The dispatched actor type on its own: ordering, fairness, ask timeouts, stop, crash hand-off.

Real actors on a real Dispatcher; the only waits are on events the handlers set.
"""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest

from nekomem.runtime.dispatch import ActorRef, Completion, DispatchedActor, Dispatcher
from tests.support.waiting import wait_for


@pytest.fixture
def dispatcher():
    d = Dispatcher(3, 8, name="test-actor")
    yield d
    d.stop_all()
    d.shutdown()


class Recorder(DispatchedActor):
    """Logs what it handles; ``gate`` (when set) blocks the handling of "wait" messages."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        name: str,
        log: list[tuple[str, Any]],
        gate: threading.Event | None = None,
        started: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self._dispatcher = dispatcher
        self.name = name
        self.log = log
        self.gate = gate
        self.inside = 0
        self.overlaps = 0
        self.started = started or threading.Event()

    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    def on_receive(self, message: Any) -> Any:
        if message == "overlaps?":
            return self.overlaps
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        try:
            if message == "wait":
                self.started.set()
                assert self.gate is not None
                self.gate.wait(10)
            if message == "boom":
                raise RuntimeError("injected")
            self.log.append((self.name, message))
            return ("echo", message)
        finally:
            self.inside -= 1


def test_each_actor_handles_its_messages_one_at_a_time_in_order(dispatcher):
    logs: dict[str, list[tuple[str, Any]]] = {n: [] for n in "abcd"}
    refs = {n: Recorder.start(dispatcher, n, logs[n]) for n in "abcd"}

    def sender(offset: int) -> None:
        for i in range(500):
            for ref in refs.values():
                ref.tell((offset, i))

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # ask is answered after everything told before it: a barrier per actor.
    for ref in refs.values():
        assert ref.ask("last", timeout=30) == ("echo", "last")
    for name, ref in refs.items():
        seen = [m for _n, m in logs[name] if m != "last"]
        assert len(seen) == 1500
        for k in range(3):
            assert [i for off, i in seen if off == k] == list(range(500)), "per-sender order kept"
        assert ref.ask("overlaps?", timeout=5) == 0


def test_a_flooded_actor_cannot_starve_a_quiet_one():
    one = Dispatcher(1, 8, name="test-fair")
    try:
        order: list[tuple[str, Any]] = []
        gate, started = threading.Event(), threading.Event()
        flooded = Recorder.start(one, "flooded", order, gate, started)
        quiet = Recorder.start(one, "quiet", order)
        assert quiet.ask("warm", timeout=10) == ("echo", "warm")
        order.clear()
        flooded.tell("wait")
        assert started.wait(10)  # the only worker is now inside the flooded actor
        for i in range(2000):
            flooded.tell(i)
        quiet.tell("hello")
        gate.set()
        assert quiet.ask("done", timeout=30) == ("echo", "done")
        position = order.index(("quiet", "hello"))
        # One worker, batches of 8: the quiet actor waits for at most the flooded actor's
        # current batch ("wait" and 7 more), not for its 2000 queued messages.
        assert position == 8, order[:12]
        assert flooded.ask("end", timeout=30) == ("echo", "end")
        assert [m for n, m in order if n == "flooded" and m not in ("end", "wait")] == list(range(2000))
    finally:
        one.stop_all()
        one.shutdown()


def test_ask_times_out_and_the_actor_keeps_working(dispatcher):
    gate = threading.Event()
    ref = Recorder.start(dispatcher, "slow", [], gate)
    future = ref.ask_later("wait")
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.05)
    gate.set()
    assert future.get(timeout=10) == ("echo", "wait")
    assert ref.ask("next", timeout=10) == ("echo", "next")


def test_stop_fails_queued_asks_with_actor_dead_error(dispatcher):
    gate, started = threading.Event(), threading.Event()
    log: list[tuple[str, Any]] = []
    ref = Recorder.start(dispatcher, "stopping", log, gate, started)
    blocked = ref.ask_later("wait")
    assert started.wait(10)
    stop = ref.stop_later()
    queued = [ref.ask_later(i) for i in range(3)]  # behind the stop
    gate.set()
    assert blocked.get(timeout=10) == ("echo", "wait")
    assert stop.get(timeout=10) is True
    for fut in queued:
        with pytest.raises(pykka.ActorDeadError):
            fut.get(timeout=10)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")
    assert [m for _n, m in log] == ["wait"]
    assert ref.actor_inbox.terminated


def test_a_stopped_actor_is_not_kept_alive_by_its_ref(dispatcher):
    import gc
    import weakref

    ref = Recorder.start(dispatcher, "gone", [])
    assert ref.ask("hello", timeout=10) == ("echo", "hello")
    actor = weakref.ref(next(o for o in gc.get_objects() if isinstance(o, Recorder) and o.name == "gone"))
    assert ref.stop(timeout=10) is True
    wait_for(lambda: ref.actor_inbox.terminated, what="the mailbox torn down")
    gc.collect()
    assert actor() is None  # the ref (and its mailbox) are still held here


class Deferred(DispatchedActor):
    """on_stop returns a Completion: the stop is answered only once it is done."""

    def __init__(self, dispatcher: Dispatcher, done: Completion) -> None:
        super().__init__()
        self._dispatcher = dispatcher
        self.done = done

    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    def on_release(self) -> Completion:
        return self.done

    def on_receive(self, message: Any) -> Any:
        return message


def test_a_stop_waits_for_the_completion_on_stop_returns(dispatcher):
    done = Completion()
    ref = Deferred.start(dispatcher, done)
    stop = ref.stop_later()
    with pytest.raises(pykka.Timeout):
        stop.get(timeout=0.05)
    assert not ref.actor_inbox.terminated
    done.done()
    assert stop.get(timeout=10) is True
    wait_for(lambda: ref.actor_inbox.terminated, what="termination callbacks")


class Parent(DispatchedActor):
    """A minimal supervisor: restarts a crashed child and redelivers what it had queued."""

    def __init__(self, dispatcher: Dispatcher, log: list[tuple[str, Any]]) -> None:
        super().__init__()
        self._dispatcher = dispatcher
        self.log = log
        self.children: dict[str, ActorRef[Any]] = {}
        self.restarts: list[str] = []

    def dispatcher(self) -> Dispatcher:
        return self._dispatcher

    def on_start(self) -> None:
        for name in ("x", "y"):
            self.children[name] = Child.start(self._dispatcher, name, self.log, self.actor_ref)

    def on_receive(self, message: Any) -> Any:
        kind, name, payload = message
        if kind == "crashed":
            self.restarts.append(name)
            self.children[name] = Child.start(self._dispatcher, name, self.log, self.actor_ref)
            for pending in payload:
                self.children[name].tell(pending)
        elif kind == "to":
            self.children[name].tell(payload)
        elif kind == "ref":
            return self.children[name]
        elif kind == "restarts":
            return list(self.restarts)
        return None


class Child(Recorder):
    def __init__(self, dispatcher: Dispatcher, name: str, log: list[tuple[str, Any]], parent: ActorRef[Any]) -> None:
        super().__init__(dispatcher, name, log)
        self.parent = parent

    def on_failure(self, *exc: Any) -> None:
        pending = [e.message for e in self.actor_inbox.drain()]
        self.parent.tell(("crashed", self.name, pending))


def test_a_crash_restarts_only_that_child_and_redelivers_its_queue(dispatcher):
    log: list[tuple[str, Any]] = []
    parent = Parent.start(dispatcher, log)
    x_before = parent.ask(("ref", "x", None), timeout=10)
    y_before = parent.ask(("ref", "y", None), timeout=10)
    for message in (1, "boom", 2, 3):
        parent.tell(("to", "x", message))
    parent.tell(("to", "y", "fine"))
    wait_for(lambda: ("x", 3) in log and ("y", "fine") in log, what="redelivery")
    assert parent.ask(("restarts", None, None), timeout=5) == ["x"]
    assert not x_before.is_alive()
    assert y_before.is_alive() and parent.ask(("ref", "y", None), timeout=10) is y_before
    assert [m for n, m in log if n == "x"] == [1, 2, 3]


def test_threads_do_not_grow_with_actors(dispatcher):
    before = threading.active_count()
    refs = [Recorder.start(dispatcher, f"n{i}", []) for i in range(300)]
    for ref in refs:
        assert ref.ask("ping", timeout=10) == ("echo", "ping")
    assert threading.active_count() == before


def test_the_actor_runtime_stands_on_no_framework_internals():
    """Of pykka, only its public exceptions are used: no actor class, inbox, future,
    envelope or registry of it (their private methods were overridden before)."""
    import re
    from pathlib import Path

    import nekomem

    src = Path(nekomem.__file__).parent
    used = re.compile(r"\bpykka\.(?!ActorDeadError\b|Timeout\b)\w+|\bfrom pykka\b")
    hits = [
        f"{p.relative_to(src)}:{n}" for p in src.rglob("*.py") for n, line in enumerate(p.read_text().splitlines(), 1) if used.search(line)
    ]
    assert hits == []
