"""The contract between a child actor and the layer object it owns.

An actor is a mailbox; its layer is a plain object that holds one layer's state and logic
(RecallIndex behind RecallActor is the model). The actor calls the lifecycle methods
below and hands each message to the layer's method marked ``@handles(ThatMessage)``; the
layer reaches the world only through its :class:`~nekomem.actors.ports.LayerPorts`.

A layer may defer reading part of its state to the first message that needs it (the
fact layer's facts.json, see :mod:`nekomem.layers.facts.state`). When that deferred read
fails on files the layer cannot read (not a storage fault), it raises
:class:`DeferredLoadFailed`: the actor then fails as a load at start does (its supervisor
restarts it, whose start loads at once, and marks it failed once its budget is spent), and
the message is handed to the new instance rather than answered as a handler error.
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


class DeferredLoadFailed(Exception):
    """A layer's deferred load failed on files it cannot read (see the module). Its repr is
    the cause's, which is what the supervisor reports."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.cause = cause

    def __repr__(self) -> str:
        return repr(self.cause)
