"""The contract between a child actor and the layer object it owns.

An actor is a mailbox; its layer is a plain object that holds one layer's state and logic
(RecallIndex behind RecallActor is the model). The actor calls the lifecycle methods
below and hands each message to the layer's method marked ``@handles(ThatMessage)``; the
layer reaches the world only through its :class:`~nekomem.actors.ports.LayerPorts`.
"""

from __future__ import annotations

from typing import Protocol


class Layer(Protocol):
    """What a :class:`~nekomem.actors.base.ChildActor` drives."""

    def load(self) -> None:
        """Read the layer's state from disk (at start, after a restart and after a storage
        fault). Raises OSError (or the store's decode errors) when it cannot."""

    def flush(self) -> None:
        """Write whatever view is behind its journal (on stop and on Flush). Raises OSError."""

    def close(self) -> None:
        """Release files and connections (idempotent; also called on a layer that never loaded)."""

    def due_at(self) -> float | None:
        """When the layer next has periodic or delayed work, on the injectable clock's
        monotonic scale; None when nothing is due. Read after every message."""

    def real_due_at(self) -> float | None:
        """Like :meth:`due_at` on ``time.monotonic()`` (work paced in real time, such as I/O batching)."""
