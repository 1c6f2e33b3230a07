"""Per-item values of the recent window, kept across writes.

The window is a list that is only ever extended in place (any other change assigns a new
list). :class:`ItemCache` keeps ``fn(item)`` for each item: while it is handed the same
list object, only the items appended since the last call are computed; handed another
list, it reuses the values of the items it already knew (by identity: Turns are frozen,
so a changed item is a new object) and computes the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from nekomem.domain.turns import Turn

V = TypeVar("V")


class ItemCache(Generic[V]):
    """``fn(item)`` for every item of a window (see the module docstring). Not
    thread-safe: one owner."""

    __slots__ = ("_fn", "_source", "_count", "_values")

    def __init__(self, fn: Callable[[Turn], V]) -> None:
        self._fn = fn
        self._source: list[Turn] | None = None
        self._count = 0
        self._values: list[V] = []

    def update(self, window: list[Turn]) -> tuple[list[V], int]:
        """The values of ``window``'s items, in order, and the index from which they were
        computed by this call (``len(window)`` when none was). The list returned is the
        cache's own: read it, do not keep or change it."""
        fn = self._fn
        if self._source is window and len(window) >= self._count:
            start = self._count
            # A slice, not islice: islice walks the known prefix to reach ``start``.
            self._values.extend([fn(t) for t in window[start:]])
        else:
            known = {} if self._source is None else {id(t): v for t, v in zip(self._source[: self._count], self._values, strict=True)}
            start = 0
            self._values = [known[id(t)] if id(t) in known else fn(t) for t in window]
        self._source = window
        self._count = len(window)
        return self._values, start
