"""RecallActor: the read-optimised lexical and vector indexes over facts and reflections."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import Flush, Tick


class RecallActor(ChildActor):
    child_name = "recall"

    def on_Tick(self, msg: Tick) -> None:
        pass

    def on_Flush(self, msg: Flush) -> None:
        if msg.reply is not None:
            msg.reply.ok(True)
