"""Fault injection for actor tests: make one handler raise once, when armed."""

from __future__ import annotations

from typing import Any

import pytest


def crash_once(monkeypatch: pytest.MonkeyPatch, actor: type, handler: str) -> dict[str, bool]:
    """Patch ``actor.handler`` so that, after ``state["armed"] = True``, its next call
    raises RuntimeError (then it is the original again). Returns ``state``."""
    original = getattr(actor, handler)
    state = {"armed": False}

    def faulty(self: Any, msg: Any) -> Any:
        if state["armed"]:
            state["armed"] = False
            raise RuntimeError("injected fault")
        return original(self, msg)

    monkeypatch.setattr(actor, handler, faulty)
    return state
