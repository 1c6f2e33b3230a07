"""FactActor: facts.json and facts_archive.json (extraction, dedup, archive)."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import Flush, OpFinished, RunOp, Tick
from nekomem.stores.atomic import read_json


class FactActor(ChildActor):
    child_name = "facts"

    def load(self) -> None:
        self.facts, _ = read_json(self.ctx.paths.facts, default=[])

    def on_RunOp(self, msg: RunOp) -> None:
        # Post-turn work: fact extraction needs the summary tier. Without it the step is
        # skipped (reported by /health), and the record is finished.
        self.ctx.send("outbox", OpFinished(op_id=msg.op_id, ok=True))

    def on_Tick(self, msg: Tick) -> None:
        pass

    def on_Flush(self, msg: Flush) -> None:
        if msg.reply is not None:
            msg.reply.ok(True)
