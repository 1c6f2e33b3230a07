"""FactActor: the mailbox of a character's fact layer (facts.json and facts_archive.json).

The state and the logic live in :class:`~nekomem.layers.facts.layer.FactsLayer`, which
this actor owns and hands every message to: post-turn fact extraction in batches or one
record at a time (path A), the AI self-disclosure pass (path B), subject-scoped facts,
duplicate judgments, the pick of each reflection synthesis and the memory API.
"""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import FACTS
from nekomem.layers.facts.layer import FactsLayer


class FactActor(ChildActor):
    child_name = FACTS

    def make_layer(self, ports: LayerPorts) -> FactsLayer:
        return FactsLayer(ports)


__all__ = ["FactActor"]
