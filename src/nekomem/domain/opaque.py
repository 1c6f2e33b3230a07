"""Bounds for opaque JSON values (a fact's ``source``, free-form metadata).

An opaque value is stored as given and handed back as given, so its shape is the caller's
business, but its size is ours: nesting depth costs stack in every encoder and decoder
(Python's ``json`` fails near 1000 levels), and bytes cost disk in every copy (journal,
view, archive). :func:`check_opaque` refuses an oversized value at the door;
:func:`clip_opaque` drops one found on disk, so an old poisoned record cannot make a read
fail.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()


class OpaqueTooLarge(ValueError):
    """An opaque value is nested deeper or encodes larger than allowed."""


def json_depth(value: Any, stop_at: int) -> int:
    """Nesting depth of a JSON-like value (a scalar is 0, ``[]`` is 1), computed without
    recursion; counting stops once ``stop_at`` is exceeded (the result is then > stop_at)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, msgspec.Struct):
            item = {f: getattr(item, f) for f in item.__struct_fields__}
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > stop_at:
            return deepest
        stack.extend((child, level) for child in children)
    return deepest


def check_opaque(value: Any, *, what: str, max_depth: int, max_bytes: int) -> None:
    """Raise :class:`OpaqueTooLarge` naming ``what`` when ``value`` nests deeper than
    ``max_depth`` or encodes to more than ``max_bytes`` bytes of JSON."""
    if json_depth(value, max_depth) > max_depth:
        raise OpaqueTooLarge(f"{what} nests deeper than {max_depth} levels")
    size = len(_encoder.encode(value))
    if size > max_bytes:
        raise OpaqueTooLarge(f"{what} has {size} bytes of JSON; the limit is {max_bytes}")


def clip_opaque(value: Any, *, max_depth: int, max_bytes: int) -> tuple[Any, bool]:
    """``(value, False)`` when it is within the bounds, else ``(None, True)``."""
    try:
        check_opaque(value, what="value", max_depth=max_depth, max_bytes=max_bytes)
    except (OpaqueTooLarge, RecursionError, TypeError):
        return None, True
    return value, False
