"""How many stored entries still wait for a vector, per character, from the moment their
write is acknowledged.

RecallActor knows exactly which of the entries it indexes lack a vector of the configured
model. But an owner (FactActor, ReflectionActor) acknowledges a write as soon as it has
journaled it and *sent* the entries to RecallActor; until RecallActor has read that message,
its own count does not include them. So the owner counts them as *in flight* when it sends
them (:func:`lacking_vectors`), and RecallActor moves them from in flight to its own count
in one step when it indexes them (:meth:`PendingCounter.indexed`). The sum never drops to 0
while an acknowledged entry has no vector.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import vector_tiers
from nekomem.recall.entry import indexable


class PendingCounter:
    """Entries waiting for a vector, per character; calling it gives the process total
    (``Services.pending``, read by /health and /metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # RecallActor's own count
        self._inflight: dict[str, int] = {}  # sent by an owner, not yet indexed

    def set(self, key: str, count: int) -> None:
        """RecallActor's count of ``key``'s indexed entries without a vector."""
        with self._lock:
            self._put(self._counts, key, count)

    def sent(self, key: str, count: int) -> None:
        """An owner sent ``count`` entries without a vector to ``key``'s RecallActor."""
        if count > 0:
            with self._lock:
                self._put(self._inflight, key, self._inflight.get(key, 0) + count)

    def indexed(self, key: str, count: int, received: int) -> None:
        """RecallActor indexed a message of ``received`` in-flight entries; ``count`` is
        its own count now (one step, so no reader sees the entries twice or not at all)."""
        with self._lock:
            self._put(self._counts, key, count)
            self._put(self._inflight, key, self._inflight.get(key, 0) - received)

    def forget(self, key: str) -> None:
        """``key``'s RecallActor stopped or restarted: nothing of it is counted."""
        with self._lock:
            self._counts.pop(key, None)
            self._inflight.pop(key, None)

    def of(self, key: str) -> int:
        """The entries of ``key`` waiting for a vector."""
        with self._lock:
            return self._counts.get(key, 0) + self._inflight.get(key, 0)

    def __call__(self) -> int:
        with self._lock:
            return sum(self._counts.values()) + sum(self._inflight.values())

    @staticmethod
    def _put(target: dict[str, int], key: str, count: int) -> None:
        if count > 0:
            target[key] = count
        else:
            target.pop(key, None)


def lacking_vectors(entries: Iterable[IndexEntry], model: str | None) -> int:
    """How many of ``entries`` RecallActor will have to embed: searchable entries of a
    vector tier without a stored vector of ``model`` (any stored vector counts while the
    model is still loading and ``model`` is None)."""
    count = 0
    for entry in entries:
        if entry.tier not in vector_tiers() or not indexable(entry):
            continue
        if entry.vector is None or (model is not None and entry.vector_model != model):
            count += 1
    return count
