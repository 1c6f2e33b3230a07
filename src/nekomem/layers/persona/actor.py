"""PersonaActor: the mailbox of a character's persona (see :class:`PersonaLayer`)."""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import PERSONA
from nekomem.layers.persona.layer import PersonaLayer


class PersonaActor(ChildActor):
    child_name = PERSONA

    def make_layer(self, ports: LayerPorts) -> PersonaLayer:
        return PersonaLayer(ports)


__all__ = ["PersonaActor"]
