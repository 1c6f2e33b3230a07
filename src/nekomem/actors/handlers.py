"""Dispatch of actor messages by type, through an explicit table of handlers.

A handler is a method marked ``@handles(SomeMessage)``. The mark registers the method's
name for that type on its class when the class is created (so patching the method later,
as fault-injection tests do, keeps the route). :func:`handler_for` finds an actor's method
for a message's exact type; a subclass's registration wins over its base's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

_OWN: dict[type, dict[type, str]] = {}  # class -> message type -> method name (its own marks)
_TABLES: dict[type, dict[type, str]] = {}


class _Mark(Generic[F]):
    """Stands in for the method during class creation, then puts the method back."""

    def __init__(self, func: F, message_types: tuple[type, ...]) -> None:
        self.func = func
        self.message_types = message_types

    def __set_name__(self, owner: type, name: str) -> None:
        own = _OWN.setdefault(owner, {})
        for message_type in self.message_types:
            if message_type in own:
                raise TypeError(f"{owner.__name__} handles {message_type.__name__} twice ({own[message_type]}, {name})")
            own[message_type] = name
        setattr(owner, name, self.func)


def handles(*message_types: type) -> Callable[[F], F]:
    """Mark a method as the handler of ``message_types``. Raises TypeError at class
    creation when a class marks two methods for one type."""

    def mark(func: F) -> F:
        # The class body briefly holds a _Mark where the method will be: __set_name__ puts
        # the function back as soon as the class exists, so F is what the class ends up with.
        if isinstance(func, _Mark):  # stacked marks: one method for several types
            return cast(F, _Mark(func.func, (*func.message_types, *message_types)))
        return cast(F, _Mark(func, message_types))

    return mark


def handler_table(cls: type) -> dict[type, str]:
    """Message type -> handler method name for ``cls`` (built once, then cached)."""
    table = _TABLES.get(cls)
    if table is None:
        table = {}
        for klass in reversed(cls.__mro__):
            table.update(_OWN.get(klass, {}))
        _TABLES[cls] = table
    return table


def handler_for(actor: object, message: object) -> Callable[[Any], object] | None:
    """The bound handler of ``actor`` for ``message``'s type, or None when it has none."""
    name = handler_table(type(actor)).get(type(message))
    if name is None:
        return None
    handler: Callable[[Any], object] = getattr(actor, name)
    return handler
