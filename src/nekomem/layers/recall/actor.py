"""RecallActor: the mailbox of a character's recall index (see :class:`RecallLayer`)."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import RECALL
from nekomem.layers.recall.layer import RecallLayer


class RecallActor(ChildActor):
    child_name = RECALL

    def make_layer(self, ports: LayerPorts) -> RecallLayer:
        return RecallLayer(ports)


__all__ = ["RecallActor"]
