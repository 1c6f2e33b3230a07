"""The supervision protocol: the messages the runtime exchanges with a character's actors.

Domain messages live beside their actors; these are the few the runtime itself sends or
receives (routing, crash hand-off, timers, the flush barrier, inspection).
"""

from __future__ import annotations

import msgspec

from nekomem.domain.layers import Address
from nekomem.runtime.reply import Reply


class Message(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every actor message. ``reply`` is set when the sender waits for an answer."""

    reply: Reply | None = None


class Deliver(Message, frozen=True):
    """To a supervisor: hand ``message`` to its child ``child``."""

    child: Address
    message: object


class ChildCrashed(Message, frozen=True):
    """From a crashed child to its supervisor, with the messages it had not handled."""

    child: Address
    error: str
    pending: list[object]


class Tick(Message, frozen=True):
    """A child's own timer came due (see ChildActor.due_at); ``monotonic`` is the clock's
    monotonic time when it fired."""

    monotonic: float


class Flush(Message, frozen=True):
    """Write views that lag their journal now. To a supervisor it is a barrier: the reply
    comes after every child has handled everything queued before it and flushed."""


class Describe(Message, frozen=True):
    """Ask the supervisor for its children's state (for /health and tests)."""


def fail_message(message: object, error: BaseException) -> None:
    """Answer ``message``'s reply, if it has one, with ``error``."""
    reply = getattr(message, "reply", None)
    if isinstance(reply, Reply):
        reply.fail(error)
