"""OutboxActor: the mailbox of a character's outbox (see :class:`OutboxLayer`)."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import OUTBOX
from nekomem.layers.outbox.layer import OutboxLayer


class OutboxActor(ChildActor):
    child_name = OUTBOX

    def make_layer(self, ports: LayerPorts) -> OutboxLayer:
        return OutboxLayer(ports)


__all__ = ["OutboxActor"]
