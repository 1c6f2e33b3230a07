"""ReflectionActor: the mailbox of the reflections layer (reflections.json, surfaced.json and
reflection_archive/). The layer's state, logic and message handlers are
:class:`~nekomem.layers.reflections.layer.ReflectionLayer`.
"""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import REFLECTIONS
from nekomem.layers.reflections.layer import ReflectionLayer


class ReflectionActor(ChildActor):
    """Hands each message to its :class:`ReflectionLayer` (see ChildActor)."""

    child_name = REFLECTIONS

    def make_layer(self, ports: LayerPorts) -> ReflectionLayer:
        return ReflectionLayer(ports)
