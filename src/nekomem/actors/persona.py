"""PersonaActor: persona.json, persona_corrections.json and persona_archive/."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import Flush, Tick


class PersonaActor(ChildActor):
    child_name = "persona"

    def on_Tick(self, msg: Tick) -> None:
        pass

    def on_Flush(self, msg: Flush) -> None:
        if msg.reply is not None:
            msg.reply.ok(True)
