"""RecentActor: the mailbox of a character's recent window and raw journal.

The state and logic are the plain :class:`~nekomem.layers.recent.layer.RecentLayer` it
owns (recent.json, recent_meta.json, time_indexed.db, compression, review, theater
capsules, erasure); the actor only hands it its messages (see
:class:`~nekomem.actors.base.ChildActor`).
"""

from __future__ import annotations

from nekomem.actors.base import ChildActor
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import RECENT
from nekomem.layers.recent.layer import RecentLayer


class RecentActor(ChildActor):
    """Hosts one character's :class:`RecentLayer`."""

    child_name = RECENT

    def make_layer(self, ports: LayerPorts) -> RecentLayer:
        return RecentLayer(ports)
