"""Polling helper for tests that wait on background work (no timed assertions: the
timeout only bounds a hang)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Call ``predicate`` until it returns something truthy; return that value.
    Raises AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def quiesce(runtime: Any, name: str, timeout: float = 30.0) -> None:
    """Wait until character ``name`` is quiet: the runtime's flush barrier, repeated until
    no message moved, no model job runs and no child has work already due. Use it before
    asserting that something did NOT happen. A character that is not active (or was just
    passivated) is quiet once its actors have stopped."""
    runtime.registry.quiesce(name, timeout)
