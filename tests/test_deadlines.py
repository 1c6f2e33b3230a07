"""runtime.deadlines: a callback that raises is logged (its type, nothing else) and the
shared thread goes on with the next deadline."""

from __future__ import annotations

import logging
import threading

import pykka
import pytest

from nekomem.runtime.deadlines import Deadlines


def test_a_raising_callback_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    deadlines = Deadlines("test-deadlines")
    done = threading.Event()

    def broken() -> None:
        raise ValueError("memory text that must not be logged")

    def stopped_actor() -> None:
        raise pykka.ActorDeadError("gone")

    with caplog.at_level(logging.DEBUG, logger="nekomem.runtime.deadlines"):
        deadlines.schedule(0.0, broken)
        deadlines.schedule(0.0, stopped_actor)
        deadlines.schedule(0.01, done.set)
        assert done.wait(10), "the thread stopped after a raising callback"
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "nekomem.runtime.deadlines"]
    assert (logging.WARNING, "a deadline callback raised ValueError") in records
    assert (logging.DEBUG, "a deadline came after its actor stopped") in records
    assert not any("memory text" in message for _level, message in records)
