"""ReflectionActor: reflections.json, surfaced.json and reflection_archive/."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import Flush, ResetConfirmedAt, Tick


class ReflectionActor(ChildActor):
    child_name = "reflections"

    def on_Tick(self, msg: Tick) -> None:
        pass

    def on_Flush(self, msg: Flush) -> None:
        if msg.reply is not None:
            msg.reply.ok(True)

    def on_ResetConfirmedAt(self, msg: ResetConfirmedAt) -> None:
        msg.reply.ok(0)
